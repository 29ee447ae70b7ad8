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

**Reads share calls.** A worker-thread hop costs far more than a read by key, so
gets made at once are queued and read in one call (one read snapshot): a warm
run's thousands of concurrent lookups take a few calls, not one each.

**Claims** (cross-process single flight) are rows of the ``claims`` table on the
wall clock: a claim is taken when absent, held by the same holder, or expired,
in one transaction, so two processes never both get it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final, TypeVar, final

import anyio

from .._artifacts._sqlite_file import busy_message, is_busy, retry_busy, set_busy_timeout
from .._artifacts._worker_gate import WorkerGate
from .._values._errors import ArtifactStoreError
from .._values._response_cache import SqliteResponseCache
from ._answer_json import answer_from_json, answer_to_json
from ._connection import CacheConnection
from ._records import CachedAnswer, CacheKey
from ._sqlite_schema import (
    classify_cache_file,
    create_private_file,
    default_cache_path,
    initialise_schema,
    warn_if_shared,
)

__all__ = ["SqliteCacheConnection"]

T = TypeVar("T")

BUSY_TIMEOUT: Final = 30.0
"""Seconds a call waits for another process's write lock before it fails (naming the file)."""
_TOUCH_BATCH: Final = 64
_EVICT_TO: Final = 0.9
_MAX_EVICT_ROUNDS: Final = 50


