"""What every PostgreSQL user of the library shares: the connect timeout, the schema table and its lock,
and which errors say the server could not be reached.

The run repository and the response cache keep their tables in the same database, under one schema
table and one migration lock, and tell an outage from a refusal the same way; both import these from
here (the cache sits below the runs in the layout, so neither may import the other's module).
"""

from __future__ import annotations

from typing import Final

__all__ = ["DEFAULT_CONNECT_TIMEOUT", "MIGRATION_LOCK", "SCHEMA_TABLE", "unreachable"]

DEFAULT_CONNECT_TIMEOUT: Final = 10.0
SCHEMA_TABLE: Final = "trio_batch_llm_schema"
# pg_advisory_xact_lock key of the migration (any fixed 64-bit number; "tbllruns" in ASCII).
MIGRATION_LOCK: Final = 0x74626C6C72756E73
# SQLSTATEs of a server that is going away or not there yet: admin_shutdown, crash_shutdown,
# cannot_connect_now (starting up, shutting down). Class 08 (connection exceptions) and
# errors without a SQLSTATE (refused, reset, closed, no such host) count as unreachable too.
_GOING_AWAY: Final = frozenset({"57P01", "57P02", "57P03"})
_NOT_UP: Final = ("shutting down", "starting up", "in recovery", "not yet accepting", "too many clients",
                  "terminating connection")


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the server could not be reached (rather than that it refused something)."""
    import psycopg

    if isinstance(exc, OSError):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    if state is None:
        # A connection attempt that failed: the network's word (refused, reset, timed out, no such
        # host) is an outage; the server's (a FATAL line) only when it is going away or not up yet,
        # never a refused login or a database that does not exist.
        text = str(exc).lower()
        return "fatal:" not in text or any(marker in text for marker in _NOT_UP)
    return state.startswith("08") or state in _GOING_AWAY
