"""``SqliteRunRepository``: run state in the tables ``runs``, ``run_items``, ``run_results``
and ``run_submissions``.

The tables live in the same database file as a :class:`SqliteArtifactStore`
(the file keeps the artifact store's ``application_id`` and header, so either
can be opened first). Synchronous and blocking: the async side calls it from a
worker thread behind a ``CapacityLimiter(1)``. Each public method is one
``BEGIN IMMEDIATE … COMMIT`` (or one read), see :mod:`._schema`.

The right to drive a run is a :class:`FileClaims` lock in ``<database>.run-locks/``.

The file is opened through the artifact store's :class:`SqliteFile` (a file
that is not provably ours is refused untouched; WAL mode; the artifact header).
Several processes may open, create and write one database at once: each step
that needs another connection's lock waits for it, ``busy_timeout`` seconds at
most (SQLite's busy timeout, and a retry where SQLite would give up at once),
and only then fails with an error that names the database and the bound.

Schema version 2 added provider-batch submissions (``run_submissions``, and
``attempts``/``submission`` on ``run_items``). A version-1 file is migrated in
place when a writer opens it (``ALTER TABLE … ADD COLUMN``, ``CREATE … IF NOT
EXISTS``, then the stored ``runs_schema_version`` is bumped), in the opening
transaction; a read-only open of a version-1 file reads it as having no
submissions. A file written by a newer schema is refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final, Literal, final

from ..._artifacts._fingerprint import canonical_json, identity_fingerprint
from ..._artifacts._sqlite_file import SqliteFile, check_busy_timeout
from ..._values._config import ArtifactIdentity
from ..._values._errors import ArtifactMismatchError, ArtifactStoreError
from .._claims import FileClaims
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
from ._sqlite_tables import (
    ADDED_COLUMNS,
    ALL_SUBMISSION_STATES,
    INDEXES,
    LIVE,
    RUNS_SCHEMA_VERSION,
    SNAPSHOT,
    SNAPSHOT_V1,
    SUBMISSION_COLUMNS,
    TABLES,
    check_new_submission,
    check_states,
    decode_snapshot,
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
                        self._migrate(conn)
            except BaseException:
                conn.close()
                raise
            self._conn = conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """Inside the opening transaction: the run tables, created or brought to this schema version."""
        meta = self._stored_schema_version(conn)
        for statement in TABLES:
            conn.execute(statement)
        for table, column, declaration in ADDED_COLUMNS:
            if column not in self._columns(conn, table):
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
        for statement in INDEXES:
            conn.execute(statement)
        if meta.get("runs_schema_version") != RUNS_SCHEMA_VERSION:
            meta["runs_schema_version"] = RUNS_SCHEMA_VERSION
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('runs', ?)", (json.dumps(meta),))

    def _check_read_only(self, conn: sqlite3.Connection) -> None:
        self._file.check_ours(conn, "database")
        self._stored_schema_version(conn)
        self._has_submissions = "submission" in self._columns(conn, "run_items")

    def _stored_schema_version(self, conn: sqlite3.Connection) -> dict[str, Any]:
        """The 'runs' meta entry ({} if none yet); refuses a file written by a newer schema."""
        row = conn.execute("SELECT value FROM meta WHERE key = 'runs'").fetchone()
        meta = json.loads(row[0]) if row else {}
        version = meta.get("runs_schema_version") if isinstance(meta, dict) else None
        if row is not None and (not isinstance(version, int) or version > RUNS_SCHEMA_VERSION):
            raise ArtifactStoreError(
                f"{self._path}: runs schema version {version!r} is newer than this library reads "
                f"({RUNS_SCHEMA_VERSION}); upgrade trio-batch-llm"
            )
        return meta if isinstance(meta, dict) else {}

    @staticmethod
    def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
        return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}

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
            (count,) = conn.execute("SELECT items FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            rows = [
                (run_id, item.item_id, count + offset, item.fingerprint, item.prompt, item.context_json)
                for offset, item in enumerate(items, start=1)
            ]
            try:
                conn.executemany(
                    "INSERT INTO run_items (run_id, item_id, ingest_seq, fingerprint, prompt, context, state)"
                    " VALUES (?, ?, ?, ?, ?, ?, 'pending')",
                    rows,
                )
            except sqlite3.IntegrityError:
                raise ValueError(self._duplicate(conn, run_id, items)) from None
            conn.execute(
                "UPDATE runs SET items = items + ?, source_position = ?, source_cursor = ?,"
                " source_fingerprint = ?, source_last_item = ?, source_exhausted = ?, updated_at = ?"
                " WHERE run_id = ?",
                (len(items), checkpoint.position, checkpoint.cursor, checkpoint.fingerprint,
                 checkpoint.last_item_id, int(checkpoint.exhausted), utc_now(), run_id),
            )
            return self._row(conn, run_id)

    @staticmethod
    def _duplicate(conn: sqlite3.Connection, run_id: str, items: Sequence[NewItem]) -> str:
        seen: set[str] = set()
        for item in items:
            if item.item_id in seen:
                break
            seen.add(item.item_id)
        else:
            for item in items:
                found = conn.execute(
                    "SELECT 1 FROM run_items WHERE run_id = ? AND item_id = ?", (run_id, item.item_id)
                ).fetchone()
                if found:
                    break
            else:  # pragma: no cover - the IntegrityError had another cause
                return f"run {run_id!r}: could not store the slice (integrity error)"
        return f"duplicate item_id={item.item_id!r}: every item of a run needs a unique id"

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

    def record(self, run_id: str, results: Sequence[NewResult]) -> RunSnapshot:
        with self._write(f"recording {len(results)} result(s) of run {run_id!r}") as conn:
            self._mark_done(conn, run_id, results, submission=None)
            return self._row(conn, run_id)

    @staticmethod
    def _mark_done(
        conn: sqlite3.Connection, run_id: str, results: Sequence[NewResult], *, submission: str | None
    ) -> None:
        """Mark items done and append their results with the next sequences (inside a write).

        ``submission`` None: only pending items; else only items still batched in that submission."""
        where, extra = "state = 'pending'", list[str]()
        if submission is not None:
            where, extra = "state = 'batched' AND submission = ?", [submission]
        (sequence,) = conn.execute("SELECT last_sequence FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        done = succeeded = inp = out = total = 0
        for result in results:
            sequence_if_new = sequence + 1
            marked = conn.execute(
                "UPDATE run_items SET state = 'done', result_sequence = ?, prompt = NULL, context = NULL,"
                f" submission = NULL WHERE run_id = ? AND item_id = ? AND {where}",
                (sequence_if_new, run_id, result.item_id, *extra),
            ).rowcount
            if not marked:
                continue  # already done (or never ingested, or not ours): never a second result
            sequence = sequence_if_new
            conn.execute(
                "INSERT INTO run_results (run_id, sequence, item_id, success, error_category, result)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, sequence, result.item_id, int(result.success), result.error_category,
                 result.result_json),
            )
            done += 1
            succeeded += int(result.success)
            inp += result.input_tokens
            out += result.output_tokens
            total += result.total_tokens
        conn.execute(
            "UPDATE runs SET done = done + ?, succeeded = succeeded + ?, failed = failed + ?,"
            " input_tokens = input_tokens + ?, output_tokens = output_tokens + ?,"
            " total_tokens = total_tokens + ?, last_sequence = ?, updated_at = ? WHERE run_id = ?",
            (done, succeeded, done - succeeded, inp, out, total, sequence, utc_now(), run_id),
        )

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
        sid = submission.submission_id
        # BEGIN IMMEDIATE takes the write lock first: the capacity read below cannot go stale
        # before the insert, whichever connection or process reserves concurrently.
        with self._write(f"reserving submission {sid!r} of run {run_id!r}") as conn:
            if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None:
                raise RunStateError(f"{self._path}: no run named {run_id!r}")
            held = self._held(conn, submission.scope)
            if capacity_limit is not None and held + submission.tokens > capacity_limit:
                return False  # nothing written
            now = utc_now()
            try:
                conn.execute(
                    "INSERT INTO run_submissions (submission_id, seq, run_id, scope, state, items, tokens,"
                    " created_at, updated_at) VALUES (?,"
                    " (SELECT COALESCE(MAX(seq), 0) + 1 FROM run_submissions), ?, ?, 'reserved', ?, ?, ?, ?)",
                    (sid, run_id, submission.scope, len(submission.item_ids), submission.tokens, now, now),
                )
            except sqlite3.IntegrityError:
                raise ValueError(f"{self._path}: submission id {sid!r} is taken") from None
            taken = conn.executemany(
                "UPDATE run_items SET state = 'batched', submission = ?"
                " WHERE run_id = ? AND item_id = ? AND state = 'pending'",
                [(sid, run_id, item_id) for item_id in submission.item_ids],
            ).rowcount
            if taken != len(submission.item_ids):
                raise ValueError(self._not_pending(conn, run_id, submission))  # rolls everything back
            conn.execute("UPDATE runs SET updated_at = ? WHERE run_id = ?", (now, run_id))
            return True

    @staticmethod
    def _held(conn: sqlite3.Connection, scope: str) -> int:
        (held,) = conn.execute(
            f"SELECT COALESCE(SUM(tokens), 0) FROM run_submissions WHERE scope = ? AND state IN ({LIVE})",
            (scope,),
        ).fetchone()
        return int(held)

    def _not_pending(self, conn: sqlite3.Connection, run_id: str, submission: NewSubmission) -> str:
        for item_id in submission.item_ids:
            row = conn.execute(
                "SELECT state, submission FROM run_items WHERE run_id = ? AND item_id = ?", (run_id, item_id)
            ).fetchone()
            if row is None or row != ("batched", submission.submission_id):
                state = "not an item of this run" if row is None else f"{row[0]!r}"
                if row is not None and row[0] == "batched":
                    state += f" (in submission {row[1]!r})"
                return (
                    f"{self._path}: run {run_id!r}: item {item_id!r} is {state}, not 'pending';"
                    f" submission {submission.submission_id!r} was not reserved"
                )
        return f"{self._path}: run {run_id!r}: submission {submission.submission_id!r}: items not pending"

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
            if not self._end_submission(conn, run_id, submission_id, to, detail, LIVE):
                return 0
            returned = conn.execute(
                "UPDATE run_items SET state = 'pending', submission = NULL"
                " WHERE run_id = ? AND submission = ? AND state = 'batched'",
                (run_id, submission_id),
            ).rowcount
            conn.execute("UPDATE runs SET updated_at = ? WHERE run_id = ?", (utc_now(), run_id))
            return int(returned)

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
            if not self._end_submission(conn, run_id, submission_id, "finished", detail, "'submitted'"):
                return self._row(conn, run_id)  # not 'submitted': finished already (or never sent)
            self._mark_done(conn, run_id, results, submission=submission_id)
            conn.executemany(  # never ran at the provider: back to pending without using an attempt
                "UPDATE run_items SET state = 'pending', submission = NULL"
                " WHERE run_id = ? AND submission = ? AND state = 'batched' AND item_id = ?",
                [(run_id, submission_id, item_id) for item_id in unrun_item_ids],
            )
            # Whatever is still batched here has no result: the retry list and the rest alike
            # (an item of retry_item_ids that got a result above stays done; others are skipped).
            conn.execute(
                "UPDATE run_items SET state = 'pending', submission = NULL, attempts = attempts + 1"
                " WHERE run_id = ? AND submission = ? AND state = 'batched'",
                (run_id, submission_id),
            )
            return self._row(conn, run_id)

    @staticmethod
    def _end_submission(
        conn: sqlite3.Connection, run_id: str, submission_id: str, to: str, detail: str | None, from_sql: str
    ) -> bool:
        """Move the submission to ``to`` if its state is in ``from_sql`` (a literal SQL list)."""
        changed = conn.execute(
            "UPDATE run_submissions SET state = ?, detail = COALESCE(?, detail), updated_at = ?"
            f" WHERE run_id = ? AND submission_id = ? AND state IN ({from_sql})",
            (to, detail, utc_now(), run_id, submission_id),
        ).rowcount
        return changed == 1

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
            return self._held(conn, scope)

    # -- claims ------------------------------------------------------------------

    def try_claim(self, run_id: str) -> bool:
        return self._claims.try_claim(run_id)

    def release(self, run_id: str) -> None:
        self._claims.release(run_id)
