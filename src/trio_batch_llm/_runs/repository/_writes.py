"""The run-state writes both dialects share: the run's lock, counters, checkpoints, submissions' ends.

Each function runs on a connection already inside its caller's write
transaction (``BEGIN IMMEDIATE`` on SQLite, a PostgreSQL transaction): the
repository opens, commits and rolls back, nothing here does. Raising inside
one (a ``ValueError``, a :class:`RunStateError`) rolls the whole transaction
back, so each repository call writes all of its rows or none -- a crash at
any point between two statements leaves the database as it was before the
call. What truly differs per dialect (inserting items, marking results
done, reserving capacity) is :mod:`._sqlite_writes` / :mod:`._postgres_writes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from .._schema import NewResult, NewSubmission, RunStateError, SourceCheckpoint
from ._dialect import Connection, Dialect
from ._tables import LIVE, utc_now

__all__ = [
    "MarkDone", "abandon", "add_done", "finish", "held_tokens", "lock_run", "move_checkpoint",
    "not_pending", "open_items",
]


C = TypeVar("C", bound=Connection)
C_contra = TypeVar("C_contra", bound=Connection, contravariant=True)


class MarkDone(Protocol[C_contra]):
    """A dialect's ``mark_done``: results recorded for open items; how many were recorded."""

    def __call__(self, conn: C_contra, run_id: str, results: Sequence[NewResult], *,
                 submission: str | None, lease: int | None) -> int: ...


def lock_run(conn: Connection, d: Dialect, location: str, run_id: str) -> tuple[int, int]:
    """Lock the run's row to the end of the transaction; its ``(items, last_sequence)``.

    Every write that reads a counter of the run and writes it back (the next item number, the
    next result sequence, the next lease token) takes this lock first, on PostgreSQL, so two
    drivers never read the same value; and it is always the *first* lock a transaction takes
    (then driver rows, then item rows), so writers of one run queue up here instead of
    deadlocking further on. On SQLite the statement only checks that the run exists: ``BEGIN
    IMMEDIATE`` took the database's one write lock already."""
    row = conn.execute(
        d.sql(f"SELECT items, last_sequence FROM runs WHERE run_id = ?{d.lock_run_suffix}"), (run_id,)
    ).fetchone()
    if row is None:
        raise RunStateError(f"{location}: no run named {run_id!r}")
    return int(row[0]), int(row[1])


def move_checkpoint(conn: Connection, d: Dialect, run_id: str, added: int,
                    checkpoint: SourceCheckpoint) -> None:
    """Count ``added`` new items and move the source checkpoint past them.

    In the same transaction as the items' insert: a crash leaves either both (a resume reads the
    source on after them) or neither (a resume reads the slice again); never items the checkpoint
    does not cover, which a resume would ingest twice."""
    conn.execute(
        d.sql("UPDATE runs SET items = items + ?, source_position = ?, source_cursor = ?,"
              " source_fingerprint = ?, source_last_item = ?, source_exhausted = ?, updated_at = ?"
              " WHERE run_id = ?"),
        (added, checkpoint.position, checkpoint.cursor, checkpoint.fingerprint,
         checkpoint.last_item_id, int(checkpoint.exhausted), utc_now(), run_id),
    )


def open_items(submission: str | None, lease: int | None) -> tuple[str, tuple[object, ...]]:
    """The items a result may still be recorded for (``?`` placeholders): pending ones; with
    ``lease``, only those leased under that token; with ``submission``, only those still batched
    in it. Every other item (done, or now another lease's or batch's) is skipped, so a result is
    recorded once and only by whoever holds the item."""
    if submission is not None:
        return "state = 'batched' AND submission = ?", (submission,)
    if lease is not None:
        return "state = 'leased' AND lease_token = ?", (lease,)
    return "state = 'pending'", ()


def add_done(conn: Connection, d: Dialect, run_id: str, recorded: Sequence[NewResult],
             last_sequence: int) -> None:
    """Add ``recorded`` to the run's counters and move ``last_sequence``, in the results' transaction
    (a reader never sees results the counters do not count, nor the other way round)."""
    succeeded = sum(1 for result in recorded if result.success)
    conn.execute(
        d.sql("UPDATE runs SET done = done + ?, succeeded = succeeded + ?, failed = failed + ?,"
              " input_tokens = input_tokens + ?, output_tokens = output_tokens + ?,"
              " total_tokens = total_tokens + ?, last_sequence = ?, updated_at = ? WHERE run_id = ?"),
        (len(recorded), succeeded, len(recorded) - succeeded, sum(r.input_tokens for r in recorded),
         sum(r.output_tokens for r in recorded), sum(r.total_tokens for r in recorded), last_sequence,
         utc_now(), run_id),
    )


