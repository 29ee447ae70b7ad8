"""The statements of :class:`PostgresRunRepository`'s multi-statement write transactions.

Each function runs on a connection already inside a transaction: the
repository opens, commits and rolls back, nothing here does. Raising inside
one rolls the whole transaction back, so each repository call writes all of
its rows or none.

Sequences: :func:`mark_done` takes the run's row lock (``SELECT … FOR
UPDATE``) before it reads ``last_sequence``, so recorders of one run
(threads, processes, machines) assign sequences one transaction after the
other, and a reader never sees sequence ``n`` committed before ``n - 1``.
Capacity: :func:`reserve` takes a transaction-level advisory lock on the
scope first, so two reservations in one scope check and insert one after the
other, whichever runs they belong to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._schema import NewItem, NewResult, NewSubmission, RunStateError, SourceCheckpoint
from ._postgres_tables import LIVE
from ._sqlite_tables import utc_now

__all__ = ["abandon", "finish", "held_tokens", "insert_items", "lock_run", "mark_done", "reserve"]

# A psycopg.Connection; Any so that importing this module does not import psycopg (an extra).
Conn = Any


def lock_run(conn: Conn, location: str, run_id: str) -> tuple[Any, ...]:
    """Lock the run's row for this transaction; its ``(items, last_sequence)``."""
    row = conn.execute(
        "SELECT items, last_sequence FROM runs WHERE run_id = %s FOR UPDATE", (run_id,)
    ).fetchone()
    if row is None:
        raise RunStateError(f"{location}: no run named {run_id!r}")
    return tuple(row)


def insert_items(conn: Conn, location: str, run_id: str, items: Sequence[NewItem],
                 checkpoint: SourceCheckpoint) -> None:
    """Add ``items`` (pending, numbered on from the run's count) and move the source checkpoint."""
    count, _ = lock_run(conn, location, run_id)
    if items and _replayed(conn, run_id, items, checkpoint):
        return
    seen: set[str] = set()
    for item in items:
        if item.item_id in seen:
            raise ValueError(f"duplicate item_id={item.item_id!r}: every item of a run needs a unique id")
        seen.add(item.item_id)
    if items:
        taken = conn.execute(
            "SELECT item_id FROM run_items WHERE run_id = %s AND item_id = ANY(%s) LIMIT 1",
            (run_id, [item.item_id for item in items]),
        ).fetchone()
        if taken is not None:
            raise ValueError(f"duplicate item_id={taken[0]!r}: every item of a run needs a unique id")
        # One statement, not executemany: see mark_done.
        conn.execute(
            "INSERT INTO run_items (run_id, item_id, ingest_seq, fingerprint, prompt, context, state)"
            " SELECT %s, u.item_id, u.seq, u.fingerprint, u.prompt, u.context, 'pending'"
            " FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::text[], %s::text[])"
            " AS u(item_id, seq, fingerprint, prompt, context)",
            (run_id, [item.item_id for item in items], [count + n for n in range(1, len(items) + 1)],
             [item.fingerprint for item in items], [item.prompt for item in items],
             [item.context_json for item in items]),
        )
    conn.execute(
        "UPDATE runs SET items = items + %s, source_position = %s, source_cursor = %s,"
        " source_fingerprint = %s, source_last_item = %s, source_exhausted = %s, updated_at = %s"
        " WHERE run_id = %s",
        (len(items), checkpoint.position, checkpoint.cursor, checkpoint.fingerprint,
         checkpoint.last_item_id, int(checkpoint.exhausted), utc_now(), run_id),
    )


def _replayed(conn: Conn, run_id: str, items: Sequence[NewItem], checkpoint: SourceCheckpoint) -> bool:
    """Whether this very slice is stored already: a retry of an ingest whose commit went through but
    whose answer was lost with the connection. (A slice moves the checkpoint forward, so a genuine
    duplicate id arrives under an older stored checkpoint and is refused as before.)"""
    row = conn.execute(
        "SELECT source_position, source_cursor, source_last_item FROM runs WHERE run_id = %s", (run_id,)
    ).fetchone()
    if row is None or tuple(row) != (checkpoint.position, checkpoint.cursor, checkpoint.last_item_id):
        return False
    stored = conn.execute(
        "SELECT COUNT(*) FROM run_items WHERE run_id = %s AND item_id = ANY(%s)",
        (run_id, [item.item_id for item in items]),
    ).fetchone()
    return stored is not None and int(stored[0]) == len({item.item_id for item in items})


