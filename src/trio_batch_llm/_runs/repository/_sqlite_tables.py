"""The SQL of a runs database: tables, migration, the snapshot query, row decoding and checks.

Shared by :class:`SqliteRunRepository` (which owns the connection and the
transactions); nothing here opens or commits anything.

Schema version 3 added leases (``run_drivers``, ``lease_token`` on
``run_items``, ``lease_counter``/``expired_lease_items`` on ``runs``).
Schema version 2 added provider-batch submissions (``run_submissions``, and
``attempts``/``submission`` on ``run_items``). :func:`migrate` brings a
version-1 file to it in place, inside the writer's opening transaction
(``ALTER TABLE … ADD COLUMN``, ``CREATE … IF NOT EXISTS``, then the stored
``runs_schema_version`` is bumped); a file written by a newer schema is refused.
"""

from __future__ import annotations

import datetime
import json
import sqlite3
from pathlib import Path
from typing import Any, Final

from ..._values._artifact_identity import ArtifactIdentity
from ..._values._errors import ArtifactStoreError
from .._schema import (
    LIVE_SUBMISSION_STATES,
    UNRESOLVED_SUBMISSION_STATES,
    NewSubmission,
    RunSnapshot,
    RunTermination,
    SourceCheckpoint,
)
from ._leases import DRIVERS_TABLE_SQL

__all__ = [
    "ADDED_COLUMNS",
    "ALL_SUBMISSION_STATES",
    "INDEXES",
    "LIVE",
    "RUNS_SCHEMA_VERSION",
    "RUN_COLUMNS",
    "SNAPSHOT",
    "SNAPSHOT_V1",
    "SUBMISSION_COLUMNS",
    "TABLES",
    "UNRESOLVED",
    "check_new_submission",
    "check_states",
    "columns",
    "decode_snapshot",
    "is_count",
    "migrate",
    "stored_schema_version",
    "utc_now",
]

RUNS_SCHEMA_VERSION: Final = 3

