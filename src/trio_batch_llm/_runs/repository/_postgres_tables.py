"""The PostgreSQL runs tables: their DDL and the ordered migrations that create them.

The tables mirror SQLite's (:mod:`._sqlite_tables`: the same columns, the
same meaning, so both are read by :mod:`._rows`' one query and decoded by
its one function); counters are ``BIGINT`` and
times ISO-8601 text, as there. The schema's version lives in its own table,
``trio_batch_llm_schema`` (one row per component; ours is ``runs``), and
:data:`MIGRATIONS` is the ordered list of steps from an empty database: a
writer applies the steps above the stored version when it opens the
database, inside one transaction that holds an advisory lock, so processes
opening a fresh database at the same time create it once. A database written
by a newer version is refused.
"""

from __future__ import annotations

from typing import Final

from ._leases import DRIVERS_TABLE_SQL

__all__ = ["MIGRATIONS", "MIGRATION_LOCK", "SCHEMA_TABLE", "SCHEMA_VERSION"]

SCHEMA_TABLE: Final = "trio_batch_llm_schema"
# pg_advisory_xact_lock key of the migration (any fixed 64-bit number; "tbllruns" in ASCII).
MIGRATION_LOCK: Final = 0x74626C6C72756E73

_V1: Final = (
    """CREATE TABLE IF NOT EXISTS runs (
        run_id TEXT PRIMARY KEY,
        mode TEXT NOT NULL,
        identity TEXT NOT NULL,
        identity_fingerprint TEXT NOT NULL,
        config TEXT NOT NULL,
        status TEXT NOT NULL,
        termination TEXT,
        source_position BIGINT NOT NULL DEFAULT 0,
        source_cursor BIGINT,
        source_fingerprint TEXT,
        source_last_item TEXT,
        source_exhausted INTEGER NOT NULL DEFAULT 0,
        items BIGINT NOT NULL DEFAULT 0,
        done BIGINT NOT NULL DEFAULT 0,
        succeeded BIGINT NOT NULL DEFAULT 0,
        failed BIGINT NOT NULL DEFAULT 0,
        input_tokens BIGINT NOT NULL DEFAULT 0,
        output_tokens BIGINT NOT NULL DEFAULT 0,
        total_tokens BIGINT NOT NULL DEFAULT 0,
        last_sequence BIGINT NOT NULL DEFAULT 0,
        created_seq BIGSERIAL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS run_items (
        run_id TEXT NOT NULL REFERENCES runs (run_id),
        item_id TEXT NOT NULL,
        ingest_seq BIGINT NOT NULL,
        fingerprint TEXT NOT NULL,
        prompt TEXT,
        context TEXT,
        state TEXT NOT NULL,
        result_sequence BIGINT,
        attempts INTEGER NOT NULL DEFAULT 0,
        submission TEXT,
        PRIMARY KEY (run_id, item_id)
    )""",
    """CREATE TABLE IF NOT EXISTS run_results (
        run_id TEXT NOT NULL REFERENCES runs (run_id),
        sequence BIGINT NOT NULL,
        item_id TEXT NOT NULL,
        success INTEGER NOT NULL,
        error_category TEXT,
        result TEXT NOT NULL,
        PRIMARY KEY (run_id, sequence)
    )""",
    """CREATE TABLE IF NOT EXISTS run_submissions (
        submission_id TEXT PRIMARY KEY,
        seq BIGSERIAL UNIQUE,
        run_id TEXT NOT NULL REFERENCES runs (run_id),
        scope TEXT NOT NULL,
        state TEXT NOT NULL,
        items BIGINT NOT NULL,
        tokens BIGINT NOT NULL,
        input_file_id TEXT,
        batch_id TEXT,
        detail TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS run_items_by_state ON run_items (run_id, state, ingest_seq)",
    "CREATE INDEX IF NOT EXISTS run_items_by_submission ON run_items (run_id, submission, ingest_seq)"
    " WHERE submission IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS run_submissions_by_scope ON run_submissions (scope, state)",
    "CREATE INDEX IF NOT EXISTS run_submissions_by_run ON run_submissions (run_id, state)",
)

# Version 2: leases, for many drivers per run (:mod:`._leases`).
_V2: Final = (
    "ALTER TABLE run_items ADD COLUMN IF NOT EXISTS lease_token BIGINT",
    "ALTER TABLE runs ADD COLUMN IF NOT EXISTS lease_counter BIGINT NOT NULL DEFAULT 0",
    "ALTER TABLE runs ADD COLUMN IF NOT EXISTS expired_lease_items BIGINT NOT NULL DEFAULT 0",
    DRIVERS_TABLE_SQL,
)

# (version, statements): applied in order above the stored version, in one transaction.
MIGRATIONS: Final[tuple[tuple[int, tuple[str, ...]], ...]] = ((1, _V1), (2, _V2))
SCHEMA_VERSION: Final = MIGRATIONS[-1][0]
