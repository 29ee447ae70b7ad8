"""The SQLite runs tables: their DDL, the in-place migration, the schema version stored in ``meta``.

What both dialects share (column lists, the snapshot query, row decoding)
is :mod:`._rows`; :class:`SqliteRunRepository` owns the connection and the
transactions: nothing here opens or commits anything.

Schema version 3 added leases (``run_drivers``, ``lease_token`` on
``run_items``, ``lease_counter``/``expired_lease_items`` on ``runs``).
Schema version 2 added provider-batch submissions (``run_submissions``, and
``attempts``/``submission`` on ``run_items``). :func:`migrate` brings a
version-1 file to it in place, inside the writer's opening transaction
(``ALTER TABLE … ADD COLUMN``, ``CREATE … IF NOT EXISTS``, then the stored
``runs_schema_version`` is bumped); a file written by a newer schema is refused.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any, Final

from ..._values._errors import ArtifactStoreError
from ._leases import DRIVERS_TABLE_SQL
from ._rows import RUN_COLUMNS

__all__ = [
    "ADDED_COLUMNS", "INDEXES", "RUNS_SCHEMA_VERSION", "SNAPSHOT_V1", "TABLES", "columns", "migrate",
    "stored_schema_version",
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
# A read-only reader of a version-1 file: no submissions there.
SNAPSHOT_V1: Final = f"SELECT {RUN_COLUMNS}, 0, 0, NULL FROM runs WHERE run_id = ?"


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
