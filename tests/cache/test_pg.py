"""The response cache on a real PostgreSQL server: entries, TTL, claims, privacy, errors, restarts, kill -9.

Against the session's server (``tests/_servers/postgres.py``, a password in its URL),
a fresh database per test, on both anyio backends. The cross-process race over the
same prompts (single flight, calls counted at the mock) is the last test.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time

import anyio
import psycopg
import pytest

from trio_batch_llm import ArtifactStoreError, ConfigurationError, DatabaseUnavailableError
from trio_batch_llm._cache._answer_json import answer_from_json
from trio_batch_llm._cache._key import request_key
from trio_batch_llm._cache._open import open_cache
from trio_batch_llm._cache._postgres import PostgresCacheConnection
from trio_batch_llm._cache._records import CachedAnswer, CacheKey
from trio_batch_llm._values._response_cache import PostgresResponseCache
from trio_batch_llm.testing import MockServerConfig, serve_mock

from .._cache_race_child import kill_writer_mid_write, run_race
from .._servers.postgres import PASSWORD, PostgresServer

pytestmark = pytest.mark.anyio

SECRET_PROMPT = "the secret plan of Ada Lovelace"


def _key(prompt: str = "hello", sample: int = 0) -> CacheKey:
    messages = [{"role": "user", "content": prompt}]
    return request_key({"provider": "openai", "model": "m", "messages": messages}, sample)


def _answer(text: str = "hi", **kwargs: object) -> CachedAnswer:
    values: dict[str, object] = {"output": text, "usage": {"input_tokens": 3, "output_tokens": 2},
                                 "metadata": {"details": {"finish_reason": "stop"}}, "model": "m",
                                 "created_at": time.time()}
    values.update(kwargs)
    return CachedAnswer(**values)  # type: ignore[arg-type]


def _rows(url: str, table: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        return [tuple(row) for row in conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()]


async def test_an_entry_is_written_whole_and_read_back(postgres_url: str) -> None:
    config = PostgresResponseCache(postgres_url)
    key = _key()
    async with open_cache(config) as cache:
        assert isinstance(cache, PostgresCacheConnection)
        assert await cache.get(key) is None
        await cache.put(key, _answer("first"))
        await cache.put(key, _answer("second"))  # a refresh overwrites
        found = await cache.get(key)
        assert await cache.get(_key(sample=1)) is None  # another sample is another entry
    assert found is not None
    assert (found.output, found.model) == ("second", "m")
    assert dict(found.usage) == {"input_tokens": 3, "output_tokens": 2}
    assert found.metadata == {"details": {"finish_reason": "stop"}}
    async with open_cache(config) as again:  # another connection (another process) sees it
        assert (await again.get(key)) == found
    rows = _rows(postgres_url, config.table)
    assert len(rows) == 1 and rows[0][0] == key.digest
    assert SECRET_PROMPT not in json.dumps(rows, default=str)


async def test_an_expired_entry_is_a_miss_and_is_deleted(postgres_url: str) -> None:
    config = PostgresResponseCache(postgres_url, ttl=60)
    now = [1_000_000.0]
    old, fresh = _key("old"), _key("fresh")
    cache = await PostgresCacheConnection.open(config, clock=lambda: now[0])
    try:
        await cache.put(old, _answer("old", created_at=now[0] - 61))
        await cache.put(fresh, _answer("fresh", created_at=now[0] - 59))
        assert await cache.get(old) is None
        found = await cache.get(fresh)
        assert found is not None and found.output == "fresh"
        now[0] += 2  # fresh is 61 s old now
        assert await cache.get(fresh) is None
    finally:
        await cache.aclose()
    assert _rows(postgres_url, config.table) == []  # both deleted when read expired


async def test_a_claim_has_one_holder_until_released_or_expired(postgres_url: str) -> None:
    config = PostgresResponseCache(postgres_url)
    key = _key()
    async with open_cache(config) as a, open_cache(config) as b:
        assert await a.claim(key, "process-a", 60)
        assert not await b.claim(key, "process-b", 60)
        assert await a.claim(key, "process-a", 60)  # its holder renews it
        await b.release(key, "process-b")  # not the holder: nothing happens
        assert not await b.claim(key, "process-b", 60)
        await a.release(key, "process-a")
        assert await b.claim(key, "process-b", 0.2)
        await a.release(key, "process-a")  # released twice: nothing happens
        assert not await a.claim(key, "process-a", 60)
        # A holder that dies lets go when its claim expires (on the server's clock): poll for it.
        with anyio.fail_after(10):
            while not await a.claim(key, "process-a", 60):  # noqa: ASYNC110 - a poll of the server
                await anyio.sleep(0.05)
        assert not await b.claim(key, "process-b", 60)
        assert await b.claim(_key("other"), "process-b", 60)  # claims are per key


async def test_store_request_false_keeps_the_prompt_out_of_the_database(postgres_url: str) -> None:
    kept = PostgresResponseCache(postgres_url, table="kept")
    private = PostgresResponseCache(postgres_url, table="private", store_request=False)
    key = _key(SECRET_PROMPT)
    for config in (kept, private):
        async with open_cache(config) as cache:
            await cache.put(key, _answer("answer"))
            await cache.claim(key, "holder", 60)
            assert (await cache.get(key)) is not None
    assert SECRET_PROMPT in json.dumps(_rows(postgres_url, "kept"), default=str)
    stored = json.dumps(_rows(postgres_url, "private") + _rows(postgres_url, "private_claims"), default=str)
    assert key.digest in stored and SECRET_PROMPT not in stored
    assert _rows(postgres_url, "private")[0][2] is None  # the request column is NULL


async def test_a_wrong_password_or_an_unreachable_server_is_a_clear_error(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    wrong = postgres_url.replace(PASSWORD, "not-the-password")
    with pytest.raises(ArtifactStoreError) as refused:
        await PostgresCacheConnection.open(PostgresResponseCache(wrong))
    text = str(refused.value)
    assert not isinstance(refused.value, DatabaseUnavailableError)
    assert f"127.0.0.1:{postgres_server.port}" in text and "<redacted>@" in text
    assert "password authentication failed" in text and "not-the-password" not in text
    with pytest.raises(DatabaseUnavailableError) as down:
        async with open_cache(PostgresResponseCache(f"postgresql://tbl:{PASSWORD}@127.0.0.1:1/x")):
            pass
    assert "127.0.0.1:1" in str(down.value) and PASSWORD not in str(down.value)
    assert "opening failed" in str(down.value)


async def test_a_table_that_is_not_ours_is_refused_and_left_alone(postgres_url: str) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE theirs (digest TEXT, note TEXT)")
        conn.execute("INSERT INTO theirs VALUES ('d', 'keep me')")
    with pytest.raises(ArtifactStoreError, match="theirs exists and is not a trio-batch-llm response cache"):
        await PostgresCacheConnection.open(PostgresResponseCache(postgres_url, table="theirs"))
    assert _rows(postgres_url, "theirs") == [("d", "keep me")]
    with pytest.raises(ConfigurationError, match="table"):
        await PostgresCacheConnection.open(PostgresResponseCache(postgres_url, table="x; DROP TABLE theirs"))
    # Ours is recognised again, and a newer schema is refused rather than misread.
    async with open_cache(PostgresResponseCache(postgres_url, table="ours")):
        pass
    async with open_cache(PostgresResponseCache(postgres_url, table="ours")):
        pass
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("UPDATE trio_batch_llm_schema SET version = 99 WHERE component = 'response_cache:ours'")
    with pytest.raises(ArtifactStoreError, match="newer than this library reads"):
        await PostgresCacheConnection.open(PostgresResponseCache(postgres_url, table="ours"))


async def test_a_server_restart_mid_run_reconnects_and_corrupts_nothing(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    config = PostgresResponseCache(postgres_url)
    keys = [_key(f"p{i}") for i in range(20)]
    async with open_cache(config) as cache:
        for key in keys[:10]:
            await cache.put(key, _answer(key.digest))
        await anyio.to_thread.run_sync(postgres_server.restart)  # every connection dropped
        for key in keys[10:]:  # the first call finds its connection lost, reconnects and goes on
            await cache.put(key, _answer(key.digest))
        found = [await cache.get(key) for key in keys]
        assert [answer.output if answer else None for answer in found] == [k.digest for k in keys]
        assert await cache.claim(keys[0], "me", 60)
        await anyio.to_thread.run_sync(postgres_server.stop)
        try:
            with pytest.raises(DatabaseUnavailableError) as down:
                await cache.get(keys[0])
        finally:
            await anyio.to_thread.run_sync(postgres_server.start)
        assert PASSWORD not in str(down.value) and "reading an entry failed" in str(down.value)
        assert (await cache.get(keys[0])) is not None  # back: the next call reconnects


async def test_a_writer_killed_mid_write_leaves_no_half_entry(postgres_url: str) -> None:
    config = PostgresResponseCache(postgres_url)
    for after in (3, 11):
        kill = functools.partial(kill_writer_mid_write, postgres_url, after=after)
        wrote = await anyio.to_thread.run_sync(kill)
        assert wrote >= after
    rows = _rows(postgres_url, config.table)
    assert len(rows) >= 11
    for _digest, answer, _request, _created, _used in rows:
        decoded = answer_from_json(answer)  # type: ignore[arg-type]
        assert decoded is not None
        body = decoded.output["body"]
        assert len(body) == 64 * 1024 and decoded.output["sha"] == hashlib.sha256(body.encode()).hexdigest()
    async with open_cache(config) as cache:  # the cache opens and works after the kills
        await cache.put(_key(), _answer())
        assert await cache.get(_key()) is not None


async def test_two_processes_racing_over_the_same_prompts_call_each_about_once(
    postgres_url: str, anyio_backend: str
) -> None:
    # Single flight across processes: each prompt's first claimant calls; the other waits for its
    # answer. The mock (the provider) counts the calls; the racers run the engine on this backend.
    prompts = 100
    async with serve_mock(MockServerConfig(latency=0.05)) as server:
        race = functools.partial(run_race, postgres_url, server.base_url, prompts, mode="engine",
                                 backend=anyio_backend)
        outs = await anyio.to_thread.run_sync(race)
        calls = server.stats.requests
    assert sum(out["failed"] for out in outs) == 0
    assert sum(out["hits"] for out in outs) + calls == 2 * prompts  # every item a hit or a call
    assert calls <= prompts * 1.01, outs
