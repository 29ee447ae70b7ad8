"""The response cache on a real Redis: entries, TTL (PX), claims, privacy, errors, a restart, kill -9.

Against real ``redis-server`` processes with a password (``tests/_servers/redis.py``),
on both anyio backends. The cross-process race over the same prompts (single flight,
calls counted at the mock) is the last test.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import json
import time
import warnings
from collections.abc import Iterator
from typing import Any

import anyio
import coredis
import pytest

from trio_batch_llm import ArtifactStoreError, DatabaseUnavailableError
from trio_batch_llm._cache._key import request_key
from trio_batch_llm._cache._open import open_cache
from trio_batch_llm._cache._records import CachedAnswer, CacheKey
from trio_batch_llm._cache._redis import RedisCacheConnection
from trio_batch_llm._values._response_cache import RedisResponseCache, as_response_cache
from trio_batch_llm.testing import MockServerConfig, serve_mock

from .._cache_race_child import ANSWER_BYTES, kill_writer_mid_write, run_race
from .._servers.redis import PASSWORD, start_redis

pytestmark = pytest.mark.anyio

SECRET_PROMPT = "the secret plan of Ada Lovelace"


def _key(prompt: str = "hello", sample: int = 0) -> CacheKey:
    messages = [{"role": "user", "content": prompt}]
    return request_key({"provider": "openai", "model": "m", "messages": messages}, sample)


def _answer(text: str = "hi", **kwargs: Any) -> CachedAnswer:
    values: dict[str, Any] = {"output": text, "usage": {"input_tokens": 3, "output_tokens": 2},
                              "metadata": {"details": {"finish_reason": "stop"}}, "model": "m",
                              "created_at": time.time()}
    values.update(kwargs)
    return CachedAnswer(**values)


async def _dump(url: str) -> dict[str, tuple[str, int]]:
    """Every key of the server: its value and its PTTL (-1: none)."""
    async with coredis.Redis.from_url(url, decode_responses=True) as client:
        out = {}
        async for key in client.scan_iter():
            out[key] = (await client.get(key) or "", await client.pttl(key))
        return out


async def test_an_entry_is_written_whole_and_read_back(redis_url: str) -> None:
    config = as_response_cache(redis_url)
    assert isinstance(config, RedisResponseCache)
    key = _key()
    async with open_cache(config) as cache:
        assert isinstance(cache, RedisCacheConnection)
        assert await cache.get(key) is None
        await cache.put(key, _answer("first"))
        await cache.put(key, _answer("second"))  # a refresh overwrites
        found = await cache.get(key)
        assert await cache.get(_key(sample=1)) is None
    assert found is not None
    assert (found.output, found.model) == ("second", "m")
    assert dict(found.usage) == {"input_tokens": 3, "output_tokens": 2}
    assert found.metadata == {"details": {"finish_reason": "stop"}}
    async with open_cache(config) as again:  # another connection (another process) sees it
        assert (await again.get(key)) == found
    stored = await _dump(redis_url)
    entry, request = f"trio-batch-llm:cache:e:{key.digest}", f"trio-batch-llm:cache:r:{key.digest}"
    assert set(stored) == {entry, request}
    assert stored[entry][1] == -1  # no TTL: kept until evicted
    assert json.loads(stored[request][0]) == key.request


async def test_a_ttl_is_a_px_and_an_expired_entry_is_a_miss(redis_url: str) -> None:
    now = [time.time()]
    config = RedisResponseCache(redis_url, ttl=60, namespace="ttl")
    cache = await RedisCacheConnection.open(config, clock=lambda: now[0])
    try:
        await cache.put(_key("fresh"), _answer("fresh", created_at=now[0] - 10))
        await cache.put(_key("stale"), _answer("stale", created_at=now[0] - 61))  # expired: not written
        found = await cache.get(_key("fresh"))
        assert found is not None and found.output == "fresh"
        stored = await _dump(redis_url)
        assert set(stored) == {f"ttl:e:{_key('fresh').digest}", f"ttl:r:{_key('fresh').digest}"}
        assert all(40_000 < pttl <= 50_000 for _, pttl in stored.values())  # 60 s less the 10 already gone
        now[0] += 51  # Redis has not dropped it yet (real time), but it is older than the TTL: a miss
        assert await cache.get(_key("fresh")) is None
    finally:
        await cache.aclose()


async def test_a_claim_has_one_holder_until_released_or_expired(redis_url: str) -> None:
    config = RedisResponseCache(redis_url)
    key = _key()
    async with open_cache(config) as a, open_cache(config) as b:
        assert await a.claim(key, "process-a", 60)
        assert not await b.claim(key, "process-b", 60)
        assert await a.claim(key, "process-a", 60)  # its holder renews it
        await b.release(key, "process-b")  # not the holder: nothing happens
        assert not await b.claim(key, "process-b", 60)
        await a.release(key, "process-a")
        assert await b.claim(key, "process-b", 0.2)
        await a.release(key, "process-a")
        assert not await a.claim(key, "process-a", 60)
        # A holder that dies lets go when its claim's PX runs out: poll for it.
        with anyio.fail_after(10):
            while not await a.claim(key, "process-a", 60):  # noqa: ASYNC110 - a poll of the server
                await anyio.sleep(0.05)
        assert not await b.claim(key, "process-b", 60)
        assert await b.claim(_key("other"), "process-b", 60)  # claims are per key
        pttl = (await _dump(redis_url))[f"trio-batch-llm:cache:c:{key.digest}"][1]
        assert 50_000 < pttl <= 60_000


async def test_store_request_false_keeps_the_prompt_out_of_redis(redis_url: str) -> None:
    key = _key(SECRET_PROMPT)
    for namespace, store in (("kept", True), ("private", False)):
        config = RedisResponseCache(redis_url, namespace=namespace, store_request=store)
        async with open_cache(config) as cache:
            await cache.put(key, _answer("answer"))
            assert await cache.claim(key, "holder", 60)
            assert (await cache.get(key)) is not None
    stored = await _dump(redis_url)
    kept = {k: v for k, v in stored.items() if k.startswith("kept:")}
    private = {k: v for k, v in stored.items() if k.startswith("private:")}
    assert SECRET_PROMPT in json.dumps(kept)
    assert set(private) == {f"private:e:{key.digest}", f"private:c:{key.digest}"}
    assert SECRET_PROMPT not in json.dumps(private)


async def test_a_wrong_password_or_an_unreachable_server_is_a_clear_error(redis_url: str) -> None:
    wrong = redis_url.replace(PASSWORD, "not-the-password")
    with pytest.raises(ArtifactStoreError) as refused:
        await RedisCacheConnection.open(RedisResponseCache(wrong))
    text = str(refused.value)
    assert not isinstance(refused.value, DatabaseUnavailableError)
    assert "redis://<redacted>@127.0.0.1:" in text and "opening failed" in text
    assert "not-the-password" not in text and "check the password" in text
    with coredis_leaks_streams(), pytest.raises(DatabaseUnavailableError) as down:
        async with open_cache(RedisResponseCache(f"redis://:{PASSWORD}@127.0.0.1:1/0")):
            pass
    assert "127.0.0.1:1" in str(down.value) and PASSWORD not in str(down.value)


@pytest.fixture
def private_redis() -> Iterator[Any]:
    # Started here, not in a worker thread: the server dies with the thread that started it.
    server = start_redis()
    try:
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def coredis_leaks_streams() -> Iterator[None]:
    """coredis 6.9 leaves the memory streams of a connection that never connected (or was cut)
    unclosed: their ResourceWarning is expected where a server is down (as in test_quota_redis)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            yield
        finally:
            gc.collect()


