"""The PostgreSQL runs tables: their DDL and the ordered migrations that create them.

The tables mirror SQLite's (:mod:`._sqlite_tables`: the same columns, the
same meaning, so both are read by :mod:`._tables`' one query and decoded by
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
from ._tables import INDEXES, create_tables

__all__ = ["MIGRATIONS", "SCHEMA_VERSION"]


_V1: Final = (
    *create_tables(big="BIGINT", serial="BIGSERIAL", created_seq="created_seq BIGSERIAL,\n        ",
                   of_run=" REFERENCES runs (run_id)", without_rowid=""),
    *INDEXES,
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
