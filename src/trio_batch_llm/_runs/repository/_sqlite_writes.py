"""The SQLite spelling of the writes that differ per dialect: new items, results, reservations.

Each function runs on a connection already inside ``BEGIN IMMEDIATE``: the
repository opens, commits and rolls back, nothing here does. Raising inside
one (a ``ValueError`` for a bad slice or submission) rolls the whole
transaction back, so each repository call writes all of its rows or none.
``BEGIN IMMEDIATE`` takes the database's one write lock before the first
read, so everything a function reads (the run's counters, a scope's held
capacity) stays true until its commit, whichever connection or process
writes next: the reason these need no row locks and no replay checks (a
SQLite call is never retried after an answer lost on the way back). What
both dialects write alike is :mod:`._writes`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from .._schema import NewItem, NewResult, NewSubmission, SourceCheckpoint
from . import _writes as shared
from ._dialect import SQLITE
from ._tables import utc_now
from ._writes import lock_run

__all__ = ["insert_items", "mark_done", "reserve"]


def insert_items(conn: sqlite3.Connection, run_id: str, items: Sequence[NewItem],
                 checkpoint: SourceCheckpoint) -> None:
    """Add ``items`` (pending, numbered on from the run's count) and move the source checkpoint."""
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
        # The primary key (run_id, item_id) refused a repeated id; the rollback drops the rows
        # inserted before it, so the message may name it without anything half-written.
        raise ValueError(_duplicate(conn, run_id, items)) from None
    shared.move_checkpoint(conn, SQLITE, run_id, len(items), checkpoint)


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


def mark_done(conn: sqlite3.Connection, run_id: str, results: Sequence[NewResult], *,
              submission: str | None, lease: int | None = None) -> int:
    """Mark items done and append their results with the next sequences; how many were recorded.

    ``submission`` None: only pending items (or, with ``lease``, only items leased under
    that token); else only items still batched in that submission."""
    where, extra = shared.open_items(submission, lease)
    (sequence,) = conn.execute("SELECT last_sequence FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    recorded: list[NewResult] = []
    for result in results:
        sequence_if_new = sequence + 1
        # The state condition makes the update its own check: the item is still open *now*,
        # inside the write lock, so a repeated or late result finds nothing to mark.
        marked = conn.execute(
            "UPDATE run_items SET state = 'done', result_sequence = ?, prompt = NULL, context = NULL,"
            f" submission = NULL, lease_token = NULL WHERE run_id = ? AND item_id = ? AND {where}",
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
        recorded.append(result)
    shared.add_done(conn, SQLITE, run_id, recorded, sequence)
    return len(recorded)


def reserve(conn: sqlite3.Connection, location: str, run_id: str, submission: NewSubmission,
            capacity_limit: int | None) -> bool:
    """Take the capacity and the items of a new ``reserved`` submission; False (nothing written)
    if the scope has no room. The caller's BEGIN IMMEDIATE took the write lock first, so the
    capacity read cannot go stale before the insert, whichever connection or process reserves."""
    sid = submission.submission_id
    lock_run(conn, SQLITE, location, run_id)  # here only: no such run raises RunStateError
    held = shared.held_tokens(conn, SQLITE, submission.scope)
    if capacity_limit is not None and held + submission.tokens > capacity_limit:
        return False
    now = utc_now()
    try:
        conn.execute(
            "INSERT INTO run_submissions (submission_id, seq, run_id, scope, state, items, tokens,"
            " created_at, updated_at) VALUES (?,"
            " (SELECT COALESCE(MAX(seq), 0) + 1 FROM run_submissions), ?, ?, 'reserved', ?, ?, ?, ?)",
            (sid, run_id, submission.scope, len(submission.item_ids), submission.tokens, now, now),
        )
    except sqlite3.IntegrityError:
        raise ValueError(f"{location}: submission id {sid!r} is taken") from None
    taken = conn.executemany(
        "UPDATE run_items SET state = 'batched', submission = ?"
        " WHERE run_id = ? AND item_id = ? AND state = 'pending'",
        [(sid, run_id, item_id) for item_id in submission.item_ids],
    ).rowcount
    if taken != len(submission.item_ids):
        # Rolls everything back, the submission's row included: no half-reserved batch.
        raise ValueError(shared.not_pending(conn, SQLITE, location, run_id, submission))
    conn.execute("UPDATE runs SET updated_at = ? WHERE run_id = ?", (now, run_id))
    return True
