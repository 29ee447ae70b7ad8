"""``PostgresCacheConnection``: the response cache in a PostgreSQL table (psycopg 3, sync, off the loop).

Like the PostgreSQL run repository (``_runs/repository/_postgres.py``, whose URL,
password-redaction and outage helpers this reuses), the sessions are psycopg's
synchronous connections, each used from a worker thread through its own
:class:`WorkerGate` (psycopg's async API is asyncio-only): one call at a time per
session, up to ``SESSIONS`` sessions per owner's connection, and a call that has
started finishes in its thread, so a statement is committed or not, never cut in half.

**Tables.** ``config.table`` holds one row per entry: ``digest`` (primary key),
``answer`` (JSON: output, usage, metadata, model, created_at), ``request`` (JSON, or
NULL when ``store_request=False``: then only the digest says what was asked),
``created_at`` and ``last_used`` (Unix seconds; ``last_used`` is refreshed by a hit
at most once a minute, so that hits do not each rewrite a row). ``<table>_claims``
holds the single-flight claims: ``digest``, ``holder`` and ``expires_at`` on the
server's clock, so processes on machines whose clocks differ agree on when a claim
lapses. The tables are created when missing, under the advisory lock the runs
schema uses, and recorded in ``trio_batch_llm_schema`` (component
``response_cache:<table>``, version 1). A table of that name without that record is
someone else's: it is refused, never altered.

**Writes** are one statement each (an upsert), so a writer killed mid-write leaves
the old entry or the new one, never half of one. **TTL**: an entry older than
``ttl`` (by its ``created_at``) is a miss, and is deleted when it is read.

**Errors** name the cache by its URL without the password (and scrub the password
from the server's words): :class:`DatabaseUnavailableError` when the server cannot
be reached (refused, reset, restarting), :class:`ArtifactStoreError` otherwise (a
wrong password, a missing database, a table that is not ours). A call that finds its
connection lost (a server restart) reconnects and is tried once more: every call is
idempotent (a read, an upsert, a claim that its own holder may renew, a release).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any, Final, TypeVar, final

import anyio
import anyio.lowlevel

from .._backends._worker_gate import WorkerGate
from .._core._cleanup import CloseOnce
from .._values._conninfo import display, secret_of
from .._values._errors import ArtifactStoreError, ConfigurationError, DatabaseUnavailableError
from .._values._postgres import DEFAULT_CONNECT_TIMEOUT, MIGRATION_LOCK, SCHEMA_TABLE, unreachable
from .._values._response_cache import PostgresResponseCache
from .._values._urls import REDACTED
from ._answer_json import answer_from_json, answer_to_json
from ._connection import CacheConnection
from ._records import CachedAnswer, CacheKey

__all__ = ["CACHE_SCHEMA_VERSION", "SESSIONS", "PostgresCacheConnection"]

CACHE_SCHEMA_VERSION: Final = 1
_COMPONENT: Final = "response_cache:"
# A plain (optionally schema-qualified) identifier, short enough for "<table>_claims" (63 bytes).
_TABLE_NAME: Final = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_]{0,62}\.)?[A-Za-z_][A-Za-z0-9_]{0,55}")
_LAST_USED_GRAIN: Final = 60.0  # seconds: a hit rewrites last_used only when it is older than this
_STATEMENT_TIMEOUT_MS: Final = 30_000
_IDLE_IN_TRANSACTION_MS: Final = 5_000
SESSIONS: Final = 4
"""Database sessions one connection uses at most (each a worker thread while it works)."""

R = TypeVar("R")


def check_table(table: object) -> str:
    """``table`` if it is a name the cache can use as is (no quoting), else a ``ConfigurationError``."""
    if not isinstance(table, str) or _TABLE_NAME.fullmatch(table) is None:
        raise ConfigurationError("table", table, "must be a plain SQL name (letters, digits, _; at most 56 "
                                                 "characters, optionally schema.name)")
    return table


@final
class _Store:
    """The blocking half: one psycopg connection, used by one worker thread at a time (the gate's)."""

    def __init__(self, config: PostgresResponseCache, clock: Callable[[], float],
                 connect_timeout: float) -> None:
        self._url = config.url
        self._secret = secret_of(config.url)
        self.table = check_table(config.table)
        self.claims = f"{self.table}_claims"
        self.ttl = config.ttl
        self.location = f"the PostgreSQL response cache {display(config.url)} (table {self.table})"
        self._clock = clock
        self._connect_timeout = connect_timeout
        self._conn: Any = None

    # -- connection ------------------------------------------------------------------

    def _connect(self) -> Any:
        import psycopg  # an optional dependency: imported only when PostgreSQL is used

        options = (f"-c statement_timeout={_STATEMENT_TIMEOUT_MS}"
                   f" -c idle_in_transaction_session_timeout={_IDLE_IN_TRANSACTION_MS}")
        return psycopg.connect(self._url, autocommit=True,
                               connect_timeout=max(1, round(self._connect_timeout)),
                               application_name="trio-batch-llm cache", options=options)

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection may itself complain
                conn.close()

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """psycopg and OS errors as the library's, naming the cache (never its password)."""
        import psycopg

        try:
            yield
        except (psycopg.Error, OSError) as exc:
            problem = str(exc).strip() or type(exc).__name__
            if self._secret:
                problem = problem.replace(self._secret, REDACTED)
            kind = DatabaseUnavailableError if unreachable(exc) else ArtifactStoreError
            # Unchained: the original's text (and its connection info) may hold the password.
            raise kind(f"{self.location}: {doing} failed: {problem}") from None

    def _call(self, doing: str, fn: Callable[[Any], R]) -> R:
        """``fn(connection)``; a connection found lost is replaced and ``fn`` tried once more."""
        import psycopg

        with self._errors(doing):
            for attempt in (1, 2):
                fresh = self._conn is None or self._conn.closed or self._conn.broken
                if fresh:
                    self._drop()
                    self._conn = self._connect()
                try:
                    return fn(self._conn)
                except (psycopg.Error, OSError) as exc:
                    if attempt == 2 or fresh or not unreachable(exc):
                        raise
                    self._drop()  # lost since its last use (a restart, a cut): reconnect once
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    # -- lifecycle -------------------------------------------------------------------

    def open(self) -> None:
        with self._errors("opening"):
            self._conn = self._connect()
            try:
                with self._conn.transaction():
                    self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                    self._check_schema(self._conn)
            except BaseException:
                self._drop()
                raise

    def _check_schema(self, conn: Any) -> None:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE} (component TEXT PRIMARY KEY,"
                     " version INTEGER NOT NULL, updated_at TEXT NOT NULL)")
        component = _COMPONENT + self.table.lower()
        row = conn.execute(f"SELECT version FROM {SCHEMA_TABLE} WHERE component = %s",
                           (component,)).fetchone()
        if row is None:
            taken = [name for name in (self.table, self.claims)
                     if conn.execute("SELECT to_regclass(%s)", (name,)).fetchone()[0] is not None]
            if taken:
                raise ArtifactStoreError(
                    f"{self.location}: a table named {taken[0]} exists and is not a trio-batch-llm response "
                    f"cache (no {component!r} row in {SCHEMA_TABLE}); it is left as it is: name another "
                    "table (PostgresResponseCache(..., table=...))")
        elif int(row[0]) > CACHE_SCHEMA_VERSION:
            raise ArtifactStoreError(
                f"{self.location}: the cache's schema version {row[0]} is newer than this library reads "
                f"({CACHE_SCHEMA_VERSION}); upgrade trio-batch-llm")
        conn.execute(f"CREATE TABLE IF NOT EXISTS {self.table} (digest TEXT PRIMARY KEY,"
                     " answer JSON NOT NULL, request JSON, created_at DOUBLE PRECISION NOT NULL,"
                     " last_used DOUBLE PRECISION NOT NULL)")
        conn.execute(f"CREATE TABLE IF NOT EXISTS {self.claims} (digest TEXT PRIMARY KEY,"
                     " holder TEXT NOT NULL, expires_at TIMESTAMPTZ NOT NULL)")
        if row is None:
            conn.execute(f"INSERT INTO {SCHEMA_TABLE} (component, version, updated_at) VALUES (%s, %s, %s)"
                         " ON CONFLICT (component) DO NOTHING",
                         (component, CACHE_SCHEMA_VERSION,
                          time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())))
        # Claims of holders that died long ago: nobody asked for their keys again.
        conn.execute(f"DELETE FROM {self.claims} WHERE expires_at < clock_timestamp() - interval '1 hour'")

    def close(self) -> None:
        self._drop()

    # -- entries and claims ----------------------------------------------------------

    def get(self, digest: str) -> CachedAnswer | None:
        def read(conn: Any) -> CachedAnswer | None:
            row = conn.execute(f"SELECT answer, created_at, last_used FROM {self.table} WHERE digest = %s",
                               (digest,)).fetchone()
            if row is None:
                return None
            answer, created_at, last_used = row
            now = self._clock()
            if self.ttl is not None and created_at + self.ttl <= now:
                # Only this entry as read: one written meanwhile by another process stays.
                conn.execute(f"DELETE FROM {self.table} WHERE digest = %s AND created_at = %s",
                             (digest, created_at))
                return None
            if last_used < now - _LAST_USED_GRAIN:
                conn.execute(f"UPDATE {self.table} SET last_used = %s WHERE digest = %s", (now, digest))
            return answer_from_json(answer)

        return self._call("reading an entry", read)

    def put(self, digest: str, answer: CachedAnswer, request: str | None) -> None:
        now = self._clock()
        if not answer.created_at:
            answer = dataclasses.replace(answer, created_at=now)
        text = answer_to_json(answer)

        def write(conn: Any) -> None:
            conn.execute(
                f"INSERT INTO {self.table} (digest, answer, request, created_at, last_used)"
                " VALUES (%s, %s::json, %s::json, %s, %s) ON CONFLICT (digest) DO UPDATE SET"
                " answer = EXCLUDED.answer, request = EXCLUDED.request, created_at = EXCLUDED.created_at,"
                " last_used = EXCLUDED.last_used",
                (digest, text, request, answer.created_at, now),
            )

        self._call("writing an entry", write)

    def claim(self, digest: str, holder: str, seconds: float) -> bool:
        def take(conn: Any) -> bool:
            row = conn.execute(
                f"INSERT INTO {self.claims} AS c (digest, holder, expires_at)"
                " VALUES (%s, %s, clock_timestamp() + make_interval(secs => %s))"
                " ON CONFLICT (digest) DO UPDATE SET holder = EXCLUDED.holder,"
                " expires_at = EXCLUDED.expires_at"
                " WHERE c.expires_at <= clock_timestamp() OR c.holder = EXCLUDED.holder RETURNING 1",
                (digest, holder, float(seconds)),
            ).fetchone()
            return row is not None

        return self._call("claiming a key", take)

    def release(self, digest: str, holder: str) -> None:
        def let_go(conn: Any) -> None:
            conn.execute(f"DELETE FROM {self.claims} WHERE digest = %s AND holder = %s", (digest, holder))

        self._call("releasing a key", let_go)


