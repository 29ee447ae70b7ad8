"""``SqliteRunRepository``: run state in the tables ``runs``, ``run_items``, ``run_results``
and ``run_submissions`` (:mod:`._sqlite_tables`), one file per store.

Over 400 lines because it implements the whole RunRepository protocol, one short method per call.

The tables live in the same database file as a :class:`SqliteArtifactStore`
(the file keeps the artifact store's ``application_id`` and header, so either
can be opened first). Synchronous and blocking: the async side calls it from
its worker gate (:class:`RepositoryClient`). Each public method is one
``BEGIN IMMEDIATE … COMMIT`` (or one read), as :mod:`._protocol` asks; the
statements of the longer ones are :mod:`._sqlite_writes`.

The right to drive a run is a :class:`FileClaims` lock in ``<database>.run-locks/``.

The file is opened through the artifact store's :class:`SqliteFile` (a file
that is not provably ours is refused untouched; WAL mode; the artifact header).
Several processes may open, create and write one database at once: each step
that needs another connection's lock waits for it, ``busy_timeout`` seconds at
most (SQLite's busy timeout, and a retry where SQLite would give up at once),
and only then fails with an error that names the database and the bound.

A writer migrates an older file in place when it opens it (:func:`migrate`);
a read-only open of a version-1 file reads it as having no submissions.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Final, Literal, final

from ..._artifacts._fingerprint import canonical_json, identity_fingerprint
from ..._artifacts._sqlite_file import SqliteFile, check_busy_timeout
from ..._values._artifact_identity import ArtifactIdentity
from ..._values._errors import ArtifactMismatchError, ArtifactStoreError
from .._schema import (
    LIVE_SUBMISSION_STATES,
    NewItem,
    NewResult,
    NewSubmission,
    PendingItem,
    RunSnapshot,
    RunSpec,
    RunStateError,
    RunTermination,
    SourceCheckpoint,
    StoredResult,
    SubmissionRecord,
    SubmissionState,
)
from . import _leases as leases
from . import _sqlite_writes as writes
from ._file_claims import FileClaims
from ._leases import SQLITE, LeaseReport
from ._sqlite_tables import (
    ALL_SUBMISSION_STATES,
    SNAPSHOT,
    SNAPSHOT_V1,
    SUBMISSION_COLUMNS,
    check_new_submission,
    check_states,
    columns,
    decode_snapshot,
    migrate,
    stored_schema_version,
    utc_now,
)

__all__ = ["SqliteRunRepository"]

DEFAULT_BUSY_TIMEOUT: Final = 30.0


@final
class SqliteRunRepository:
    """Runs in a SQLite database (WAL); see the module docstring. Not thread-safe: one caller.

    ``busy_timeout`` (seconds, default 30) bounds each wait for a lock another
    connection holds (another process opening, creating or writing the same
    database); past it the call raises :class:`ArtifactStoreError` naming the
    database and the bound. ``fsync=True`` makes every commit durable against
    power loss (``synchronous=FULL``), not only against a process crash.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        identity: ArtifactIdentity | None = None,
        read_only: bool = False,
        fsync: bool = False,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._path = Path(path)
        self._file = SqliteFile(self._path, busy_timeout=check_busy_timeout(busy_timeout), fsync=fsync)
        # Written into the file's artifact header only when this creates the file.
        self._identity = identity if identity is not None else ArtifactIdentity("trio-batch-llm", "runs")
        self._read_only = read_only
        self._conn: sqlite3.Connection | None = None
        # False only for a read-only open of a version-1 file (it cannot be migrated from here).
        self._has_submissions = True
        self._claims = FileClaims(Path(f"{self._path}.run-locks"))
        self._clock = clock  # seconds; every lease expiry is decided by it (a test injects a fake)

    @property
    def path(self) -> Path:
        return self._path

    @property
    def busy_timeout(self) -> float:
        """Seconds each wait for another connection's lock may last."""
        return self._file.busy_timeout

    @property
    def location(self) -> str:
        return str(self._path)

    def __repr__(self) -> str:
        return f"SqliteRunRepository({str(self._path)!r})"

    # -- lifecycle ---------------------------------------------------------------

    def open(self) -> None:
        if self._conn is not None:
            return
        with self._errors("opening"):
            if self._read_only and not self._path.exists():
                raise ArtifactStoreError(f"{self._path}: no such run database")
            conn = self._file.connect(read_only=self._read_only)
            try:
                if self._read_only:
                    self._file.retry(conn, lambda: self._check_read_only(conn))
                else:
                    with self._file.transaction(conn):
                        self._file.initialise(conn, self._identity)  # an artifact database that holds runs
                        migrate(conn, self._path)
            except BaseException:
                conn.close()
                raise
            self._conn = conn

    def _check_read_only(self, conn: sqlite3.Connection) -> None:
        self._file.check_ours(conn, "database")
        stored_schema_version(conn, self._path)
        self._has_submissions = "submission" in columns(conn, "run_items")

    def close(self) -> None:
        self._claims.release_all()
        conn, self._conn = self._conn, None
        if conn is None:
            return
        self._file.close(conn, fold_wal=not self._read_only)

    # -- helpers -----------------------------------------------------------------

    def _errors(self, doing: str) -> contextlib.AbstractContextManager[None]:
        return self._file.errors(doing)

    @contextlib.contextmanager
    def _write(self, doing: str) -> Iterator[sqlite3.Connection]:
        conn = self._require()
        if self._read_only:
            raise RunStateError(f"{self._path}: opened read-only; cannot {doing}")
        with self._errors(doing), self._file.transaction(conn):
            yield conn

    def _require(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ArtifactStoreError(f"{self._path}: the run repository is not open")
        return self._conn

    def _row(self, conn: sqlite3.Connection, run_id: str) -> RunSnapshot:
        query = SNAPSHOT if self._has_submissions else SNAPSHOT_V1
        row = conn.execute(query, (run_id,)).fetchone()
        if row is None:
            raise RunStateError(f"{self._path}: no run named {run_id!r}")
        return decode_snapshot(row)

    # -- runs --------------------------------------------------------------------

    def attach(self, spec: RunSpec) -> RunSnapshot:
        identity_json = canonical_json(spec.identity.to_dict())
        with self._write(f"opening run {spec.run_id!r}") as conn:
            row = conn.execute(
                "SELECT mode, identity_fingerprint, identity FROM runs WHERE run_id = ?", (spec.run_id,)
            ).fetchone()
            if row is None:
                now = utc_now()
                conn.execute(
                    "INSERT INTO runs (run_id, mode, identity, identity_fingerprint, config, status,"
                    " created_at, updated_at) VALUES (?, ?, ?, ?, ?, 'running', ?, ?)",
                    (spec.run_id, spec.mode, identity_json, identity_fingerprint(spec.identity),
                     canonical_json(spec.config), now, now),
                )
            else:
                mode, fingerprint, stored_identity = row
                if fingerprint != identity_fingerprint(spec.identity):
                    raise ArtifactMismatchError(
                        f"{self._path}: run {spec.run_id!r} was created under identity {stored_identity}, "
                        f"not {identity_json}; use another run id"
                    )
                if mode != spec.mode:
                    raise RunStateError(
                        f"{self._path}: run {spec.run_id!r} runs in mode {mode!r}, not {spec.mode!r}"
                    )
            return self._row(conn, spec.run_id)

    def snapshot(self, run_id: str) -> RunSnapshot:
        conn = self._require()
        with self._errors(f"reading run {run_id!r}"):
            return self._row(conn, run_id)

    def run_ids(self) -> list[str]:
        conn = self._require()
        with self._errors("listing the runs"):
            rows = conn.execute("SELECT run_id FROM runs ORDER BY created_at, run_id")
            return [run_id for (run_id,) in rows]

    def transition(
        self,
        run_id: str,
        *,
        from_statuses: frozenset[str],
        to: str,
        termination: RunTermination | None,
    ) -> tuple[bool, RunSnapshot]:
        term = json.dumps(termination.to_dict()) if termination is not None else None
        marks = ", ".join("?" * len(from_statuses))
        with self._write(f"changing the status of run {run_id!r}") as conn:
            changed = conn.execute(
                f"UPDATE runs SET status = ?, termination = ?, updated_at = ?"
                f" WHERE run_id = ? AND status IN ({marks})",
                (to, term, utc_now(), run_id, *sorted(from_statuses)),
            ).rowcount
            return changed == 1, self._row(conn, run_id)

    def complete(self, run_id: str) -> tuple[bool, RunSnapshot]:
        term = json.dumps(RunTermination("completed").to_dict())
        with self._write(f"completing run {run_id!r}") as conn:
            # The guard is here, not in the caller: incomplete ingestion is never terminal.
            changed = conn.execute(
                "UPDATE runs SET status = 'completed', termination = ?, updated_at = ?"
                " WHERE run_id = ? AND status = 'running' AND source_exhausted = 1 AND done = items",
                (term, utc_now(), run_id),
            ).rowcount
            return changed == 1, self._row(conn, run_id)

    # -- items and results -------------------------------------------------------

    def ingest(self, run_id: str, items: Sequence[NewItem], checkpoint: SourceCheckpoint) -> RunSnapshot:
        with self._write(f"ingesting {len(items)} item(s) into run {run_id!r}") as conn:
            writes.insert_items(conn, run_id, items, checkpoint)
            return self._row(conn, run_id)

    def pending(self, run_id: str, *, after_ingest_seq: int, limit: int) -> list[PendingItem]:
        conn = self._require()
        with self._errors(f"reading the pending items of run {run_id!r}"):
            attempts = "attempts" if self._has_submissions else "0"
            rows = conn.execute(
                f"SELECT ingest_seq, item_id, prompt, context, {attempts} FROM run_items"
                " WHERE run_id = ? AND state = 'pending' AND ingest_seq > ? ORDER BY ingest_seq LIMIT ?",
                (run_id, after_ingest_seq, limit),
            ).fetchall()
        return [PendingItem(*row) for row in rows]

    def record(self, run_id: str, results: Sequence[NewResult], *, lease: int | None = None) -> RunSnapshot:
        with self._write(f"recording {len(results)} result(s) of run {run_id!r}") as conn:
            if lease is not None:
                leases.check_lease(conn, SQLITE, run_id, lease, now=self._clock())
            recorded = writes.mark_done(conn, run_id, results, submission=None, lease=lease)
            if lease is not None and recorded:
                leases.count_done(conn, SQLITE, run_id, lease, recorded)
            return self._row(conn, run_id)

    # -- leases (many drivers per run: :mod:`._leases`) ---------------------------

    def open_lease(self, run_id: str, driver_id: str, *, lease_seconds: float) -> int:
        with self._write(f"opening a lease on run {run_id!r}") as conn:
            return leases.open_lease(conn, SQLITE, str(self._path), run_id, driver_id,
                                     lease_seconds=lease_seconds, now=self._clock())

    def lease_items(self, run_id: str, lease: int, *, limit: int) -> list[PendingItem]:
        with self._write(f"leasing items of run {run_id!r}") as conn:
            return leases.lease_items(conn, SQLITE, str(self._path), run_id, lease, limit=limit,
                                      now=self._clock())

    def renew_lease(self, run_id: str, lease: int) -> bool:
        with self._write(f"renewing a lease on run {run_id!r}") as conn:
            return leases.renew_lease(conn, SQLITE, run_id, lease, now=self._clock())

    def close_lease(self, run_id: str, lease: int) -> int:
        with self._write(f"closing a lease on run {run_id!r}") as conn:
            return leases.close_lease(conn, SQLITE, str(self._path), run_id, lease)

    def start_calls(self, run_id: str, lease: int, item_ids: Sequence[str]) -> list[str]:
        with self._write(f"starting {len(item_ids)} call(s) of run {run_id!r}") as conn:
            return leases.start_calls(conn, SQLITE, str(self._path), run_id, lease, list(item_ids),
                                      now=self._clock())

    def unstart_calls(self, run_id: str, lease: int, item_ids: Sequence[str]) -> None:
        with self._write(f"forgetting {len(item_ids)} call start(s) of run {run_id!r}") as conn:
            leases.unstart_calls(conn, SQLITE, str(self._path), run_id, lease, list(item_ids))

    def lease_report(self, run_id: str) -> LeaseReport:
        conn = self._require()
        with self._errors(f"reading the drivers of run {run_id!r}"):
            if "lease_token" not in columns(conn, "run_items"):
                return LeaseReport((), 0, 0)  # a read-only open of a file from before leases
            return leases.report(conn, SQLITE, run_id, now=self._clock())

    def results(self, run_id: str, *, after_sequence: int, limit: int | None) -> list[StoredResult]:
        conn = self._require()
        with self._errors(f"reading the results of run {run_id!r}"):
            rows = conn.execute(
                "SELECT sequence, item_id, result FROM run_results"
                " WHERE run_id = ? AND sequence > ? ORDER BY sequence LIMIT ?",
                (run_id, after_sequence, -1 if limit is None else limit),
            ).fetchall()
        return [StoredResult(seq, item_id, text) for seq, item_id, text in rows]

    # -- provider-batch submissions ---------------------------------------------

    def reserve_submission(
        self, run_id: str, submission: NewSubmission, *, capacity_limit: int | None
    ) -> bool:
        check_new_submission(submission, capacity_limit)
        with self._write(f"reserving submission {submission.submission_id!r} of run {run_id!r}") as conn:
            return writes.reserve(conn, self._path, run_id, submission, capacity_limit)

    def update_submission(
        self,
        run_id: str,
        submission_id: str,
        *,
        from_states: frozenset[str],
        to: SubmissionState,
        input_file_id: str | None = None,
        batch_id: str | None = None,
        detail: str | None = None,
    ) -> bool:
        # Ending a submission must move its items too: only abandon/finish may leave a live state.
        check_states(frozenset({to}), LIVE_SUBMISSION_STATES, "update_submission's to")
        check_states(from_states, LIVE_SUBMISSION_STATES, "update_submission's from_states")
        if not from_states:
            return False
        marks = ", ".join("?" * len(from_states))
        with self._write(f"updating submission {submission_id!r} of run {run_id!r}") as conn:
            changed = conn.execute(
                "UPDATE run_submissions SET state = ?, input_file_id = COALESCE(?, input_file_id),"
                " batch_id = COALESCE(?, batch_id), detail = COALESCE(?, detail), updated_at = ?"
                f" WHERE run_id = ? AND submission_id = ? AND state IN ({marks})",
                (to, input_file_id, batch_id, detail, utc_now(), run_id, submission_id, *sorted(from_states)),
            ).rowcount
            return changed == 1

    def abandon_submission(
        self, run_id: str, submission_id: str, *, to: Literal["abandoned", "cancelled"], detail: str | None
    ) -> int:
        if to not in ("abandoned", "cancelled"):
            raise ValueError(f"abandon_submission's to must be 'abandoned' or 'cancelled', not {to!r}")
        with self._write(f"abandoning submission {submission_id!r} of run {run_id!r}") as conn:
            return writes.abandon(conn, run_id, submission_id, to, detail)

    def finish_submission(
        self,
        run_id: str,
        submission_id: str,
        results: Sequence[NewResult],
        retry_item_ids: Sequence[str],
        *,
        detail: str | None = None,
        unrun_item_ids: Sequence[str] = (),
    ) -> RunSnapshot:
        with self._write(f"finishing submission {submission_id!r} of run {run_id!r}") as conn:
            writes.finish(conn, run_id, submission_id, results, unrun_item_ids=unrun_item_ids, detail=detail)
            return self._row(conn, run_id)

    def submissions(self, run_id: str, *, states: frozenset[str] | None = None) -> list[SubmissionRecord]:
        conn = self._require()
        if not self._has_submissions or (states is not None and not states):
            return []
        where, params = "", list[str]()
        if states is not None:
            check_states(states, ALL_SUBMISSION_STATES, "submissions' states")
            where, params = f" AND state IN ({', '.join('?' * len(states))})", sorted(states)
        with self._errors(f"reading the submissions of run {run_id!r}"):
            rows = conn.execute(
                f"SELECT {SUBMISSION_COLUMNS} FROM run_submissions WHERE run_id = ?{where} ORDER BY seq",
                (run_id, *params),
            ).fetchall()
        return [SubmissionRecord(*row) for row in rows]

    def submission_items(self, run_id: str, submission_id: str) -> list[PendingItem]:
        conn = self._require()
        if not self._has_submissions:
            return []
        with self._errors(f"reading the items of submission {submission_id!r}"):
            rows = conn.execute(
                "SELECT ingest_seq, item_id, prompt, context, attempts FROM run_items"
                " WHERE run_id = ? AND submission = ? AND state = 'batched' ORDER BY ingest_seq",
                (run_id, submission_id),
            ).fetchall()
        return [PendingItem(*row) for row in rows]

    def held_tokens(self, scope: str) -> int:
        conn = self._require()
        if not self._has_submissions:
            return 0
        with self._errors(f"reading the tokens held by scope {scope!r}"):
            return writes.held_tokens(conn, scope)

    # -- claims ------------------------------------------------------------------

    def try_claim(self, run_id: str) -> bool:
        return self._claims.try_claim(run_id)

    def release(self, run_id: str) -> None:
        self._claims.release(run_id)
