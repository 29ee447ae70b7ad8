"""The run tables both dialects share: their DDL, column lists, the snapshot query, row decoding.

The SQLite and PostgreSQL tables (:mod:`._sqlite_tables`, :mod:`._postgres_tables`)
are created from one text (:func:`create_tables`, spelled with each engine's
types) and have the same columns with the same meaning, so one query reads a
run from either and one function decodes the row. Nothing here opens or
commits anything.
"""

from __future__ import annotations

import datetime
import json
from typing import Any, Final

from ..._values._artifact_identity import ArtifactIdentity
from .._schema import (
    LIVE_SUBMISSION_STATES,
    UNRESOLVED_SUBMISSION_STATES,
    NewSubmission,
    RunSnapshot,
    RunTermination,
    SourceCheckpoint,
)

__all__ = [
    "ALL_SUBMISSION_STATES", "INDEXES", "LIVE", "RUN_COLUMNS", "SNAPSHOT", "SUBMISSION_COLUMNS", "UNRESOLVED",
    "check_new_submission", "check_states", "create_tables", "decode_snapshot", "is_count", "utc_now",
]

_TABLES: Final = (
    """CREATE TABLE IF NOT EXISTS runs (
        run_id TEXT PRIMARY KEY,
        mode TEXT NOT NULL,
        identity TEXT NOT NULL,
        identity_fingerprint TEXT NOT NULL,
        config TEXT NOT NULL,
        status TEXT NOT NULL,
        termination TEXT,
        source_position {big} NOT NULL DEFAULT 0,
        source_cursor {big},
        source_fingerprint TEXT,
        source_last_item TEXT,
        source_exhausted INTEGER NOT NULL DEFAULT 0,
        items {big} NOT NULL DEFAULT 0,
        done {big} NOT NULL DEFAULT 0,
        succeeded {big} NOT NULL DEFAULT 0,
        failed {big} NOT NULL DEFAULT 0,
        input_tokens {big} NOT NULL DEFAULT 0,
        output_tokens {big} NOT NULL DEFAULT 0,
        total_tokens {big} NOT NULL DEFAULT 0,
        last_sequence {big} NOT NULL DEFAULT 0,
        {created_seq}created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
    # Prompt and context are kept only while the item is pending (a resume needs them).
    """CREATE TABLE IF NOT EXISTS run_items (
        run_id TEXT NOT NULL{of_run},
        item_id TEXT NOT NULL,
        ingest_seq {big} NOT NULL,
        fingerprint TEXT NOT NULL,
        prompt TEXT,
        context TEXT,
        state TEXT NOT NULL,
        result_sequence {big},
        attempts INTEGER NOT NULL DEFAULT 0,
        submission TEXT,
        PRIMARY KEY (run_id, item_id)
    ){without_rowid}""",
    """CREATE TABLE IF NOT EXISTS run_results (
        run_id TEXT NOT NULL{of_run},
        sequence {big} NOT NULL,
        item_id TEXT NOT NULL,
        success INTEGER NOT NULL,
        error_category TEXT,
        result TEXT NOT NULL,
        PRIMARY KEY (run_id, sequence)
    ){without_rowid}""",
    # seq: creation order across the store (a rowid is not stable under VACUUM).
    """CREATE TABLE IF NOT EXISTS run_submissions (
        submission_id TEXT PRIMARY KEY,
        seq {serial} UNIQUE,
        run_id TEXT NOT NULL{of_run},
        scope TEXT NOT NULL,
        state TEXT NOT NULL,
        items {big} NOT NULL,
        tokens {big} NOT NULL,
        input_file_id TEXT,
        batch_id TEXT,
        detail TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
)
INDEXES: Final = (
    "CREATE INDEX IF NOT EXISTS run_items_by_state ON run_items (run_id, state, ingest_seq)",
    # Partial: only batched items carry a submission, so the index stays as small as the open batches.
    "CREATE INDEX IF NOT EXISTS run_items_by_submission ON run_items (run_id, submission, ingest_seq)"
    " WHERE submission IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS run_submissions_by_scope ON run_submissions (scope, state)",
    "CREATE INDEX IF NOT EXISTS run_submissions_by_run ON run_submissions (run_id, state)",
)


def create_tables(*, big: str, serial: str, created_seq: str, of_run: str,
                  without_rowid: str) -> tuple[str, ...]:
    """The four run tables (without leases' ``run_drivers``), spelled with a dialect's words.

    ``big``: the type of a counter; ``serial``: the type of the submissions' creation order;
    ``created_seq``: a column that orders runs created within one timestamp (or nothing);
    ``of_run``: a foreign key to the run; ``without_rowid``: a SQLite table option. The texts
    are those a database created before this function holds: changing them changes no table
    already created, so each dialect's words must stay as they are."""
    words = {"big": big, "serial": serial, "created_seq": created_seq, "of_run": of_run,
             "without_rowid": without_rowid}
    return tuple(table.format(**words) for table in _TABLES)


RUN_COLUMNS: Final = (
    "run_id, mode, identity, config, status, termination, source_position, source_cursor,"
    " source_fingerprint, source_last_item, source_exhausted, items, done, succeeded, failed,"
    " input_tokens, output_tokens, total_tokens, last_sequence, created_at, updated_at"
)
# Literal SQL lists (the states are ours, never a caller's string).
LIVE: Final = ", ".join(f"'{state}'" for state in sorted(LIVE_SUBMISSION_STATES))
UNRESOLVED: Final = ", ".join(f"'{state}'" for state in sorted(UNRESOLVED_SUBMISSION_STATES))
ALL_SUBMISSION_STATES: Final = LIVE_SUBMISSION_STATES | {"finished", "abandoned", "cancelled"}
# One statement, so the submission fields are read from the same snapshot as the run's counters
# (a submission ending between two reads would otherwise show its items both batched and done).
# The CAST: PostgreSQL sums a BIGINT column to NUMERIC (a Decimal in Python); SQLite's integer
# sum is unchanged by it.
SNAPSHOT: Final = (
    f"SELECT {RUN_COLUMNS},"
    f" (SELECT CAST(COALESCE(SUM(s.items), 0) AS BIGINT) FROM run_submissions s"
    f"  WHERE s.run_id = runs.run_id AND s.state IN ({LIVE})),"
    f" (SELECT COUNT(*) FROM run_submissions s WHERE s.run_id = runs.run_id AND s.state IN ({LIVE})),"
    f" (SELECT s.submission_id FROM run_submissions s"
    f"  WHERE s.run_id = runs.run_id AND s.state IN ({UNRESOLVED}) ORDER BY s.seq LIMIT 1)"
    " FROM runs WHERE run_id = ?"
)
SUBMISSION_COLUMNS: Final = (
    "submission_id, run_id, scope, state, items, tokens, input_file_id, batch_id, detail,"
    " created_at, updated_at"
)


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


def decode_snapshot(row: tuple[Any, ...]) -> RunSnapshot:
    (run_id, mode, identity, config, status, termination, position, cursor, fingerprint, last_item,
     exhausted, items, done, succeeded, failed, inp, out, total, last_seq, created, updated,
     batched, open_submissions, unresolved) = row
    term = json.loads(termination) if termination else None
    return RunSnapshot(
        run_id=run_id,
        status=status,
        mode=mode,
        identity=ArtifactIdentity(**json.loads(identity)),
        config=json.loads(config),
        termination=RunTermination(term["kind"], term.get("reason"), term.get("item_id")) if term else None,
        checkpoint=SourceCheckpoint(
            position=position, cursor=cursor, fingerprint=fingerprint, last_item_id=last_item,
            exhausted=bool(exhausted),
        ),
        items=items, done=done, succeeded=succeeded, failed=failed,
        input_tokens=inp, output_tokens=out, total_tokens=total, last_sequence=last_seq,
        created_at=created, updated_at=updated,
        batched=batched, open_submissions=open_submissions, unresolved_submission=unresolved,
    )


def is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_new_submission(submission: NewSubmission, capacity_limit: int | None) -> None:
    sid = submission.submission_id
    if not is_count(submission.tokens):
        raise ValueError(f"submission {sid!r}: tokens must be an int >= 0, not {submission.tokens!r}")
    if capacity_limit is not None and not is_count(capacity_limit):
        raise ValueError(f"capacity_limit must be None or an int >= 0, not {capacity_limit!r}")
    if not submission.item_ids:
        raise ValueError(f"submission {sid!r} lists no items")
    seen: set[str] = set()
    for item_id in submission.item_ids:
        if item_id in seen:
            raise ValueError(f"submission {sid!r} lists item {item_id!r} twice")
        seen.add(item_id)


def check_states(states: frozenset[str], allowed: frozenset[str], what: str) -> None:
    if not states <= allowed:
        raise ValueError(f"{what} must be among {sorted(allowed)}, not {sorted(states - allowed)}")
