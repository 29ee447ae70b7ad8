"""``PostgresRunRepository``: run state in a PostgreSQL database (psycopg 3, synchronous).

The PostgreSQL dialect of :class:`SqlRunRepository` (:mod:`._sql`), which
holds the run-state logic: the same tables and behaviour as
:class:`SqliteRunRepository` (:mod:`._postgres_tables`), for runs that many
processes on many machines drive. This module holds what only PostgreSQL
does: the connection (and reconnecting), its errors, and claims by advisory
lock. Synchronous and blocking like SQLite: the async side calls it from its
worker gate (:class:`RepositoryClient`; psycopg's own async API is
asyncio-only). Each public method is one transaction, as :mod:`._protocol`
asks (:mod:`._postgres_writes` holds the writes PostgreSQL spells its own way).

The right to drive a run is a session-level advisory lock: it dies with the
connection, so a killed process's claim is free at once. If the connection
is lost (a server restart, a network cut) the next call reconnects and takes
the claims it held again; when another process took one meanwhile, that call
raises :class:`ClaimLostError` saying the claim was lost, and ``ingest`` keeps
refusing for that run until this object claims it again (one ingester at a time).

Errors: a connection-level failure (refused, reset, the server shutting down
or starting up, a name that does not resolve) raises
:class:`DatabaseUnavailableError` -- the async side (:class:`RepositoryClient`)
retries those within its outage window -- and every other database error
:class:`ArtifactStoreError`.

The database is named by a ``postgresql://`` URL or a libpq keyword string
(``"host=... dbname=..."``, :mod:`..._values._conninfo`). Credentials: either may carry a
password (or psycopg finds one in ``PGPASSWORD``/``~/.pgpass``). It is used to
connect and nowhere else: ``location``, the repr and every error message show
the store with its password (and a URL's userinfo and key-like query values)
redacted, and errors from the server have any occurrence of the password
removed too.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Final, final

from ..._values._conninfo import display, is_postgres_store, is_postgres_url, secret_of
from ..._values._errors import ArtifactStoreError, ConfigurationError, DatabaseUnavailableError
from ..._values._postgres import DEFAULT_CONNECT_TIMEOUT, MIGRATION_LOCK, SCHEMA_TABLE, unreachable
from ..._values._urls import REDACTED
from .._schema import (
    ClaimLostError,
    NewItem,
    NewResult,
    NewSubmission,
    RunSnapshot,
    RunStateError,
    SourceCheckpoint,
)
from . import _postgres_writes as writes
from ._dialect import POSTGRES, Dialect
from ._postgres_tables import MIGRATIONS, SCHEMA_VERSION
from ._sql import SqlRunRepository
from ._tables import utc_now

__all__ = ["DEFAULT_CONNECT_TIMEOUT", "PostgresRunRepository", "is_postgres_store", "is_postgres_url"]

# A process stopped mid-transaction holds the run's row lock: the server ends its session after this.
DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT: Final = 5.0
_CLAIM_SALT: Final = b"trio-batch-llm run claim\x00"


def _claim_key(run_id: str) -> int:
    # Advisory locks take a 64-bit key: a salted digest of the run id, so a run's key collides
    # neither with another run's (2**-64) nor with the keys other applications use on the server.
    digest = hashlib.sha256(_CLAIM_SALT + run_id.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


@final
class PostgresRunRepository(SqlRunRepository[Any]):
    """Runs in a PostgreSQL database named by a ``postgresql://`` URL or a libpq keyword string;
    see the module docstring.

    Not thread-safe: one caller at a time (the worker gate). ``connect_timeout``
    (seconds) bounds each connection attempt; ``statement_timeout`` (seconds,
    or None) bounds each statement, lock waits included;
    ``idle_in_transaction_timeout`` (seconds, or None) ends the session of a
    process stopped in the middle of a transaction (SIGSTOP, a paused VM), which
    would otherwise hold the run's row lock and stall every other driver for as
    long as it is stopped. Its claims go with the session; its lease expires as
    usual. Our transactions never wait between statements, so any bound well
    above a scheduling hiccup is safe.
    """

    _dialect: ClassVar[Dialect] = POSTGRES

    def __init__(
        self,
        url: str,
        *,
        read_only: bool = False,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        statement_timeout: float | None = 60.0,
        idle_in_transaction_timeout: float | None = DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not is_postgres_store(url):
            raise ConfigurationError("url", display(str(url)),
                                     "must start with postgresql:// or be a libpq keyword string (host=...)")
        if isinstance(connect_timeout, bool) or not isinstance(connect_timeout, (int, float)) \
                or not connect_timeout > 0:
            raise ConfigurationError("connect_timeout", connect_timeout, "must be a number of seconds > 0")
        idle = idle_in_transaction_timeout
        if idle is not None and (isinstance(idle, bool) or not isinstance(idle, (int, float))
                                 or not idle >= 0.001):
            raise ConfigurationError("idle_in_transaction_timeout", idle,
                                     "must be a number of seconds >= 0.001, or None")
        self._url = url
        self._secret = secret_of(url)
        self._location = display(url)
        self._read_only = read_only
        self._connect_timeout = connect_timeout
        self._statement_timeout = statement_timeout
        self._idle_in_transaction_timeout = idle_in_transaction_timeout
        self._conn: Any = None
        self._opened = False
        self._claims: set[str] = set()
        self._lost_claims: set[str] = set()  # claims a reconnect could not take again: no ingesting
        self._clock = clock  # seconds; every lease expiry is decided by it (a test injects a fake)

    @property
    def location(self) -> str:
        return self._location

    def __repr__(self) -> str:
        return f"PostgresRunRepository({self._location!r})"

    # -- lifecycle ---------------------------------------------------------------

    def open(self) -> None:
        if self._opened:
            return
        with self._errors("opening"):
            conn = self._connect()
            try:
                if self._read_only:
                    self._check_version(conn, migrate=False)
                else:
                    with conn.transaction():
                        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                        self._check_version(conn, migrate=True)
            except BaseException:
                conn.close()
                raise
        self._conn = conn
        self._opened = True

    def close(self) -> None:
        self._claims.clear()
        self._lost_claims.clear()
        self._opened = False
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()  # ends the session: its advisory locks (the claims) go with it

    def _connect(self) -> Any:
        import psycopg  # an optional dependency: imported only when PostgreSQL is used

        settings = []
        if self._statement_timeout is not None:
            settings.append(f"-c statement_timeout={int(self._statement_timeout * 1000)}")
        if self._idle_in_transaction_timeout is not None:
            idle_ms = int(self._idle_in_transaction_timeout * 1000)
            settings.append(f"-c idle_in_transaction_session_timeout={idle_ms}")
        options: dict[str, Any] = {"options": " ".join(settings)} if settings else {}
        conn = psycopg.connect(
            self._url, autocommit=True, connect_timeout=max(1, round(self._connect_timeout)),
            application_name="trio-batch-llm", **options,
        )
        if self._read_only:
            conn.execute("SET default_transaction_read_only = on")
        return conn

    def _check_version(self, conn: Any, *, migrate: bool) -> None:
        if migrate:
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE} (component TEXT PRIMARY KEY,"
                " version INTEGER NOT NULL, updated_at TEXT NOT NULL)"
            )
        elif conn.execute("SELECT to_regclass(%s)", (SCHEMA_TABLE,)).fetchone()[0] is None:
            raise ArtifactStoreError(f"{self._location}: no runs in this database (no {SCHEMA_TABLE} table)")
        row = conn.execute(f"SELECT version FROM {SCHEMA_TABLE} WHERE component = 'runs'").fetchone()
        stored = 0 if row is None else int(row[0])
        if stored > SCHEMA_VERSION:
            raise ArtifactStoreError(
                f"{self._location}: runs schema version {stored} is newer than this library reads "
                f"({SCHEMA_VERSION}); upgrade trio-batch-llm"
            )
        if not migrate:
            if stored == 0:
                raise ArtifactStoreError(f"{self._location}: no runs in this database")
            return
        for version, statements in MIGRATIONS:
            if version > stored:
                for statement in statements:
                    conn.execute(statement)
        if stored != SCHEMA_VERSION:
            conn.execute(
                f"INSERT INTO {SCHEMA_TABLE} (component, version, updated_at) VALUES ('runs', %s, %s)"
                " ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version,"
                " updated_at = EXCLUDED.updated_at",
                (SCHEMA_VERSION, utc_now()),
            )

    # -- helpers -----------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        if self._secret:
            text = text.replace(self._secret, REDACTED)
        return text

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """psycopg and OS errors as ArtifactStoreError naming the database (never its password)."""
        import psycopg

        try:
            yield
        except (psycopg.Error, OSError) as exc:
            problem = self._scrub(str(exc).strip()) or type(exc).__name__
            kind = DatabaseUnavailableError if unreachable(exc) else ArtifactStoreError
            # The original goes unchained: its text (and its connection info) may hold the password.
            raise kind(f"{self._location}: {doing} failed: {problem}") from None

    def _require(self) -> Any:
        """The open connection; reconnects (taking the held claims again) after a lost one."""
        if not self._opened:
            raise ArtifactStoreError(f"{self._location}: the run repository is not open")
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                conn.close()
            self._conn = None
            conn = self._connect()
            self._conn = conn
            for run_id in sorted(self._claims):
                if not self._lock(conn, run_id):
                    self._claims.discard(run_id)
                    self._lost_claims.add(run_id)
                    raise ClaimLostError(
                        f"{self._location}: the connection was lost and another process has taken "
                        f"the claim on run {run_id!r} meanwhile"
                    )
        return conn

    @contextlib.contextmanager
    def _read(self, doing: str) -> Iterator[Any]:
        with self._errors(doing):
            yield self._require()

    @contextlib.contextmanager
    def _write(self, doing: str) -> Iterator[Any]:
        if self._read_only:
            raise RunStateError(f"{self._location}: opened read-only; cannot {doing}")
        with self._errors(doing):
            conn = self._require()
            with conn.transaction():
                yield conn

    # -- the writes PostgreSQL spells its own way (:mod:`._postgres_writes`) ---------

    def _insert_items(self, conn: Any, run_id: str, items: Sequence[NewItem],
                      checkpoint: SourceCheckpoint) -> None:
        writes.insert_items(conn, self._location, run_id, items, checkpoint)

    def _mark_done(self, conn: Any, run_id: str, results: Sequence[NewResult], *,
                   submission: str | None, lease: int | None) -> int:
        return writes.mark_done(conn, self._location, run_id, results, submission=submission, lease=lease)

    def _reserve(self, conn: Any, run_id: str, submission: NewSubmission, capacity_limit: int | None) -> bool:
        return writes.reserve(conn, self._location, run_id, submission, capacity_limit)

    def ingest(self, run_id: str, items: Sequence[NewItem], checkpoint: SourceCheckpoint) -> RunSnapshot:
        # One ingester at a time: a claim lost while the connection was down may be another
        # process's now, and two ingesters would read the source twice from one checkpoint.
        if run_id in self._lost_claims:
            raise ClaimLostError(f"{self._location}: the claim on run {run_id!r} was lost to another "
                                 "process while the connection was down; that one ingests now")
        return super().ingest(run_id, items, checkpoint)

    # -- claims ------------------------------------------------------------------

    @staticmethod
    def _lock(conn: Any, run_id: str) -> bool:
        # Session-level (not _xact_): it outlives our short transactions and dies with the
        # connection, so a killed driver's claim is free at once; "try": a claim is never waited for.
        return bool(conn.execute("SELECT pg_try_advisory_lock(%s)", (_claim_key(run_id),)).fetchone()[0])

    def try_claim(self, run_id: str) -> bool:
        if run_id in self._claims:
            return False  # held by this object already (another driver in this process)
        with self._read(f"claiming run {run_id!r}") as conn:
            if not self._lock(conn, run_id):
                return False
        self._claims.add(run_id)
        self._lost_claims.discard(run_id)
        return True

    def release(self, run_id: str) -> None:
        self._lost_claims.discard(run_id)  # a segment ends: the next one claims (or not) afresh
        if run_id not in self._claims:
            return
        self._claims.discard(run_id)
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            return  # the session is gone, and its lock with it
        with self._errors(f"releasing run {run_id!r}"):
            conn.execute("SELECT pg_advisory_unlock(%s)", (_claim_key(run_id),))