def mark_done(conn: Conn, location: str, run_id: str, results: Sequence[NewResult], *,
              submission: str | None, lease: int | None = None) -> int:
    """Mark items done and append their results with the next sequences; how many were recorded.

    ``submission`` None: only pending items; else only items still batched in that submission.
    The first result of an item wins; results for items in any other state are skipped."""
    _, sequence = lock_run(conn, location, run_id)
    if not results:
        return 0
    where, extra = "state = 'pending'", list[Any]()
    if submission is not None:
        where, extra = "state = 'batched' AND submission = %s", [submission]
    elif lease is not None:
        where, extra = "state = 'leased' AND lease_token = %s", [lease]
    wanted = list(dict.fromkeys(result.item_id for result in results))
    rows = conn.execute(
        f"SELECT item_id FROM run_items WHERE run_id = %s AND item_id = ANY(%s) AND {where} FOR UPDATE",
        (run_id, wanted, *extra),
    ).fetchall()
    open_ids = {item_id for (item_id,) in rows}
    chosen: list[tuple[int, NewResult]] = []
    for result in results:
        if result.item_id in open_ids:
            open_ids.discard(result.item_id)  # never a second result for one item
            sequence += 1
            chosen.append((sequence, result))
    if not chosen:
        return 0
    conn.execute(
        "UPDATE run_items AS i SET state = 'done', result_sequence = u.seq, prompt = NULL, context = NULL,"
        " submission = NULL, lease_token = NULL FROM unnest(%s::text[], %s::bigint[]) AS u(item_id, seq)"
        " WHERE i.run_id = %s AND i.item_id = u.item_id",
        ([r.item_id for _, r in chosen], [seq for seq, _ in chosen], run_id),
    )
    # One statement, not executemany: psycopg runs executemany in pipeline mode, after which the
    # server does not arm idle_in_transaction_session_timeout, so a process frozen right after it
    # would hold the run's row lock for as long as it stays frozen.
    conn.execute(
        "INSERT INTO run_results (run_id, sequence, item_id, success, error_category, result)"
        " SELECT %s, u.seq, u.item_id, u.success, u.category, u.result"
        " FROM unnest(%s::bigint[], %s::text[], %s::integer[], %s::text[], %s::text[])"
        " AS u(seq, item_id, success, category, result)",
        (run_id, [seq for seq, _ in chosen], [r.item_id for _, r in chosen],
         [int(r.success) for _, r in chosen], [r.error_category for _, r in chosen],
         [r.result_json for _, r in chosen]),
    )
    succeeded = sum(1 for _, r in chosen if r.success)
    conn.execute(
        "UPDATE runs SET done = done + %s, succeeded = succeeded + %s, failed = failed + %s,"
        " input_tokens = input_tokens + %s, output_tokens = output_tokens + %s,"
        " total_tokens = total_tokens + %s, last_sequence = %s, updated_at = %s WHERE run_id = %s",
        (len(chosen), succeeded, len(chosen) - succeeded, sum(r.input_tokens for _, r in chosen),
         sum(r.output_tokens for _, r in chosen), sum(r.total_tokens for _, r in chosen), sequence,
         utc_now(), run_id),
    )
    return len(chosen)


