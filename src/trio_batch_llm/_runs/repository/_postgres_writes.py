"""The PostgreSQL spelling of the writes that differ per dialect: new items, results, reservations.

Each function runs on a connection already inside a transaction: the
repository opens, commits and rolls back, nothing here does. Raising inside
one rolls the whole transaction back, so each repository call writes all of
its rows or none. What both dialects write alike is :mod:`._writes`.

Three things SQLite's single writer gives for free are spelled out here.
Sequences: :func:`mark_done` takes the run's row lock (``SELECT … FOR
UPDATE``) before it reads ``last_sequence``, so recorders of one run
(threads, processes, machines) assign sequences one transaction after the
other, and a reader never sees sequence ``n`` committed before ``n - 1``.
Capacity: :func:`reserve` takes a transaction-level advisory lock on the
scope first, so two reservations in one scope check and insert one after the
other, whichever runs they belong to. Replays: the async side retries a call
through an outage (:class:`RepositoryClient`), so a write whose commit went
through but whose answer was lost with the connection arrives again;
:func:`insert_items` and :func:`reserve` recognise their own earlier commit
and do nothing, and a repeated ``mark_done`` finds its items done.

Lists go to the server as one array parameter (``unnest``, ``= ANY``), in one
statement, never through ``executemany``: psycopg runs ``executemany`` in
pipeline mode, after which the server does not arm
``idle_in_transaction_session_timeout``, so a process frozen right after it
would hold the run's row lock for as long as it stays frozen.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._schema import NewItem, NewResult, NewSubmission, SourceCheckpoint
from . import _writes as shared
from ._dialect import POSTGRES
from ._tables import utc_now

__all__ = ["insert_items", "lock_run", "mark_done", "reserve"]

# A psycopg.Connection; Any so that importing this module does not import psycopg (an extra).
Conn = Any


def lock_run(conn: Conn, location: str, run_id: str) -> tuple[int, int]:
    """Lock the run's row for this transaction; its ``(items, last_sequence)``."""
    return shared.lock_run(conn, POSTGRES, location, run_id)


def insert_items(conn: Conn, location: str, run_id: str, items: Sequence[NewItem],
                 checkpoint: SourceCheckpoint) -> None:
    """Add ``items`` (pending, numbered on from the run's count) and move the source checkpoint."""
    count, _ = lock_run(conn, location, run_id)  # the next numbers are ours until the commit
    if items and _replayed(conn, run_id, items, checkpoint):
        return
    seen: set[str] = set()
    for item in items:
        if item.item_id in seen:
            raise ValueError(f"duplicate item_id={item.item_id!r}: every item of a run needs a unique id")
        seen.add(item.item_id)
    if items:
        # Checked before the insert, not caught from it: a unique violation aborts a PostgreSQL
        # transaction, and the message should name the id.
        taken = conn.execute(
            "SELECT item_id FROM run_items WHERE run_id = %s AND item_id = ANY(%s) LIMIT 1",
            (run_id, [item.item_id for item in items]),
        ).fetchone()
        if taken is not None:
            raise ValueError(f"duplicate item_id={taken[0]!r}: every item of a run needs a unique id")
        conn.execute(
            "INSERT INTO run_items (run_id, item_id, ingest_seq, fingerprint, prompt, context, state)"
            " SELECT %s, u.item_id, u.seq, u.fingerprint, u.prompt, u.context, 'pending'"
            " FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::text[], %s::text[])"
            " AS u(item_id, seq, fingerprint, prompt, context)",
            (run_id, [item.item_id for item in items], [count + n for n in range(1, len(items) + 1)],
             [item.fingerprint for item in items], [item.prompt for item in items],
             [item.context_json for item in items]),
        )
    shared.move_checkpoint(conn, POSTGRES, run_id, len(items), checkpoint)


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
    where, extra = shared.open_items(submission, lease)
    wanted = list(dict.fromkeys(result.item_id for result in results))
    # The open items, locked: a lease expiring or a batch ending in another transaction waits for
    # this one, so an item chosen here is still open when its result is written below.
    rows = conn.execute(
        POSTGRES.sql(f"SELECT item_id FROM run_items WHERE run_id = ? AND item_id = ANY(?) AND {where}"
                     " FOR UPDATE"),
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
    conn.execute(
        "INSERT INTO run_results (run_id, sequence, item_id, success, error_category, result)"
        " SELECT %s, u.seq, u.item_id, u.success, u.category, u.result"
        " FROM unnest(%s::bigint[], %s::text[], %s::integer[], %s::text[], %s::text[])"
        " AS u(seq, item_id, success, category, result)",
        (run_id, [seq for seq, _ in chosen], [r.item_id for _, r in chosen],
         [int(r.success) for _, r in chosen], [r.error_category for _, r in chosen],
         [r.result_json for _, r in chosen]),
    )
    shared.add_done(conn, POSTGRES, run_id, [r for _, r in chosen], sequence)
    return len(chosen)


def reserve(conn: Conn, location: str, run_id: str, submission: NewSubmission,
            capacity_limit: int | None) -> bool:
    """Take the capacity and the items of a new ``reserved`` submission; False (nothing written)
    if the scope has no room. The scope's advisory lock is held to the end of the transaction."""
    sid = submission.submission_id
    lock_run(conn, location, run_id)
    if _reserved_already(conn, run_id, submission):
        return True  # a retry of a reservation whose commit went through but whose answer was lost
    # Scopes are shared across runs, so the run's row lock does not cover them: without this lock
    # two runs' reservations could both read the same held total and both insert past the limit.
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"scope:{submission.scope}",))
    held = shared.held_tokens(conn, POSTGRES, submission.scope)
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
        # Rolls everything back, the submission's row included: no half-reserved batch.
        raise ValueError(shared.not_pending(conn, POSTGRES, location, run_id, submission))
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
