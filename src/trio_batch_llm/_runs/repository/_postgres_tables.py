"""The SQL of a PostgreSQL runs database: tables, migrations and the snapshot query.

The tables mirror SQLite's (:mod:`._sqlite_tables`: the same columns, the
same meaning, so both decode with one function); counters are ``BIGINT`` and
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

from .._schema import LIVE_SUBMISSION_STATES, UNRESOLVED_SUBMISSION_STATES
from ._leases import DRIVERS_TABLE_SQL

__all__ = [
    "LIVE", "MIGRATIONS", "MIGRATION_LOCK", "SCHEMA_TABLE", "SCHEMA_VERSION", "SNAPSHOT",
    "SUBMISSION_COLUMNS",
]

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

_LIVE: Final = ", ".join(f"'{state}'" for state in sorted(LIVE_SUBMISSION_STATES))
_UNRESOLVED: Final = ", ".join(f"'{state}'" for state in sorted(UNRESOLVED_SUBMISSION_STATES))
_RUN_COLUMNS: Final = (
    "run_id, mode, identity, config, status, termination, source_position, source_cursor,"
    " source_fingerprint, source_last_item, source_exhausted, items, done, succeeded, failed,"
    " input_tokens, output_tokens, total_tokens, last_sequence, created_at, updated_at"
)
LIVE: Final = _LIVE
SNAPSHOT: Final = (
    f"SELECT {_RUN_COLUMNS},"
    f" (SELECT COALESCE(SUM(s.items), 0)::bigint FROM run_submissions s"
    f"  WHERE s.run_id = runs.run_id AND s.state IN ({_LIVE})),"
    f" (SELECT COUNT(*) FROM run_submissions s WHERE s.run_id = runs.run_id AND s.state IN ({_LIVE})),"
    f" (SELECT s.submission_id FROM run_submissions s"
    f"  WHERE s.run_id = runs.run_id AND s.state IN ({_UNRESOLVED}) ORDER BY s.seq LIMIT 1)"
    " FROM runs WHERE run_id = %s"
)
SUBMISSION_COLUMNS: Final = (
    "submission_id, run_id, scope, state, items, tokens, input_file_id, batch_id, detail,"
    " created_at, updated_at"
)
