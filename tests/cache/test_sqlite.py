"""The SQLite response-cache backend: entries, private files, foreign files refused, TTL, size, claims."""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from trio_batch_llm import ArtifactStoreError, SqliteResponseCache
from trio_batch_llm._cache._key import request_key
from trio_batch_llm._cache._open import connect_cache, open_cache
from trio_batch_llm._cache._records import CachedAnswer, CacheKey
from trio_batch_llm._cache._sqlite import SqliteCacheConnection
from trio_batch_llm._cache._sqlite_schema import default_cache_path

pytestmark = pytest.mark.anyio


class Clock:
    """Unix seconds that a test moves."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def key(i: int, text: str = "prompt") -> CacheKey:
    return request_key({"provider": "fake", "model": "m", "prompt": f"{text} {i}"})


def answer(i: int, *, created_at: float = 0.0, size: int = 0) -> CachedAnswer:
    return CachedAnswer(output=f"answer {i}" + "x" * size, usage={"input_tokens": 3, "output_tokens": i},
                        metadata={"finish_reason": "stop"}, model="m", created_at=created_at)


def modes(folder: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}


def all_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.iterdir()))


def rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        found = conn.execute(sql).fetchall()
        conn.commit()
        return found
    finally:
        conn.close()


async def test_an_entry_is_read_back_whole_by_another_connection(anyio_backend: str, tmp_path: Path) -> None:
    config = SqliteResponseCache(tmp_path / "c.sqlite3")
    async with open_cache(config) as cache:
        assert isinstance(cache, SqliteCacheConnection)
        assert await cache.get(key(1)) is None
        await cache.put(key(1), answer(1, created_at=5.0))
    async with open_cache(config) as cache:
        got = await cache.get(key(1))
    assert got == CachedAnswer(output="answer 1", usage={"input_tokens": 3, "output_tokens": 1},
                               metadata={"finish_reason": "stop"}, model="m", created_at=5.0)
    assert await anyio.to_thread.run_sync(rows, config.path, "PRAGMA integrity_check") == [("ok",)]


async def test_an_overwrite_replaces_the_entry(anyio_backend: str, tmp_path: Path) -> None:
    async with open_cache(SqliteResponseCache(tmp_path / "c.sqlite3")) as cache:
        await cache.put(key(1), answer(1))
        await cache.put(key(1), answer(2))
        got = await cache.get(key(1))
    assert got is not None and got.output == "answer 2"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes")
async def test_files_are_created_0600_whatever_the_umask(anyio_backend: str, tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    old = os.umask(0)
    try:
        cache = await connect_cache(SqliteResponseCache(path))
        try:
            await cache.put(key(1), answer(1))
            found = await anyio.to_thread.run_sync(modes, tmp_path)
        finally:
            await cache.aclose()
    finally:
        os.umask(old)
    assert found == {"c.sqlite3": 0o600, "c.sqlite3-wal": 0o600, "c.sqlite3-shm": 0o600}


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes")
async def test_a_shared_existing_file_is_warned_about_once_and_not_chmod_ed(
        anyio_backend: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / f"shared-{anyio_backend}.sqlite3"
    async with open_cache(SqliteResponseCache(path)):
        pass
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="trio_batch_llm.cache"):
        for _ in range(2):
            async with open_cache(SqliteResponseCache(path)):
                pass
    warnings = [r.getMessage() for r in caplog.records if r.name == "trio_batch_llm.cache"]
    assert len(warnings) == 1, warnings
    assert str(path) in warnings[0] and "0o644" in warnings[0] and "chmod 600" in warnings[0]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def _foreign_sqlite(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.execute("INSERT INTO notes VALUES ('mine')")
    conn.commit()
    conn.close()


def _artifact_like(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA application_id={0x54424C4C}")  # the artifact store's "TBLL"
    conn.execute("CREATE TABLE meta (key TEXT)")
    conn.commit()
    conn.close()


@pytest.mark.parametrize(("make", "why"), [
    (lambda p: p.write_text("not a database at all, " * 20), "not an SQLite database"),
    (_foreign_sqlite, "1 schema object(s) (notes)"),
    (_artifact_like, "application_id is 0x54424c4c"),
], ids=["text", "foreign-sqlite", "artifact-store"])
async def test_a_file_not_ours_is_refused_and_left_untouched(
        anyio_backend: str, tmp_path: Path, make: Any, why: str) -> None:
    path = tmp_path / "theirs.db"
    await anyio.to_thread.run_sync(make, path)
    before = await anyio.to_thread.run_sync(path.read_bytes)
    with pytest.raises(ArtifactStoreError) as caught:
        await connect_cache(SqliteResponseCache(path))
    message = str(caught.value)
    assert str(path) in message and "not a trio-batch-llm response cache" in message
    assert why.lower() in message.lower(), message
    assert await anyio.to_thread.run_sync(path.read_bytes) == before
    assert list(await anyio.to_thread.run_sync(modes, tmp_path)) == ["theirs.db"]


async def test_a_newer_schema_version_is_refused(anyio_backend: str, tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    async with open_cache(SqliteResponseCache(path)):
        pass
    await anyio.to_thread.run_sync(rows, path, "PRAGMA user_version=7")
    with pytest.raises(ArtifactStoreError, match="schema version is 7"):
        await connect_cache(SqliteResponseCache(path))


async def test_the_default_location_is_the_platform_cache_folder(
        anyio_backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    async with open_cache(SqliteResponseCache()) as cache:
        await cache.put(key(1), answer(1))
    path = tmp_path / "xdg" / "trio-batch-llm" / "response-cache.sqlite3"
    assert path.is_file()
    if sys.platform != "win32":
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_default_paths_per_platform(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: tmp_path / "home"))
    tail = Path("trio-batch-llm", "response-cache.sqlite3")
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert default_cache_path() == tmp_path / "home" / ".cache" / tail
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert default_cache_path() == tmp_path / "home" / ".cache" / tail
    monkeypatch.setattr(sys, "platform", "darwin")
    assert default_cache_path() == tmp_path / "home" / "Library" / "Caches" / tail
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path / "local"))
    assert default_cache_path() == tmp_path / "local" / tail


async def test_an_entry_older_than_the_ttl_is_a_miss_and_is_deleted(
        anyio_backend: str, tmp_path: Path) -> None:
    clock = Clock()
    config = SqliteResponseCache(tmp_path / "c.sqlite3", ttl=60)
    cache = await SqliteCacheConnection.open(config, clock=clock)
    try:
        await cache.put(key(1), answer(1, created_at=clock.now))
        clock.now += 59.5
        assert await cache.get(key(1)) is not None
        clock.now += 0.5
        assert await cache.get(key(1)) is None
    finally:
        await cache.aclose()
    assert await anyio.to_thread.run_sync(rows, config.path, "SELECT count(*) FROM entries") == [(0,)]


async def test_the_size_bound_evicts_the_least_recently_used(anyio_backend: str, tmp_path: Path) -> None:
    clock = Clock()
    bound = 256 * 1024
    config = SqliteResponseCache(tmp_path / "c.sqlite3", max_bytes=bound)
    cache = await SqliteCacheConnection.open(config, clock=clock)
    try:
        for i in range(1000):  # about 1 MB of answers in all: four times the bound
            clock.now += 1
            await cache.put(key(i), answer(i, size=1000))
            if i % 10 == 9:
                for kept in range(5):  # the first five stay in use
                    assert await cache.get(key(kept)) is not None, (i, kept)
        live = [i for i in range(1000) if await cache.get(key(i)) is not None]
    finally:
        await cache.aclose()
    assert live[:5] == [0, 1, 2, 3, 4]
    assert 5 not in live and 999 in live and 998 in live
    assert 100 < len(live) < 250, len(live)
    assert config.path is not None
    assert await anyio.to_thread.run_sync(os.path.getsize, config.path) <= bound + 64 * 1024


@pytest.mark.parametrize("store_request", [True, False])
async def test_store_request_false_keeps_the_request_text_out_of_every_file(
        anyio_backend: str, tmp_path: Path, store_request: bool) -> None:
    marker = "PRIVATE-PROMPT-7f3a9c"
    config = SqliteResponseCache(tmp_path / "c.sqlite3", store_request=store_request)
    cache = await connect_cache(config)
    try:
        k = request_key({"provider": "fake", "model": "m", "prompt": f"tell me about {marker}"})
        await cache.put(k, answer(1))
        assert await cache.get(k) is not None
        open_files = await anyio.to_thread.run_sync(all_bytes, tmp_path)
    finally:
        await cache.aclose()
    closed_files = await anyio.to_thread.run_sync(all_bytes, tmp_path)
    for blob in (open_files, closed_files):
        assert (marker.encode() in blob) is store_request
        assert k.digest.encode() in blob


async def test_claims_exclude_other_holders_until_released_or_expired(
        anyio_backend: str, tmp_path: Path) -> None:
    clock = Clock()
    config = SqliteResponseCache(tmp_path / "c.sqlite3")
    a = await SqliteCacheConnection.open(config, clock=clock)
    b = await SqliteCacheConnection.open(config, clock=clock)
    try:
        k = key(1)
        assert await a.claim(k, "A", 10)
        assert not await b.claim(k, "B", 10)
        assert await a.claim(k, "A", 10)  # renewed: held until now + 10
        await b.release(k, "B")  # not B's: nothing happens
        clock.now += 9.9
        assert not await b.claim(k, "B", 10)
        clock.now += 0.1
        assert await b.claim(k, "B", 10)  # A's claim expired: taken over
        assert not await a.claim(k, "A", 10)
        await b.release(k, "B")
        assert await a.claim(k, "A", 10)
        assert await b.claim(key(2), "B", 10)  # claims are per key
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_closed_connection_refuses_calls_and_closes_twice(
        anyio_backend: str, tmp_path: Path) -> None:
    cache = await connect_cache(SqliteResponseCache(tmp_path / "c.sqlite3"))
    await cache.aclose()
    await cache.aclose()
    with pytest.raises(ArtifactStoreError, match="closed"):
        await cache.get(key(1))


async def test_an_entry_that_does_not_decode_is_a_miss(anyio_backend: str, tmp_path: Path) -> None:
    config = SqliteResponseCache(tmp_path / "c.sqlite3")
    async with open_cache(config) as cache:
        await cache.put(key(1), answer(1))
        await anyio.to_thread.run_sync(rows, config.path, "UPDATE entries SET answer = '{\"no\": 1}'")
        assert await cache.get(key(1)) is None


async def test_concurrent_gets_share_calls_and_survive_cancelled_callers(
        anyio_backend: str, tmp_path: Path) -> None:
    async with open_cache(SqliteResponseCache(tmp_path / "c.sqlite3")) as cache:
        for i in range(0, 40, 2):
            await cache.put(key(i), answer(i))
        got: dict[int, Any] = {}
        cancelled: list[int] = []

        async def one(i: int) -> None:
            with anyio.CancelScope() as scope:
                if i % 5 == 0:
                    scope.cancel()  # cancelled as it starts: a leader before its call, or a waiter
                got[i] = await cache.get(key(i))
            if scope.cancelled_caught:
                cancelled.append(i)

        for _ in range(3):
            got.clear()
            cancelled.clear()
            async with anyio.create_task_group() as tg:
                for i in range(40):
                    tg.start_soon(one, i)
            assert sorted(cancelled) == list(range(0, 40, 5))
            assert sorted(got) == [i for i in range(40) if i % 5]
            for i, found in got.items():
                assert (found.output if found else None) == (f"answer {i}" if i % 2 == 0 else None), i
        assert isinstance(cache, SqliteCacheConnection)
        assert await cache.get(key(2)) == answer(2)  # the queue is empty and the lead free again


async def test_writes_and_claims_made_at_once_share_calls_and_keep_their_order(
        anyio_backend: str, tmp_path: Path) -> None:
    async with open_cache(SqliteResponseCache(tmp_path / "c.sqlite3")) as cache:
        taken: list[str] = []
        read_back: dict[int, Any] = {}

        async def writer(i: int) -> None:
            await cache.put(key(i), answer(i))
            read_back[i] = await cache.get(key(i))

        async def claimer(holder: str) -> None:
            if await cache.claim(key(99), holder, 60):
                taken.append(holder)

        async with anyio.create_task_group() as tg:
            for i in range(30):
                tg.start_soon(writer, i)
                tg.start_soon(claimer, f"h{i}")
        assert len(taken) == 1  # one claim among thirty at once
        assert {i: a.output for i, a in read_back.items()} == {i: f"answer {i}" for i in range(30)}
        await cache.release(key(99), taken[0])
        assert await cache.claim(key(99), "later", 60)


async def test_stats_and_clear(anyio_backend: str, tmp_path: Path) -> None:
    clock = Clock()
    cache = await SqliteCacheConnection.open(SqliteResponseCache(tmp_path / "c.sqlite3"), clock=clock)
    try:
        empty = await cache.stats()
        assert (empty.entries, empty.oldest, empty.newest) == (0, None, None)
        for i in range(5):
            await cache.put(key(i), answer(i, created_at=clock.now + i * 100))
        stats = await cache.stats()
        assert (stats.entries, stats.oldest, stats.newest) == (5, clock.now, clock.now + 400)
        assert stats.bytes is not None and stats.bytes > 0
        clock.now += 450
        assert await cache.claim(key(0), "A", 60)
        assert await cache.clear(older_than=200) == 3  # written 450, 350 and 250 s ago
        assert [i for i in range(5) if await cache.get(key(i)) is not None] == [3, 4]
        assert await cache.clear() == 2
        assert (await cache.stats()).entries == 0
        assert not await cache.claim(key(0), "B", 60)  # claims untouched
    finally:
        await cache.aclose()
