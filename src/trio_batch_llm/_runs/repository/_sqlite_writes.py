"""The statements of :class:`SqliteRunRepository`'s multi-statement write transactions.

Each function runs on a connection already inside ``BEGIN IMMEDIATE``: the
repository opens, commits and rolls back, nothing here does. Raising inside
one (a ``ValueError`` for a bad slice or submission) rolls the whole
transaction back, so each repository call writes all of its rows or none.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

from .._schema import NewItem, NewResult, NewSubmission, RunStateError, SourceCheckpoint
from ._sqlite_tables import LIVE, utc_now

__all__ = ["abandon", "finish", "held_tokens", "insert_items", "mark_done", "reserve"]


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
        raise ValueError(_duplicate(conn, run_id, items)) from None
    conn.execute(
        "UPDATE runs SET items = items + ?, source_position = ?, source_cursor = ?,"
        " source_fingerprint = ?, source_last_item = ?, source_exhausted = ?, updated_at = ?"
        " WHERE run_id = ?",
        (len(items), checkpoint.position, checkpoint.cursor, checkpoint.fingerprint,
         checkpoint.last_item_id, int(checkpoint.exhausted), utc_now(), run_id),
    )


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
    where, extra = "state = 'pending'", list[str | int]()
    if submission is not None:
        where, extra = "state = 'batched' AND submission = ?", [submission]
    elif lease is not None:
        where, extra = "state = 'leased' AND lease_token = ?", [lease]
    (sequence,) = conn.execute("SELECT last_sequence FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    done = succeeded = inp = out = total = 0
    for result in results:
        sequence_if_new = sequence + 1
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
    return done


def held_tokens(conn: sqlite3.Connection, scope: str) -> int:
    (held,) = conn.execute(
        f"SELECT COALESCE(SUM(tokens), 0) FROM run_submissions WHERE scope = ? AND state IN ({LIVE})",
        (scope,),
    ).fetchone()
    return int(held)


def reserve(conn: sqlite3.Connection, path: Path, run_id: str, submission: NewSubmission,
            capacity_limit: int | None) -> bool:
    """Take the capacity and the items of a new ``reserved`` submission; False (nothing written)
    if the scope has no room. The caller's BEGIN IMMEDIATE took the write lock first, so the
    capacity read cannot go stale before the insert, whichever connection or process reserves."""
    sid = submission.submission_id
    if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None:
        raise RunStateError(f"{path}: no run named {run_id!r}")
    held = held_tokens(conn, submission.scope)
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
        raise ValueError(f"{path}: submission id {sid!r} is taken") from None
    taken = conn.executemany(
        "UPDATE run_items SET state = 'batched', submission = ?"
        " WHERE run_id = ? AND item_id = ? AND state = 'pending'",
        [(sid, run_id, item_id) for item_id in submission.item_ids],
    ).rowcount
    if taken != len(submission.item_ids):
        raise ValueError(_not_pending(conn, path, run_id, submission))  # rolls everything back
    conn.execute("UPDATE runs SET updated_at = ? WHERE run_id = ?", (now, run_id))
    return True


def _not_pending(conn: sqlite3.Connection, path: Path, run_id: str, submission: NewSubmission) -> str:
    for item_id in submission.item_ids:
        row = conn.execute(
            "SELECT state, submission FROM run_items WHERE run_id = ? AND item_id = ?", (run_id, item_id)
        ).fetchone()
        if row is None or row != ("batched", submission.submission_id):
            state = "not an item of this run" if row is None else f"{row[0]!r}"
            if row is not None and row[0] == "batched":
                state += f" (in submission {row[1]!r})"
            return (
                f"{path}: run {run_id!r}: item {item_id!r} is {state}, not 'pending';"
                f" submission {submission.submission_id!r} was not reserved"
            )
    return f"{path}: run {run_id!r}: submission {submission.submission_id!r}: items not pending"


def abandon(conn: sqlite3.Connection, run_id: str, submission_id: str, to: str, detail: str | None) -> int:
    """End a live submission without results; its batched items back to pending. How many went back."""
    if not _end_submission(conn, run_id, submission_id, to, detail, LIVE):
        return 0
    returned = conn.execute(
        "UPDATE run_items SET state = 'pending', submission = NULL"
        " WHERE run_id = ? AND submission = ? AND state = 'batched'",
        (run_id, submission_id),
    ).rowcount
    conn.execute("UPDATE runs SET updated_at = ? WHERE run_id = ?", (utc_now(), run_id))
    return int(returned)


def finish(conn: sqlite3.Connection, run_id: str, submission_id: str, results: Sequence[NewResult], *,
           unrun_item_ids: Sequence[str], detail: str | None) -> None:
    """End a ``submitted`` submission with its results (nothing changes if it is not ``submitted``)."""
    if not _end_submission(conn, run_id, submission_id, "finished", detail, "'submitted'"):
        return  # finished already (or never sent)
    mark_done(conn, run_id, results, submission=submission_id)
    conn.executemany(  # never ran at the provider: back to pending without using an attempt
        "UPDATE run_items SET state = 'pending', submission = NULL"
        " WHERE run_id = ? AND submission = ? AND state = 'batched' AND item_id = ?",
        [(run_id, submission_id, item_id) for item_id in unrun_item_ids],
    )
    # Whatever is still batched here has no result: the retry list and the rest alike
    # (an item of the retry list that got a result above stays done).
    conn.execute(
        "UPDATE run_items SET state = 'pending', submission = NULL, attempts = attempts + 1"
        " WHERE run_id = ? AND submission = ? AND state = 'batched'",
        (run_id, submission_id),
    )


def _end_submission(conn: sqlite3.Connection, run_id: str, submission_id: str, to: str,
                    detail: str | None, from_sql: str) -> bool:
    """Move the submission to ``to`` if its state is in ``from_sql`` (a literal SQL list)."""
    changed = conn.execute(
        "UPDATE run_submissions SET state = ?, detail = COALESCE(?, detail), updated_at = ?"
        f" WHERE run_id = ? AND submission_id = ? AND state IN ({from_sql})",
        (to, detail, utc_now(), run_id, submission_id),
    ).rowcount
    return changed == 1
