"""``SqlRunRepository``: the run-state logic both SQL repositories share, whatever the database.

:class:`SqliteRunRepository` and :class:`PostgresRunRepository` are this base
plus a dialect (as httpx serves ``Client`` and ``AsyncClient`` from one
``BaseClient``): each subclass owns only its connection (opening, the
transaction, error mapping), its claims, and the three writes whose SQL
truly differs (:mod:`._sqlite_writes`, :mod:`._postgres_writes`). Runs,
status changes, results, leases and submissions are written once, here and
in :mod:`._writes` / :mod:`._leases`, with ``?`` placeholders that the
:class:`Dialect` spells for its engine.

Each public method is one transaction (``self._write``) or one read
(``self._read``), as :mod:`._protocol` asks: a crash at any point inside one
leaves the database as it was before the call or as it is after it, never
between, and the async side's retry of a call whose answer was lost finds
its write either absent (and makes it) or present (and is refused or does
nothing, see each write).
"""

from __future__ import annotations

import abc
import contextlib
import json
from collections.abc import Callable, Sequence
from typing import ClassVar, Generic, Literal, TypeVar

from ..._artifacts._fingerprint import canonical_json, identity_fingerprint
from ..._values._errors import ArtifactMismatchError
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
from . import _writes as writes
from ._dialect import Connection, Dialect
from ._leases import LeaseReport
from ._tables import (
    ALL_SUBMISSION_STATES,
    SNAPSHOT,
    SUBMISSION_COLUMNS,
    check_new_submission,
    check_states,
    decode_snapshot,
    utc_now,
)

__all__ = ["SqlRunRepository"]

C = TypeVar("C", bound=Connection)


