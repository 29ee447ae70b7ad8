"""The SQLite runs tables: their DDL, the in-place migration, the schema version stored in ``meta``.

What both dialects share (column lists, the snapshot query, row decoding)
is :mod:`._tables`; :class:`SqliteRunRepository` owns the connection and the
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
from ._tables import INDEXES, RUN_COLUMNS, create_tables

__all__ = [
    "ADDED_COLUMNS", "INDEXES", "RUNS_SCHEMA_VERSION", "SNAPSHOT_V1", "TABLES", "columns", "migrate",
    "stored_schema_version",
]

RUNS_SCHEMA_VERSION: Final = 3

TABLES: Final = (
    *create_tables(big="INTEGER", serial="INTEGER NOT NULL", created_seq="", of_run="",
                   without_rowid=" WITHOUT ROWID"),
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
