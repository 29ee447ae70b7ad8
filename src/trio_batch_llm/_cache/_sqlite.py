"""``SqliteCacheConnection``: the response cache in one SQLite file, shared by the processes of one machine.

Blocking ``sqlite3`` behind a :class:`WorkerGate`: every call runs in a worker
thread, one at a time, and a call that has started finishes there (a transaction
is committed or rolled back, never abandoned half way). The file is created,
checked and initialised by :mod:`._sqlite_schema` (``0600``, provably ours).

**Durability.** WAL mode, ``synchronous=NORMAL``: a commit survives a killed
process (not a power cut, which may lose the last commits, never corrupt the
file). Every write is one ``BEGIN IMMEDIATE`` … ``COMMIT``, so a process killed
in the middle of one leaves the old entry or the new one, never half of one.

**TTL.** An entry older than ``ttl`` (by when it was written) is a miss, and
is deleted when it is read so; the eviction pass deletes the rest.

**Size bound (approximate).** After each write the file's pages in use
(``page_count - freelist_count``, times the page size: entries, their indexes,
the few pages of the schema) are compared with ``max_bytes``; above it, the
least recently used entries are deleted in batches until use is under 90 % of
it. Deleted pages are reused by later writes, so the file stays near
``max_bytes``; it may pass it by the last entry written, and the ``-wal`` file
(up to SQLite's 1,000-page auto-checkpoint, about 4 MB) comes on top.
*Recently used*: a hit's time is kept in memory and written with the next write
(or every 64 hits, or on close), so that hits do not each take the write lock.

**Calls made at once share a worker-thread call** (:mod:`._batched`): a thread hop
costs far more than a read or write by key, so gets, puts, claims and releases
queued while a call runs go into the next one, in order, in one transaction (a
read snapshot when they only read). Each put is still all or nothing: a batch is.

**Claims** (cross-process single flight) are rows of the ``claims`` table on the
wall clock: a claim is taken when absent, held by the same holder, or expired,
in one transaction, so two processes never both get it.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, final

from .._artifacts._sqlite_file import problem_of, retry_busy, set_busy_timeout, transaction
from .._backends._worker_gate import WorkerGate
from .._values._errors import ArtifactStoreError
from .._values._response_cache import SqliteResponseCache
from ._answer_json import answer_from_json, answer_to_json
from ._batched import Batched, Operation
from ._connection import CacheConnection, CacheStats
from ._records import CachedAnswer, CacheKey
from ._sqlite_schema import (
    classify_cache_file,
    create_private_file,
    default_cache_path,
    initialise_schema,
    warn_if_shared,
)

__all__ = ["SqliteCacheConnection"]


BUSY_TIMEOUT: Final = 30.0
"""Seconds a call waits for another process's write lock before it fails (naming the file)."""
_TOUCH_BATCH: Final = 64
_EVICT_TO: Final = 0.9
_MAX_EVICT_ROUNDS: Final = 50