TABLES: Final = (
    """CREATE TABLE IF NOT EXISTS runs (
        run_id TEXT PRIMARY KEY,
        mode TEXT NOT NULL,
        identity TEXT NOT NULL,
        identity_fingerprint TEXT NOT NULL,
        config TEXT NOT NULL,
        status TEXT NOT NULL,
        termination TEXT,
        source_position INTEGER NOT NULL DEFAULT 0,
        source_cursor INTEGER,
        source_fingerprint TEXT,
        source_last_item TEXT,
        source_exhausted INTEGER NOT NULL DEFAULT 0,
        items INTEGER NOT NULL DEFAULT 0,
        done INTEGER NOT NULL DEFAULT 0,
        succeeded INTEGER NOT NULL DEFAULT 0,
        failed INTEGER NOT NULL DEFAULT 0,
        input_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        total_tokens INTEGER NOT NULL DEFAULT 0,
        last_sequence INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
    # Prompt and context are kept only while the item is pending (a resume needs them).
    """CREATE TABLE IF NOT EXISTS run_items (
        run_id TEXT NOT NULL,
        item_id TEXT NOT NULL,
        ingest_seq INTEGER NOT NULL,
        fingerprint TEXT NOT NULL,
        prompt TEXT,
        context TEXT,
        state TEXT NOT NULL,
        result_sequence INTEGER,
        attempts INTEGER NOT NULL DEFAULT 0,
        submission TEXT,
        PRIMARY KEY (run_id, item_id)
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS run_results (
        run_id TEXT NOT NULL,
        sequence INTEGER NOT NULL,
        item_id TEXT NOT NULL,
        success INTEGER NOT NULL,
        error_category TEXT,
        result TEXT NOT NULL,
        PRIMARY KEY (run_id, sequence)
    ) WITHOUT ROWID""",
    # seq: creation order across the store (a rowid is not stable under VACUUM).
    """CREATE TABLE IF NOT EXISTS run_submissions (
        submission_id TEXT PRIMARY KEY,
        seq INTEGER NOT NULL UNIQUE,
        run_id TEXT NOT NULL,
        scope TEXT NOT NULL,
        state TEXT NOT NULL,
        items INTEGER NOT NULL,
        tokens INTEGER NOT NULL,
        input_file_id TEXT,
        batch_id TEXT,
        detail TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
    DRIVERS_TABLE_SQL,
)
# Version 1 -> 2: columns a version-1 run_items lacks (CREATE TABLE IF NOT EXISTS keeps the old table).
ADDED_COLUMNS: Final = (
    ("run_items", "attempts", "INTEGER NOT NULL DEFAULT 0"),
    ("run_items", "submission", "TEXT"),
    # Version 2 -> 3: leases (many drivers per run, :mod:`._leases`).
    ("run_items", "lease_token", "INTEGER"),
    ("runs", "lease_counter", "INTEGER NOT NULL DEFAULT 0"),
    ("runs", "expired_lease_items", "INTEGER NOT NULL DEFAULT 0"),
)
INDEXES: Final = (
    "CREATE INDEX IF NOT EXISTS run_items_by_state ON run_items (run_id, state, ingest_seq)",
    # Partial: only batched items carry a submission, so the index stays as small as the open batches.
    "CREATE INDEX IF NOT EXISTS run_items_by_submission ON run_items (run_id, submission, ingest_seq)"
    " WHERE submission IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS run_submissions_by_scope ON run_submissions (scope, state)",
    "CREATE INDEX IF NOT EXISTS run_submissions_by_run ON run_submissions (run_id, state)",
)
RUN_COLUMNS: Final = (
    "run_id, mode, identity, config, status, termination, source_position, source_cursor,"
    " source_fingerprint, source_last_item, source_exhausted, items, done, succeeded, failed,"
    " input_tokens, output_tokens, total_tokens, last_sequence, created_at, updated_at"
)
LIVE: Final = ", ".join(f"'{state}'" for state in sorted(LIVE_SUBMISSION_STATES))
UNRESOLVED: Final = ", ".join(f"'{state}'" for state in sorted(UNRESOLVED_SUBMISSION_STATES))
ALL_SUBMISSION_STATES: Final = LIVE_SUBMISSION_STATES | {"finished", "abandoned", "cancelled"}
# One statement, so the submission fields are read from the same snapshot as the run's counters.
SNAPSHOT: Final = (
    f"SELECT {RUN_COLUMNS},"
    f" (SELECT COALESCE(SUM(s.items), 0) FROM run_submissions s"
    f"  WHERE s.run_id = runs.run_id AND s.state IN ({LIVE})),"
    f" (SELECT COUNT(*) FROM run_submissions s WHERE s.run_id = runs.run_id AND s.state IN ({LIVE})),"
    f" (SELECT s.submission_id FROM run_submissions s"
    f"  WHERE s.run_id = runs.run_id AND s.state IN ({UNRESOLVED}) ORDER BY s.seq LIMIT 1)"
    " FROM runs WHERE run_id = ?"
)
# A read-only reader of a version-1 file: no submissions there.
SNAPSHOT_V1: Final = f"SELECT {RUN_COLUMNS}, 0, 0, NULL FROM runs WHERE run_id = ?"
SUBMISSION_COLUMNS: Final = (
    "submission_id, run_id, scope, state, items, tokens, input_file_id, batch_id, detail,"
    " created_at, updated_at"
)


def migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Inside the opening transaction: the run tables, created or brought to this schema version."""
    meta = stored_schema_version(conn, path)
    for statement in TABLES:
        conn.execute(statement)
    for table, column, declaration in ADDED_COLUMNS:
        if column not in columns(conn, table):
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
    for statement in INDEXES:
        conn.execute(statement)
    if meta.get("runs_schema_version") != RUNS_SCHEMA_VERSION:
        meta["runs_schema_version"] = RUNS_SCHEMA_VERSION
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('runs', ?)", (json.dumps(meta),))


def stored_schema_version(conn: sqlite3.Connection, path: Path) -> dict[str, Any]:
    """The 'runs' meta entry ({} if none yet); refuses a file written by a newer schema."""
    row = conn.execute("SELECT value FROM meta WHERE key = 'runs'").fetchone()
    meta = json.loads(row[0]) if row else {}
    version = meta.get("runs_schema_version") if isinstance(meta, dict) else None
    if row is not None and (not isinstance(version, int) or version > RUNS_SCHEMA_VERSION):
        raise ArtifactStoreError(
            f"{path}: runs schema version {version!r} is newer than this library reads "
            f"({RUNS_SCHEMA_VERSION}); upgrade trio-batch-llm"
        )
    return meta if isinstance(meta, dict) else {}


def columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


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