@final
class _Read:
    """One queued get: its answer (or error) is set in the worker thread, then ``done`` on the loop."""

    __slots__ = ("answer", "answered", "digest", "done", "error", "lead")

    def __init__(self, digest: str) -> None:
        self.digest = digest
        self.done = anyio.Event()
        self.answer: CachedAnswer | None = None
        self.error: ArtifactStoreError | None = None
        self.lead = False  # woken to lead the next call, not with an answer
        self.answered = False  # set in the worker thread with answer or error

    def outcome(self) -> CachedAnswer | None:
        if self.error is not None:
            raise ArtifactStoreError(str(self.error)) from self.error  # each caller its own exception
        return self.answer


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
        self._reads: list[_Read] = []  # gets queued for the next worker-thread call
        self._reading = False  # a get leads (its call is running, or the lead is being handed on)

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

    # -- the protocol ---------------------------------------------------------------------

    async def get(self, key: CacheKey) -> CachedAnswer | None:
        """Concurrent gets share one worker-thread call: the first leads and reads every get queued
        by then (a thread hop costs far more than a read), then hands the lead to the next one queued."""
        read = _Read(key.digest)
        self._reads.append(read)
        if self._reading:
            try:
                await read.done.wait()
            except BaseException:
                self._withdraw(read)
                raise
            if not read.lead:
                return read.outcome()
        self._reading = True
        batch, self._reads = self._reads, []
        try:
            await self._gate.run(self._get_many, batch)  # started, it finishes: the answers land in batch
        finally:
            # Cancelled before the call started: the others' reads go back to the queue's head.
            self._reads = [other for other in batch if other is not read and not other.answered] + self._reads
            for other in batch:
                if other is not read and other.answered:
                    other.done.set()
            self._pass_lead()
        return read.outcome()

    def _withdraw(self, read: _Read) -> None:
        """A queued get was cancelled: it leaves the queue, and hands on the lead if it had it."""
        if any(queued is read for queued in self._reads):
            self._reads = [queued for queued in self._reads if queued is not read]
        if read.lead:
            self._pass_lead()

    def _pass_lead(self) -> None:
        if self._reads:
            following = self._reads[0]
            following.lead = True
            following.done.set()
        else:
            self._reading = False

    async def put(self, key: CacheKey, answer: CachedAnswer) -> None:
        text = answer_to_json(answer)
        request = (json.dumps(dict(key.request), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                              default=str) if self._config.store_request else None)
        await self._run("writing an entry", self._put, key.digest, text, request, answer.created_at)

    async def claim(self, key: CacheKey, holder: str, seconds: float) -> bool:
        return await self._run("claiming a key", self._claim, key.digest, holder, seconds)

    async def release(self, key: CacheKey, holder: str) -> None:
        await self._run("releasing a claim", self._release, key.digest, holder)

    async def aclose(self) -> None:
        """Write the pending hit times, fold the WAL if no one else uses the file, close. Idempotent."""
        if self._conn is None:
            await self._gate.run(lambda: None)  # checkpoints like every other path
            return
        await self._gate.run(self._close)

    # -- in the worker thread -------------------------------------------------------------

    async def _run(self, doing: str, fn: Callable[..., T], *args: object) -> T:
        return await self._gate.run(self._errors, doing, functools.partial(fn, *args))

    def _errors(self, doing: str, call: Callable[[], T]) -> T:
        if self._conn is None:
            raise ArtifactStoreError(f"{self._path}: {doing} failed: the cache connection is closed")
        try:
            return call()
        except (sqlite3.Error, OSError) as exc:
            problem = busy_message(BUSY_TIMEOUT) if is_busy(exc) else str(exc)
            raise ArtifactStoreError(f"{self._path}: {doing} failed: {problem}") from exc

    @contextmanager
    def _transaction(self, conn: sqlite3.Connection | None = None) -> Iterator[sqlite3.Connection]:
        conn = conn if conn is not None else self._conn
        assert conn is not None
        retry_busy(conn, BUSY_TIMEOUT, lambda: conn.execute("BEGIN IMMEDIATE"))
        try:
            yield conn
            conn.execute("COMMIT")
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")

    def _get_many(self, batch: list[_Read]) -> None:
        """Every read of ``batch`` in one snapshot; then, in one write, stale entries deleted and hit
        times written (when enough are pending). Errors land on the reads they concern."""
        try:
            stale = self._errors("reading entries", functools.partial(self._read_all, batch))
        except ArtifactStoreError as exc:
            for read in batch:
                read.answer, read.error, read.answered = None, exc, True
            return
        for read in batch:
            read.answered = True
        if stale or len(self._touched) >= _TOUCH_BATCH:
            with contextlib.suppress(ArtifactStoreError):  # best effort: the reads are answered already
                self._errors("updating entries", functools.partial(self._tidy, stale))

    def _read_all(self, batch: list[_Read]) -> list[tuple[str, float]]:
        conn = self._conn
        assert conn is not None
        now = self._clock()
        ttl = self._config.ttl
        stale: list[tuple[str, float]] = []
        conn.execute("BEGIN")  # deferred: one read snapshot for the whole batch
        try:
            for read in batch:
                row = conn.execute("SELECT answer, created_at FROM entries WHERE digest = ?",
                                   (read.digest,)).fetchone()
                if row is None:
                    continue
                if ttl is not None and row[1] + ttl <= now:
                    stale.append((read.digest, row[1]))  # lazily deleted: only those found stale
                    continue
                # An answer this version cannot read is a miss, overwritten by the call's answer.
                read.answer = answer_from_json(row[0])
                if read.answer is not None:
                    self._touched[read.digest] = now
        finally:
            conn.execute("COMMIT")
        return stale

    def _tidy(self, stale: list[tuple[str, float]]) -> None:
        with self._transaction() as tx:
            tx.executemany("DELETE FROM entries WHERE digest = ? AND created_at = ?", stale)
            self._write_touches(tx)

    def _put(self, digest: str, text: str, request: str | None, created_at: float) -> None:
        now = self._clock()
        written = created_at if created_at > 0 else now
        with self._transaction() as tx:
            tx.execute(
                "INSERT INTO entries (digest, answer, request, created_at, last_used) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (digest) DO UPDATE SET answer = excluded.answer, request = excluded.request, "
                "created_at = excluded.created_at, last_used = excluded.last_used",
                (digest, text, request, written, now))
            self._write_touches(tx)
            self._evict(tx, now)

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

    def _claim(self, digest: str, holder: str, seconds: float) -> bool:
        with self._transaction() as tx:
            now = self._clock()
            row = tx.execute("SELECT holder, until FROM claims WHERE digest = ?", (digest,)).fetchone()
            if row is not None and row[0] != holder and row[1] > now:
                return False
            tx.execute("INSERT OR REPLACE INTO claims (digest, holder, until) VALUES (?, ?, ?)",
                       (digest, holder, now + seconds))
            return True

    def _release(self, digest: str, holder: str) -> None:
        with self._transaction() as tx:
            tx.execute("DELETE FROM claims WHERE digest = ? AND holder = ?", (digest, holder))

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            if self._touched:
                with self._transaction(conn) as tx:
                    self._write_touches(tx)
            # Without waiting: another process's connection keeps the WAL; the last one folds it.
            set_busy_timeout(conn, 0)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error:
            pass  # best effort: every commit is durable already, and the next open replays the WAL
        finally:
            conn.close()


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
        retry_busy(conn, BUSY_TIMEOUT, lambda: conn.execute("BEGIN IMMEDIATE"))
        try:
            initialise_schema(conn, path)
            conn.execute("COMMIT")
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
    except ArtifactStoreError:
        conn.close()
        raise
    except (sqlite3.Error, OSError) as exc:
        conn.close()
        problem = busy_message(BUSY_TIMEOUT) if is_busy(exc) else str(exc)
        raise ArtifactStoreError(f"{path}: opening the response cache failed: {problem}") from exc
    except BaseException:
        conn.close()
        raise
    return conn