def held_tokens(conn: Connection, d: Dialect, scope: str) -> int:
    (held,) = conn.execute(
        d.sql("SELECT CAST(COALESCE(SUM(tokens), 0) AS BIGINT) FROM run_submissions"
              f" WHERE scope = ? AND state IN ({LIVE})"),
        (scope,),
    ).fetchone()
    return int(held)


def not_pending(conn: Connection, d: Dialect, location: str, run_id: str, submission: NewSubmission) -> str:
    """Why a reservation could not take its items: the first that is not pending, and its state."""
    for item_id in submission.item_ids:
        row = conn.execute(
            d.sql("SELECT state, submission FROM run_items WHERE run_id = ? AND item_id = ?"),
            (run_id, item_id),
        ).fetchone()
        if row is None or tuple(row) != ("batched", submission.submission_id):
            state = "not an item of this run" if row is None else f"{row[0]!r}"
            if row is not None and row[0] == "batched":
                state += f" (in submission {row[1]!r})"
            return (
                f"{location}: run {run_id!r}: item {item_id!r} is {state}, not 'pending';"
                f" submission {submission.submission_id!r} was not reserved"
            )
    return f"{location}: run {run_id!r}: submission {submission.submission_id!r}: items not pending"


def abandon(conn: Connection, d: Dialect, run_id: str, submission_id: str, to: str,
            detail: str | None) -> int:
    """End a live submission without results; its batched items back to pending. How many went back."""
    # The compare-and-set on the submission's state comes first: a repeat (after a crash, or by a
    # second process reconciling the same batch) finds it ended and changes nothing.
    if not _end_submission(conn, d, run_id, submission_id, to, detail, LIVE):
        return 0
    returned = conn.execute(
        d.sql("UPDATE run_items SET state = 'pending', submission = NULL"
              " WHERE run_id = ? AND submission = ? AND state = 'batched'"),
        (run_id, submission_id),
    ).rowcount
    conn.execute(d.sql("UPDATE runs SET updated_at = ? WHERE run_id = ?"), (utc_now(), run_id))
    return int(returned)


def finish(conn: C, d: Dialect, location: str, run_id: str, submission_id: str,
           results: Sequence[NewResult], *, unrun_item_ids: Sequence[str], detail: str | None,
           mark_done: MarkDone[C]) -> None:
    """End a ``submitted`` submission with its results (nothing changes if it is not ``submitted``)."""
    if d.row_locks:
        lock_run(conn, d, location, run_id)  # lock order: the run first, as every writer of it
    # Exactly once: only the transaction that moves the submission out of 'submitted' goes on, so
    # a repeat after a crash (the results fetched again) records nothing twice.
    if not _end_submission(conn, d, run_id, submission_id, "finished", detail, "'submitted'"):
        return  # finished already (or never sent)
    mark_done(conn, run_id, results, submission=submission_id, lease=None)
    for chunk in d.chunks(list(unrun_item_ids)):  # never ran at the provider: no attempt used
        among, params = d.any_of("item_id", chunk)
        conn.execute(
            d.sql("UPDATE run_items SET state = 'pending', submission = NULL"
                  f" WHERE run_id = ? AND submission = ? AND state = 'batched' AND {among}"),
            (run_id, submission_id, *params),
        )
    # Whatever is still batched here has no result: the retry list and the rest alike
    # (an item of the retry list that got a result above stays done).
    conn.execute(
        d.sql("UPDATE run_items SET state = 'pending', submission = NULL, attempts = attempts + 1"
              " WHERE run_id = ? AND submission = ? AND state = 'batched'"),
        (run_id, submission_id),
    )


def _end_submission(conn: Connection, d: Dialect, run_id: str, submission_id: str, to: str,
                    detail: str | None, from_sql: str) -> bool:
    """Move the submission to ``to`` if its state is in ``from_sql`` (a literal SQL list)."""
    changed = conn.execute(
        d.sql("UPDATE run_submissions SET state = ?, detail = COALESCE(?, detail), updated_at = ?"
              f" WHERE run_id = ? AND submission_id = ? AND state IN ({from_sql})"),
        (to, detail, utc_now(), run_id, submission_id),
    ).rowcount
    return bool(changed == 1)