class SqlRunRepository(abc.ABC, Generic[C]):
    """Every :class:`RunRepository` method but opening, closing and claiming; see the module docstring.

    A subclass sets ``_dialect`` and ``_clock`` and provides the abstract methods: ``_read`` and
    ``_write`` yield its connection (``_write`` inside a write transaction that commits on a clean
    exit and rolls back on any exception), with its errors mapped to the library's.
    """

    _dialect: ClassVar[Dialect]
    _clock: Callable[[], float]  # seconds; every lease expiry is decided by it (a test injects a fake)

    @property
    @abc.abstractmethod
    def location(self) -> str: ...

    @abc.abstractmethod
    def open(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def try_claim(self, run_id: str) -> bool: ...

    @abc.abstractmethod
    def release(self, run_id: str) -> None: ...

    @abc.abstractmethod
    def _read(self, doing: str) -> contextlib.AbstractContextManager[C]: ...

    @abc.abstractmethod
    def _write(self, doing: str) -> contextlib.AbstractContextManager[C]: ...

    @abc.abstractmethod
    def _insert_items(self, conn: C, run_id: str, items: Sequence[NewItem],
                      checkpoint: SourceCheckpoint) -> None:
        """Add the items (pending) and move the checkpoint: :func:`._writes.move_checkpoint`."""

    @abc.abstractmethod
    def _mark_done(self, conn: C, run_id: str, results: Sequence[NewResult], *,
                   submission: str | None, lease: int | None) -> int:
        """Record results for the items still open (:func:`._writes.open_items`); how many."""

    @abc.abstractmethod
    def _reserve(self, conn: C, run_id: str, submission: NewSubmission,
                 capacity_limit: int | None) -> bool:
        """Take capacity and items for a new submission, or False with nothing written."""

    # -- what an older SQLite file lacks (PostgreSQL has every column from its first version) --

    def _snapshot_sql(self) -> str:
        return SNAPSHOT

    def _attempts_column(self) -> str:
        return "attempts"

    def _reads_submissions(self) -> bool:
        """Whether the store holds submissions (raises if the repository is not open, where it checks)."""
        return True

    def _knows_leases(self, conn: C) -> bool:
        return True

    def _row(self, conn: C, run_id: str) -> RunSnapshot:
        row = conn.execute(self._dialect.sql(self._snapshot_sql()), (run_id,)).fetchone()
        if row is None:
            raise RunStateError(f"{self.location}: no run named {run_id!r}")
        return decode_snapshot(tuple(row))

    # -- runs --------------------------------------------------------------------

    def attach(self, spec: RunSpec) -> RunSnapshot:
        d = self._dialect
        identity_json = canonical_json(spec.identity.to_dict())
        with self._write(f"opening run {spec.run_id!r}") as conn:
            now = utc_now()
            # Insert if absent, then read back: of two processes attaching a new run at once one
            # inserts and the other inserts nothing, and both check the identity that is stored
            # (reading first would let both see no run and the second fail on the primary key).
            conn.execute(
                d.sql("INSERT INTO runs (run_id, mode, identity, identity_fingerprint, config, status,"
                      " created_at, updated_at) VALUES (?, ?, ?, ?, ?, 'running', ?, ?)"
                      " ON CONFLICT (run_id) DO NOTHING"),
                (spec.run_id, spec.mode, identity_json, identity_fingerprint(spec.identity),
                 canonical_json(spec.config), now, now),
            )
            mode, fingerprint, stored_identity = conn.execute(
                d.sql("SELECT mode, identity_fingerprint, identity FROM runs WHERE run_id = ?"),
                (spec.run_id,),
            ).fetchone()
            if fingerprint != identity_fingerprint(spec.identity):
                raise ArtifactMismatchError(
                    f"{self.location}: run {spec.run_id!r} was created under identity {stored_identity}, "
                    f"not {identity_json}; use another run id"
                )
            if mode != spec.mode:
                raise RunStateError(
                    f"{self.location}: run {spec.run_id!r} runs in mode {mode!r}, not {spec.mode!r}"
                )
            return self._row(conn, spec.run_id)

    def snapshot(self, run_id: str) -> RunSnapshot:
        with self._read(f"reading run {run_id!r}") as conn:
            return self._row(conn, run_id)

    def run_ids(self) -> list[str]:
        with self._read("listing the runs") as conn:
            rows = conn.execute(f"SELECT run_id FROM runs ORDER BY {self._dialect.run_order}").fetchall()
            return [run_id for (run_id,) in rows]

    def transition(self, run_id: str, *, from_statuses: frozenset[str], to: str,
                   termination: RunTermination | None) -> tuple[bool, RunSnapshot]:
        d = self._dialect
        term = json.dumps(termination.to_dict()) if termination is not None else None
        among, params = d.any_of("status", sorted(from_statuses))
        with self._write(f"changing the status of run {run_id!r}") as conn:
            # A compare-and-set in one statement: of two drivers changing the status at once, the
            # second sees the first's status and changes nothing (``changed`` False).
            changed = conn.execute(
                d.sql("UPDATE runs SET status = ?, termination = ?, updated_at = ?"
                      f" WHERE run_id = ? AND {among}"),
                (to, term, utc_now(), run_id, *params),
            ).rowcount
            return changed == 1, self._row(conn, run_id)

    def complete(self, run_id: str) -> tuple[bool, RunSnapshot]:
        term = json.dumps(RunTermination("completed").to_dict())
        with self._write(f"completing run {run_id!r}") as conn:
            # The guard is in the statement, not in the caller: incomplete ingestion is never
            # terminal, and an item recorded or ingested by another driver meanwhile is counted.
            changed = conn.execute(
                self._dialect.sql(
                    "UPDATE runs SET status = 'completed', termination = ?, updated_at = ?"
                    " WHERE run_id = ? AND status = 'running' AND source_exhausted = 1 AND done = items"
                ),
                (term, utc_now(), run_id),
            ).rowcount
            return changed == 1, self._row(conn, run_id)

    # -- items and results -------------------------------------------------------

    def ingest(self, run_id: str, items: Sequence[NewItem],
               checkpoint: SourceCheckpoint) -> RunSnapshot:
        with self._write(f"ingesting {len(items)} item(s) into run {run_id!r}") as conn:
            self._insert_items(conn, run_id, items, checkpoint)
            return self._row(conn, run_id)

    def pending(self, run_id: str, *, after_ingest_seq: int, limit: int) -> list[PendingItem]:
        with self._read(f"reading the pending items of run {run_id!r}") as conn:
            rows = conn.execute(
                self._dialect.sql(
                    f"SELECT ingest_seq, item_id, prompt, context, {self._attempts_column()} FROM run_items"
                    " WHERE run_id = ? AND state = 'pending' AND ingest_seq > ? ORDER BY ingest_seq LIMIT ?"
                ),
                (run_id, after_ingest_seq, limit),
            ).fetchall()
        return [PendingItem(*row) for row in rows]

    def record(self, run_id: str, results: Sequence[NewResult], *,
               lease: int | None = None) -> RunSnapshot:
        d = self._dialect
        with self._write(f"recording {len(results)} result(s) of run {run_id!r}") as conn:
            if lease is not None:
                if d.row_locks:
                    # Lock order: the run, then its lease. Whoever ends a lease takes the run's
                    # lock first, so the lease checked alive here stays alive to the commit.
                    writes.lock_run(conn, d, self.location, run_id)
                leases.check_lease(conn, d, run_id, lease, now=self._clock())
            recorded = self._mark_done(conn, run_id, results, submission=None, lease=lease)
            if lease is not None and recorded:
                leases.count_done(conn, d, run_id, lease, recorded)
            return self._row(conn, run_id)

    def results(self, run_id: str, *, after_sequence: int, limit: int | None) -> list[StoredResult]:
        d = self._dialect
        with self._read(f"reading the results of run {run_id!r}") as conn:
            rows = conn.execute(
                d.sql("SELECT sequence, item_id, result FROM run_results"
                      " WHERE run_id = ? AND sequence > ? ORDER BY sequence LIMIT ?"),
                (run_id, after_sequence, d.no_limit if limit is None else limit),
            ).fetchall()
        return [StoredResult(seq, item_id, text) for seq, item_id, text in rows]

    # -- leases (many drivers per run: :mod:`._leases`) ---------------------------

    def open_lease(self, run_id: str, driver_id: str, *, lease_seconds: float) -> int:
        with self._write(f"opening a lease on run {run_id!r}") as conn:
            return leases.open_lease(conn, self._dialect, self.location, run_id, driver_id,
                                     lease_seconds=lease_seconds, now=self._clock())

    def lease_items(self, run_id: str, lease: int, *, limit: int) -> list[PendingItem]:
        with self._write(f"leasing items of run {run_id!r}") as conn:
            return leases.lease_items(conn, self._dialect, self.location, run_id, lease, limit=limit,
                                      now=self._clock())

    def renew_lease(self, run_id: str, lease: int) -> bool:
        with self._write(f"renewing a lease on run {run_id!r}") as conn:
            return leases.renew_lease(conn, self._dialect, run_id, lease, now=self._clock())

    def close_lease(self, run_id: str, lease: int) -> int:
        with self._write(f"closing a lease on run {run_id!r}") as conn:
            return leases.close_lease(conn, self._dialect, self.location, run_id, lease)

    def start_calls(self, run_id: str, lease: int, item_ids: Sequence[str]) -> list[str]:
        with self._write(f"starting {len(item_ids)} call(s) of run {run_id!r}") as conn:
            return leases.start_calls(conn, self._dialect, self.location, run_id, lease, list(item_ids),
                                      now=self._clock())

    def unstart_calls(self, run_id: str, lease: int, item_ids: Sequence[str]) -> None:
        with self._write(f"forgetting {len(item_ids)} call start(s) of run {run_id!r}") as conn:
            leases.unstart_calls(conn, self._dialect, self.location, run_id, lease, list(item_ids))

    def lease_report(self, run_id: str) -> LeaseReport:
        with self._read(f"reading the drivers of run {run_id!r}") as conn:
            if not self._knows_leases(conn):
                return LeaseReport((), 0, 0)  # a read-only open of a file from before leases
            return leases.report(conn, self._dialect, run_id, now=self._clock())

    # -- provider-batch submissions ---------------------------------------------

    def reserve_submission(
        self, run_id: str, submission: NewSubmission, *, capacity_limit: int | None
    ) -> bool:
        check_new_submission(submission, capacity_limit)
        with self._write(f"reserving submission {submission.submission_id!r} of run {run_id!r}") as conn:
            return self._reserve(conn, run_id, submission, capacity_limit)

    def update_submission(self, run_id: str, submission_id: str, *, from_states: frozenset[str],
                          to: SubmissionState, input_file_id: str | None = None,
                          batch_id: str | None = None, detail: str | None = None) -> bool:
        d = self._dialect
        # Ending a submission must move its items too: only abandon/finish may leave a live state.
        check_states(frozenset({to}), LIVE_SUBMISSION_STATES, "update_submission's to")
        check_states(from_states, LIVE_SUBMISSION_STATES, "update_submission's from_states")
        if not from_states:
            return False
        among, params = d.any_of("state", sorted(from_states))
        with self._write(f"updating submission {submission_id!r} of run {run_id!r}") as conn:
            # A compare-and-set: ``creating`` is written before the provider's create call, so of
            # two reconcilers only one moves it on, and a crash between leaves the intent on record.
            changed = conn.execute(
                d.sql("UPDATE run_submissions SET state = ?, input_file_id = COALESCE(?, input_file_id),"
                      " batch_id = COALESCE(?, batch_id), detail = COALESCE(?, detail), updated_at = ?"
                      f" WHERE run_id = ? AND submission_id = ? AND {among}"),
                (to, input_file_id, batch_id, detail, utc_now(), run_id, submission_id, *params),
            ).rowcount
            return bool(changed == 1)

    def abandon_submission(
        self, run_id: str, submission_id: str, *, to: Literal["abandoned", "cancelled"], detail: str | None
    ) -> int:
        if to not in ("abandoned", "cancelled"):
            raise ValueError(f"abandon_submission's to must be 'abandoned' or 'cancelled', not {to!r}")
        with self._write(f"abandoning submission {submission_id!r} of run {run_id!r}") as conn:
            return writes.abandon(conn, self._dialect, run_id, submission_id, to, detail)

    def finish_submission(self, run_id: str, submission_id: str, results: Sequence[NewResult],
                          retry_item_ids: Sequence[str], *, detail: str | None = None,
                          unrun_item_ids: Sequence[str] = ()) -> RunSnapshot:
        with self._write(f"finishing submission {submission_id!r} of run {run_id!r}") as conn:
            writes.finish(conn, self._dialect, self.location, run_id, submission_id, results,
                          unrun_item_ids=unrun_item_ids, detail=detail, mark_done=self._mark_done)
            return self._row(conn, run_id)

    def submissions(self, run_id: str, *,
                    states: frozenset[str] | None = None) -> list[SubmissionRecord]:
        if not self._reads_submissions() or (states is not None and not states):
            return []
        where, params = "", tuple[object, ...]()
        if states is not None:
            check_states(states, ALL_SUBMISSION_STATES, "submissions' states")
            among, params = self._dialect.any_of("state", sorted(states))
            where = f" AND {among}"
        with self._read(f"reading the submissions of run {run_id!r}") as conn:
            rows = conn.execute(
                self._dialect.sql(
                    f"SELECT {SUBMISSION_COLUMNS} FROM run_submissions WHERE run_id = ?{where} ORDER BY seq"
                ),
                (run_id, *params),
            ).fetchall()
        return [SubmissionRecord(*row) for row in rows]

    def submission_items(self, run_id: str, submission_id: str) -> list[PendingItem]:
        if not self._reads_submissions():
            return []
        with self._read(f"reading the items of submission {submission_id!r}") as conn:
            rows = conn.execute(
                self._dialect.sql(
                    "SELECT ingest_seq, item_id, prompt, context, attempts FROM run_items"
                    " WHERE run_id = ? AND submission = ? AND state = 'batched' ORDER BY ingest_seq"
                ),
                (run_id, submission_id),
            ).fetchall()
        return [PendingItem(*row) for row in rows]

    def held_tokens(self, scope: str) -> int:
        if not self._reads_submissions():
            return 0
        with self._read(f"reading the tokens held by scope {scope!r}") as conn:
            return writes.held_tokens(conn, self._dialect, scope)