async def test_a_server_restart_mid_run_reconnects_or_raises_clearly(private_redis: Any) -> None:
    with coredis_leaks_streams():
        await _restart_mid_run(private_redis)


async def _restart_mid_run(server: Any) -> None:
    keys = [_key(f"p{i}") for i in range(20)]
    async with open_cache(RedisResponseCache(server.url)) as cache:
        for key in keys[:10]:
            await cache.put(key, _answer(key.digest))
        server.kill()  # every connection dropped, nothing saved
        with pytest.raises(DatabaseUnavailableError) as down:
            await cache.get(keys[0])
        assert PASSWORD not in str(down.value) and "reading an entry failed" in str(down.value)
        server.start()  # back, empty, on the same port
        for key in keys[10:]:  # the next calls reconnect
            await cache.put(key, _answer(key.digest))
        found = [await cache.get(key) for key in keys]
        assert [answer.output if answer else None for answer in found] == [None] * 10 + [
            k.digest for k in keys[10:]]
        assert await cache.claim(keys[0], "me", 60)


async def test_a_writer_killed_mid_write_leaves_no_half_entry(redis_url: str) -> None:
    for after in (3, 11):
        kill = functools.partial(kill_writer_mid_write, redis_url, after=after)
        wrote = await anyio.to_thread.run_sync(kill)
        assert wrote >= after
    stored = await _dump(redis_url)
    entries = {k: v for k, v in stored.items() if ":e:" in k}
    assert len(entries) >= 11
    async with open_cache(RedisResponseCache(redis_url)) as cache:
        for name in entries:
            digest = name.rpartition(":")[2]
            decoded = await cache.get(CacheKey(digest))
            assert decoded is not None
            body = decoded.output["body"]
            assert len(body) == ANSWER_BYTES
            assert decoded.output["sha"] == hashlib.sha256(body.encode()).hexdigest()


async def test_two_processes_racing_over_the_same_prompts_call_each_about_once(
    redis_url: str, anyio_backend: str
) -> None:
    # Single flight across processes: each prompt's first claimant calls; the other waits for its
    # answer. The mock (the provider) counts the calls; the racers run the engine on this backend.
    prompts = 100
    async with serve_mock(MockServerConfig(latency=0.05)) as server:
        race = functools.partial(run_race, redis_url, server.base_url, prompts, mode="engine",
                                 backend=anyio_backend)
        outs = await anyio.to_thread.run_sync(race)
        calls = server.stats.requests
    assert sum(out["failed"] for out in outs) == 0
    assert sum(out["hits"] for out in outs) + calls == 2 * prompts  # every item a hit or a call
    assert calls <= prompts * 1.01, outs


@pytest.fixture
def _cluster_leak() -> Iterator[None]:
    # coredis 6.9's ClusterLayout never closes its memory streams: each closed cluster client leaves a
    # ResourceWarning for the collector (as in test_quota_redis_cluster); collected here, after the test.
    with coredis_leaks_streams():
        yield


@pytest.mark.usefixtures("_cluster_leak")
async def test_a_redis_cluster_holds_entries_and_claims(cluster_url: str) -> None:
    config = RedisResponseCache(cluster_url, cluster=True, ttl=3600)
    keys = [_key(f"p{i}") for i in range(12)]  # digests spread over the three nodes' slots
    async with open_cache(config) as a, open_cache(config) as b:
        for key in keys:
            await a.put(key, _answer(key.digest))
        found = [await b.get(key) for key in keys]
        assert [answer.output if answer else None for answer in found] == [k.digest for k in keys]
        assert await a.claim(keys[0], "process-a", 60)
        assert not await b.claim(keys[0], "process-b", 60)
        await a.release(keys[0], "process-a")
        assert await b.claim(keys[0], "process-b", 60)