@final
class PostgresCacheConnection(CacheConnection):
    """One owner's connection to a :class:`PostgresResponseCache` (see the module docstring): up to
    ``SESSIONS`` database sessions, each in its own worker gate, so that a busy owner's calls (hundreds of
    items looking up, claiming and writing at once) do not queue behind one round trip at a time."""

    def __init__(self, stores: list[_Store], config: PostgresResponseCache) -> None:
        self._location = stores[0].location
        self._idle = [(store, WorkerGate()) for store in stores]
        self._all = list(self._idle)
        self._free = anyio.Semaphore(len(stores))
        self._config = config
        self._close_once = CloseOnce()

    def __repr__(self) -> str:
        return f"<PostgresCacheConnection {self._location}>"

    @classmethod
    async def open(cls, config: PostgresResponseCache, *, clock: Callable[[], float] = time.time,
                   connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> PostgresCacheConnection:
        """Connect, create the tables if missing (or refuse a table that is not ours); ``clock`` (Unix
        seconds) decides TTLs. Raises before any work starts if the server cannot be used. The other
        sessions connect when first needed."""
        stores = [_Store(config, clock, connect_timeout) for _ in range(SESSIONS)]
        await WorkerGate().run(stores[0].open)
        return cls(stores, config)

    async def _run(self, call: Callable[[_Store], R]) -> R:
        if self._close_once.closed:
            await anyio.lowlevel.checkpoint()
            raise ArtifactStoreError(f"{self._location}: the cache connection is closed")
        async with self._free:
            store, gate = self._idle.pop()
            try:
                return await gate.run(call, store)
            finally:
                self._idle.append((store, gate))

    async def get(self, key: CacheKey) -> CachedAnswer | None:
        return await self._run(lambda store: store.get(key.digest))

    async def put(self, key: CacheKey, answer: CachedAnswer) -> None:
        request = (json.dumps(dict(key.request), separators=(",", ":"), ensure_ascii=False, default=str)
                   if self._config.store_request else None)
        await self._run(lambda store: store.put(key.digest, answer, request))

    async def claim(self, key: CacheKey, holder: str, seconds: float) -> bool:
        return await self._run(lambda store: store.claim(key.digest, holder, seconds))

    async def release(self, key: CacheKey, holder: str) -> None:
        await self._run(lambda store: store.release(key.digest, holder))

    async def aclose(self) -> None:
        await self._close_once(self._close_sessions)

    async def _close_sessions(self) -> None:  # noqa: ASYNC910 - every session has one (the loop is never empty)
        # Bounded: each gate waits for its one call in flight (statement_timeout), then a close.
        for store, gate in self._all:
            await gate.run(store.close)