def held_tokens(conn: Conn, scope: str) -> int:
    row = conn.execute(
        "SELECT COALESCE(SUM(tokens), 0)::bigint FROM run_submissions"
        f" WHERE scope = %s AND state IN ({LIVE})",
        (scope,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def reserve(conn: Conn, location: str, run_id: str, submission: NewSubmission,
            capacity_limit: int | None) -> bool:
    """Take the capacity and the items of a new ``reserved`` submission; False (nothing written)
    if the scope has no room. The scope's advisory lock is held to the end of the transaction."""
    sid = submission.submission_id
    lock_run(conn, location, run_id)
    if _reserved_already(conn, run_id, submission):
        return True  # a retry of a reservation whose commit went through but whose answer was lost
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"scope:{submission.scope}",))
    held = held_tokens(conn, submission.scope)
    if capacity_limit is not None and held + submission.tokens > capacity_limit:
        return False
    if conn.execute("SELECT 1 FROM run_submissions WHERE submission_id = %s", (sid,)).fetchone():
        raise ValueError(f"{location}: submission id {sid!r} is taken")
    now = utc_now()
    conn.execute(
        "INSERT INTO run_submissions (submission_id, run_id, scope, state, items, tokens,"
        " created_at, updated_at) VALUES (%s, %s, %s, 'reserved', %s, %s, %s, %s)",
        (sid, run_id, submission.scope, len(submission.item_ids), submission.tokens, now, now),
    )
    taken = conn.execute(
        "UPDATE run_items SET state = 'batched', submission = %s"
        " WHERE run_id = %s AND item_id = ANY(%s) AND state = 'pending'",
        (sid, run_id, list(submission.item_ids)),
    ).rowcount
    if taken != len(submission.item_ids):
        raise ValueError(_not_pending(conn, location, run_id, submission))  # rolls everything back
    conn.execute("UPDATE runs SET updated_at = %s WHERE run_id = %s", (now, run_id))
    return True


def _reserved_already(conn: Conn, run_id: str, submission: NewSubmission) -> bool:
    row = conn.execute(
        "SELECT run_id, scope, state, items, tokens FROM run_submissions WHERE submission_id = %s",
        (submission.submission_id,),
    ).fetchone()
    if row is None or tuple(row) != (run_id, submission.scope, "reserved", len(submission.item_ids),
                                     submission.tokens):
        return False
    batched = conn.execute(
        "SELECT COUNT(*) FROM run_items WHERE run_id = %s AND submission = %s AND state = 'batched'"
        " AND item_id = ANY(%s)",
        (run_id, submission.submission_id, list(submission.item_ids)),
    ).fetchone()
    return batched is not None and int(batched[0]) == len(submission.item_ids)


def _not_pending(conn: Conn, location: str, run_id: str, submission: NewSubmission) -> str:
    for item_id in submission.item_ids:
        row = conn.execute(
            "SELECT state, submission FROM run_items WHERE run_id = %s AND item_id = %s", (run_id, item_id)
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


def abandon(conn: Conn, run_id: str, submission_id: str, to: str, detail: str | None) -> int:
    """End a live submission without results; its batched items back to pending. How many went back."""
    if not _end_submission(conn, run_id, submission_id, to, detail, LIVE):
        return 0
    returned = conn.execute(
        "UPDATE run_items SET state = 'pending', submission = NULL"
        " WHERE run_id = %s AND submission = %s AND state = 'batched'",
        (run_id, submission_id),
    ).rowcount
    conn.execute("UPDATE runs SET updated_at = %s WHERE run_id = %s", (utc_now(), run_id))
    return int(returned)


def finish(conn: Conn, location: str, run_id: str, submission_id: str, results: Sequence[NewResult], *,
           unrun_item_ids: Sequence[str], detail: str | None) -> None:
    """End a ``submitted`` submission with its results (nothing changes if it is not ``submitted``)."""
    lock_run(conn, location, run_id)
    if not _end_submission(conn, run_id, submission_id, "finished", detail, "'submitted'"):
        return  # finished already (or never sent)
    mark_done(conn, location, run_id, results, submission=submission_id)
    if unrun_item_ids:  # never ran at the provider: back to pending without using an attempt
        conn.execute(
            "UPDATE run_items SET state = 'pending', submission = NULL"
            " WHERE run_id = %s AND submission = %s AND state = 'batched' AND item_id = ANY(%s)",
            (run_id, submission_id, list(unrun_item_ids)),
        )
    conn.execute(
        "UPDATE run_items SET state = 'pending', submission = NULL, attempts = attempts + 1"
        " WHERE run_id = %s AND submission = %s AND state = 'batched'",
        (run_id, submission_id),
    )


def _end_submission(conn: Conn, run_id: str, submission_id: str, to: str,
                    detail: str | None, from_sql: str) -> bool:
    changed = conn.execute(
        "UPDATE run_submissions SET state = %s, detail = COALESCE(%s, detail), updated_at = %s"
        f" WHERE run_id = %s AND submission_id = %s AND state IN ({from_sql})",
        (to, detail, utc_now(), run_id, submission_id),
    ).rowcount
    return bool(changed == 1)