@final
class SqliteCacheConnection(CacheConnection):
    """One owner's connection to a SQLite response cache; see the module docstring."""

    def __init__(self, config: SqliteResponseCache, path: Path, conn: sqlite3.Connection,
                 gate: WorkerGate, clock: Callable[[], float]) -> None:
        self._config = config
        self._path = path
        self._conn: sqlite3.Connection | None = conn
        self._gate = gate
        self._clock = clock
        self._touched: dict[str, float] = {}  # digest -> when a hit last used it; only in the thread
        self._batched = Batched(gate, self._execute)

    @classmethod
    async def open(cls, config: SqliteResponseCache, *, clock: Callable[[], float] = time.time
                   ) -> SqliteCacheConnection:
        """Open (creating it ``0600`` if missing) the file ``config`` names; refuse one not ours.

        ``clock``: Unix seconds, for TTLs and claims (tests move it).
        """
        path = Path(config.path) if config.path is not None else default_cache_path()
        gate = WorkerGate()
        conn = await gate.run(_connect, path, default_location=config.path is None)
        return cls(config, path, conn, gate, clock)

    @property
    def path(self) -> Path:
        return self._path

    # -- the protocol: every call joins the next batch (see _batched) -----------------------

    async def get(self, key: CacheKey) -> CachedAnswer | None:
        found: CachedAnswer | None = await self._batched.submit("get", key.digest)
        return found

    async def put(self, key: CacheKey, answer: CachedAnswer) -> None:
        text = answer_to_json(answer)
        request = (json.dumps(dict(key.request), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                              default=str) if self._config.store_request else None)
        await self._batched.submit("put", key.digest, text, request, answer.created_at)

    async def claim(self, key: CacheKey, holder: str, seconds: float) -> bool:
        taken: bool = await self._batched.submit("claim", key.digest, holder, seconds)
        return taken

    async def release(self, key: CacheKey, holder: str) -> None:
        await self._batched.submit("release", key.digest, holder)

    async def stats(self) -> CacheStats:
        """Entries (expired ones not yet deleted included), the file's pages in use in bytes, and
        when the oldest and newest entries were written."""
        found: CacheStats = await self._batched.submit("stats")
        return found

    async def clear(self, *, older_than: float | None = None) -> int:
        """Delete every entry, or those written more than ``older_than`` seconds ago (claims stay)."""
        deleted: int = await self._batched.submit("clear", older_than)
        return deleted

    async def aclose(self) -> None:
        """Write the pending hit times, fold the WAL if no one else uses the file, close. Idempotent."""
        await self._gate.run(self._close)

    # -- in the worker thread -------------------------------------------------------------

    def _execute(self, batch: list[Operation]) -> None:
        """``batch`` in one transaction (a read snapshot when it only reads), in order; an error
        answers every operation of it. Then, for reads only, stale entries and hit times tidied."""
        conn = self._conn
        stale: list[tuple[str, float]] = []
        try:
            if conn is None:
                raise ArtifactStoreError(f"{self._path}: the cache connection is closed")
            writes = any(op.kind not in _READS for op in batch)
            with transaction(conn, BUSY_TIMEOUT, immediate=writes):
                now = self._clock()
                for op in batch:
                    op.result = getattr(self, "_" + op.kind)(conn, now, stale, *op.args)
                if writes:
                    self._delete_stale(conn, stale)
                    self._write_touches(conn)
                    if any(op.kind == "put" for op in batch):
                        self._evict(conn, now)
        except (sqlite3.Error, OSError, ArtifactStoreError) as exc:
            if isinstance(exc, ArtifactStoreError):
                error = exc
            else:
                problem = problem_of(exc, BUSY_TIMEOUT)
                error = ArtifactStoreError(f"{self._path}: {_DOING[batch[0].kind]} failed: {problem}")
                error.__cause__ = exc
            for op in batch:
                op.result, op.error, op.answered = None, error, True
            return
        for op in batch:
            op.answered = True
        if conn is not None and not writes and (stale or len(self._touched) >= _TOUCH_BATCH):
            try:  # best effort: the reads are answered already
                with transaction(conn, BUSY_TIMEOUT):
                    self._delete_stale(conn, stale)
                    self._write_touches(conn)
            except sqlite3.Error:
                pass

    def _get(self, conn: sqlite3.Connection, now: float, stale: list[tuple[str, float]],
             digest: str) -> CachedAnswer | None:
        row = conn.execute("SELECT answer, created_at FROM entries WHERE digest = ?", (digest,)).fetchone()
        if row is None:
            return None
        ttl = self._config.ttl
        if ttl is not None and row[1] + ttl <= now:
            stale.append((digest, row[1]))  # lazily deleted: only those found stale
            return None
        # An answer this version cannot read is a miss, overwritten by the call's answer.
        answer = answer_from_json(row[0])
        if answer is not None:
            self._touched[digest] = now
        return answer

    def _put(self, conn: sqlite3.Connection, now: float, stale: list[tuple[str, float]],
             digest: str, text: str, request: str | None, created_at: float) -> None:
        conn.execute(
            "INSERT INTO entries (digest, answer, request, created_at, last_used) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (digest) DO UPDATE SET answer = excluded.answer, request = excluded.request, "
            "created_at = excluded.created_at, last_used = excluded.last_used",
            (digest, text, request, created_at if created_at > 0 else now, now))
        self._touched.pop(digest, None)

    def _claim(self, conn: sqlite3.Connection, now: float, stale: list[tuple[str, float]],
               digest: str, holder: str, seconds: float) -> bool:
        row = conn.execute("SELECT holder, until FROM claims WHERE digest = ?", (digest,)).fetchone()
        if row is not None and row[0] != holder and row[1] > now:
            return False
        conn.execute("INSERT OR REPLACE INTO claims (digest, holder, until) VALUES (?, ?, ?)",
                     (digest, holder, now + seconds))
        return True

    def _release(self, conn: sqlite3.Connection, now: float, stale: list[tuple[str, float]],
                 digest: str, holder: str) -> None:
        conn.execute("DELETE FROM claims WHERE digest = ? AND holder = ?", (digest, holder))

    def _stats(self, conn: sqlite3.Connection, now: float, stale: list[tuple[str, float]]) -> CacheStats:
        entries, oldest, newest = conn.execute(
            "SELECT count(*), min(created_at), max(created_at) FROM entries").fetchone()
        return CacheStats(entries, self._used_bytes(conn), oldest, newest)

    def _clear(self, conn: sqlite3.Connection, now: float, stale: list[tuple[str, float]],
               older_than: float | None) -> int:
        cursor = (conn.execute("DELETE FROM entries") if older_than is None else
                  conn.execute("DELETE FROM entries WHERE created_at < ?", (now - older_than,)))
        return int(cursor.rowcount)

    def _delete_stale(self, conn: sqlite3.Connection, stale: list[tuple[str, float]]) -> None:
        conn.executemany("DELETE FROM entries WHERE digest = ? AND created_at = ?", stale)

    def _write_touches(self, conn: sqlite3.Connection) -> None:
        if self._touched:
            conn.executemany("UPDATE entries SET last_used = ?2 WHERE digest = ?1 AND last_used < ?2",
                             list(self._touched.items()))
            self._touched.clear()

    def _used_bytes(self, conn: sqlite3.Connection) -> int:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        return int((pages - free) * conn.execute("PRAGMA page_size").fetchone()[0])

    def _evict(self, conn: sqlite3.Connection, now: float) -> None:
        """In the write's transaction: past ``max_bytes``, drop expired then least recently used entries."""
        bound = self._config.max_bytes
        if bound is None or self._used_bytes(conn) <= bound:
            return
        ttl = self._config.ttl
        if ttl is not None:
            conn.execute("DELETE FROM entries WHERE created_at <= ?", (now - ttl,))
        conn.execute("DELETE FROM claims WHERE until <= ?", (now,))
        target = bound * _EVICT_TO
        rows = conn.execute("SELECT count(*) FROM entries").fetchone()[0]
        batch = max(16, rows // 20)
        for _ in range(_MAX_EVICT_ROUNDS):
            if self._used_bytes(conn) <= target:
                return
            deleted = conn.execute(
                "DELETE FROM entries WHERE digest IN (SELECT digest FROM entries ORDER BY last_used LIMIT ?)",
                (batch,)).rowcount
            if deleted <= 0:
                return

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            if self._touched:
                with transaction(conn, BUSY_TIMEOUT):
                    self._write_touches(conn)
            # Without waiting: another process's connection keeps the WAL; the last one folds it.
            set_busy_timeout(conn, 0)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error:
            pass  # best effort: every commit is durable already, and the next open replays the WAL
        finally:
            conn.close()


_DOING: Final = {"get": "reading an entry", "put": "writing an entry", "claim": "claiming a key",
                 "release": "releasing a claim", "stats": "counting entries", "clear": "clearing entries"}
_READS: Final = frozenset({"get", "stats"})


def _connect(path: Path, *, default_location: bool) -> sqlite3.Connection:
    """In the worker thread: the file created private if missing, checked ours, WAL mode, the schema."""
    try:
        created = create_private_file(path, default_location=default_location)
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except (sqlite3.Error, OSError) as exc:
        raise ArtifactStoreError(f"{path}: opening the response cache failed: {exc}") from exc
    try:
        set_busy_timeout(conn, BUSY_TIMEOUT)
        classify_cache_file(conn, path)  # before WAL mode, which would change a foreign file's header
        if not created:
            warn_if_shared(path)
        mode = retry_busy(conn, BUSY_TIMEOUT, lambda: conn.execute("PRAGMA journal_mode=WAL").fetchone()[0])
        if str(mode).lower() != "wal":
            raise ArtifactStoreError(f"{path}: SQLite refused WAL mode (journal_mode={mode})")
        conn.execute("PRAGMA synchronous=NORMAL")
        with transaction(conn, BUSY_TIMEOUT):
            initialise_schema(conn, path)
    except ArtifactStoreError:
        conn.close()
        raise
    except (sqlite3.Error, OSError) as exc:
        conn.close()
        problem = problem_of(exc, BUSY_TIMEOUT)
        raise ArtifactStoreError(f"{path}: opening the response cache failed: {problem}") from exc
    except BaseException:
        conn.close()
        raise
    return conn
