"""Both provider strategies through the engine, against the bundled mock server over real loopback HTTP.

Most tests run on the real clock: no test sleeps to pass, waits are on the
server's counters (``server.wait_for``) or on the engine's results. The tests
about time (a Retry-After cooldown, an attempt timeout) run on an autojumping
virtual clock that real sockets tolerate (see ``test_fault_storm``) and assert
exact instants on the one clock the engine and the in-process server share.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
import openai
import pytest

from trio_batch_llm import (
    BatchLLMError,
    ErrorCategory,
    LLMCallError,
    LLMCallPool,
    ProcessorConfig,
    ProviderError,
    RateLimitConfig,
    RetryConfig,
    StopReason,
    call,
    call_result,
    process_prompts,
    process_stream,
)
from trio_batch_llm._strategies.openai._compatible import OpenAICompatibleStrategy
from trio_batch_llm._strategies.openai._http import create_client, pool_statistics
from trio_batch_llm._strategies.openai._sdk import OpenAIStrategy
from trio_batch_llm.mock import MockServer, MockServerConfig, serve_mock
from trio_batch_llm.mock._state import mock_token_count

from ..e2e.test_fault_storm import autojump_backends

pytestmark = pytest.mark.anyio

KEY = "sk-mock-engine-KEY-0042"
KINDS = ["compatible", "sdk"]
Strategy = OpenAICompatibleStrategy | OpenAIStrategy

NO_BACKOFF = RetryConfig(max_attempts=3, initial_wait=0.0, max_wait=0.0)
NO_RAMP = RateLimitConfig(cooldown_seconds=0.05, slow_start_seconds=0.0)
FAST = ProcessorConfig(concurrency=4, retry=NO_BACKOFF, rate_limit=NO_RAMP)
SLOW = "[[latency:60]]"  # answered only after the test is long over: a request that stays in flight
EXACT = 0.02  # autojump threshold of the tests that assert instants: few jumps, so a wide margin is cheap


@pytest.fixture
async def server() -> AsyncIterator[MockServer]:
    async with serve_mock(MockServerConfig(api_key=KEY, retry_after=0.05)) as running:
        yield running


def build(kind: str, server: MockServer, *, api: str = "chat", http: Any = None, **kwargs: Any) -> Strategy:
    """A strategy on the mock server; with ``http`` (an httpx2 client) it runs on that user client."""
    if kind == "compatible":
        return OpenAICompatibleStrategy("mock-model", base_url=server.base_url, api=api, api_key=KEY,
                                        client=http, **kwargs)
    if http is not None:
        client = openai.AsyncOpenAI(api_key=KEY, base_url=server.base_url, http_client=http)
        return OpenAIStrategy("mock-model", client=client, api=api, **kwargs)
    return OpenAIStrategy("mock-model", base_url=server.base_url, api_key=KEY, api=api, **kwargs)


def http_client_of(strategy: Strategy) -> Any:
    client = strategy._client_for_call()
    return client if isinstance(strategy, OpenAICompatibleStrategy) else client._client


def usage_of(prompt: str) -> dict[str, int]:
    """What the mock reports for an echo answer to ``prompt``."""
    prompt_tokens, output_tokens = mock_token_count(prompt), mock_token_count("echo: " + prompt)
    return {"input_tokens": prompt_tokens, "output_tokens": output_tokens,
            "total_tokens": prompt_tokens + output_tokens, "cached_input_tokens": 0,
            "reasoning_tokens": 0}


# -- success and usage ---------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("kind", KINDS)
async def test_success_and_usage_accounting(server: MockServer, kind: str, api: str) -> None:
    prompts = [f"prompt number {i} " + "x" * i for i in range(12)] + ["[[fail:500x1]] retried once"]
    batch = await process_prompts(build(kind, server, api=api), prompts, config=FAST, preserve_order=True)
    assert (batch.total_items, batch.succeeded, batch.failed) == (13, 13, 0)
    for prompt, result in zip(prompts, batch.results, strict=True):
        assert result.output == "echo: " + prompt
        assert result.token_usage == usage_of(prompt)  # a 500 carries no usage: only the success counts
        assert result.metadata["api"] == api
        assert result.attempts == (2 if "fail" in prompt else 1)
    stats = server.stats
    totals = batch.total_tokens()
    assert totals["input_tokens"] == stats.prompt_tokens
    assert totals["output_tokens"] == stats.completion_tokens
    assert totals["total_tokens"] == stats.prompt_tokens + stats.completion_tokens
    assert (stats.requests, stats.succeeded, stats.server_errors) == (14, 13, 1)
    assert stats.max_in_flight <= 4


def pool_limits(strategy: Strategy) -> tuple[int, int]:
    """``(max_connections, max_keepalive_connections)`` of the strategy's connection pool."""
    pool = http_client_of(strategy)._transport._pool
    return pool._max_connections, pool._max_keepalive_connections


@pytest.mark.parametrize("kind", KINDS)
async def test_engine_concurrency_sizes_the_connection_pool(server: MockServer, kind: str) -> None:
    hinted, explicit = build(kind, server), build(kind, server, concurrency=6)
    limits = []
    for strategy in (hinted, explicit):
        async with process_stream(strategy, [f"p{i}" for i in range(8)], concurrency=3) as results:
            async for result in results:
                assert result.success
                limits.append(pool_limits(strategy))
    # Kept alive: the engine's concurrency, unless the strategy was given its own (which also caps).
    assert limits == [(sys.maxsize, 3)] * 8 + [(6, 6)] * 8
    assert server.stats.max_in_flight <= 3


@pytest.mark.parametrize("kind", KINDS)
async def test_a_shared_client_never_throttles_a_later_owner(server: MockServer, kind: str) -> None:
    """A pool of one opened the client; a batch of four sharing it still runs four calls at once."""
    strategy = build(kind, server)
    async with LLMCallPool(strategy, config=ProcessorConfig(concurrency=1)) as pool:
        assert await pool.submit("opens the client") == "echo: opens the client"
        opened = strategy._client_for_call()
        prompts = [f"[[latency:0.1]] batch {i}" for i in range(8)]
        async with process_stream(strategy, prompts, concurrency=4) as results:
            async for result in results:
                assert result.success
                assert strategy._client_for_call() is opened  # one lease, one client, per event loop
        assert pool_limits(strategy) == (sys.maxsize, 1)
    assert server.stats.max_in_flight == 4


# -- each error mapping, as the engine reports it -------------------------------------------------

ERROR_CASES = [
    # (prompt, category, the SDK's own exception type)
    ("[[fail:429]] a", ErrorCategory.RATE_LIMIT, openai.RateLimitError),
    ("[[fail:500]] b", ErrorCategory.SERVER, openai.InternalServerError),
    ("[[fail:503]] c", ErrorCategory.SERVER, openai.InternalServerError),
    ("[[fail:401]] d", ErrorCategory.AUTHENTICATION, openai.AuthenticationError),
    ("[[fail:403]] f", ErrorCategory.AUTHENTICATION, openai.PermissionDeniedError),
    ("[[fail:404]] g", ErrorCategory.INVALID_REQUEST, openai.NotFoundError),
    ("[[fail:408]] h", ErrorCategory.TIMEOUT, openai.APIStatusError),
    ("[[fail:422]] i", ErrorCategory.INVALID_REQUEST, openai.UnprocessableEntityError),
    ("[[context_length]] j", ErrorCategory.CONTEXT_LENGTH, openai.BadRequestError),
    ("[[content_policy]] k", ErrorCategory.CONTENT_POLICY, openai.BadRequestError),
    ("[[malformed]] l", ErrorCategory.PARSE, json.JSONDecodeError),
    ("[[reset]] m", ErrorCategory.TRANSIENT, openai.APIConnectionError),
]


@pytest.mark.parametrize("kind", KINDS)
async def test_each_error_mapping_ends_in_its_category(server: MockServer, kind: str) -> None:
    one_try = ProcessorConfig(concurrency=4, retry=RetryConfig(max_attempts=1, max_rate_limit_retries=0),
                              rate_limit=NO_RAMP)
    prompts = [prompt for prompt, _, _ in ERROR_CASES] + ["fine"]
    batch = await process_prompts(build(kind, server), prompts, config=one_try, preserve_order=True)
    *failures, fine = batch.results
    assert (batch.succeeded, fine.output) == (1, "echo: fine")
    for (prompt, category, sdk_type), result in zip(ERROR_CASES, failures, strict=True):
        assert (result.success, result.error_category, result.attempts) == (False, category, 1), prompt
        if kind == "sdk":
            # CONTRACT C7.2: the SDK's exception itself, not a wrapper
            assert type(result.exception) is sdk_type, prompt
            assert not isinstance(result.exception, BatchLLMError)
        else:
            assert isinstance(result.exception, ProviderError), prompt
        assert result.error is not None
        assert KEY not in result.error
        assert KEY not in json.dumps(result.to_dict())
    assert server.stats.requests == len(prompts)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("spent", ["[[fail:402]] credits", "[[spend_limit]] quota"])
async def test_spent_credits_or_quota_stop_the_batch(server: MockServer, kind: str, spent: str) -> None:
    """A 402, or OpenAI's 429 ``insufficient_quota``: no later call can succeed, so none is made."""
    one_at_a_time = ProcessorConfig(concurrency=1, retry=RetryConfig(max_attempts=3), rate_limit=NO_RAMP)
    prompts = ["first", spent, "later 1", "later 2"]
    batch = await process_prompts(build(kind, server), prompts, config=one_at_a_time, preserve_order=True)
    first, stopped, *later = batch.results
    assert first.success
    assert (stopped.error_category, stopped.attempts, stopped.stop_reason) == (
        ErrorCategory.INSUFFICIENT_BALANCE, 1, StopReason.PROVIDER_RETIRED)
    assert [(r.error_category, r.attempts) for r in later] == [(ErrorCategory.NOT_EXECUTED, 0)] * 2
    assert batch.termination.kind == "provider_retired" and batch.termination.item_id == stopped.item_id
    assert "spent" in (batch.termination.reason or "")
    assert server.stats.requests == 2


# -- Retry-After, hangs, resets ------------------------------------------------------------------


@pytest.mark.parametrize("anyio_backend", autojump_backends(EXACT))
@pytest.mark.parametrize("kind", KINDS)
async def test_retry_after_drives_the_scope_cooldown(server: MockServer, kind: str) -> None:
    wait = 0.4
    first = f"[[fail:429x1]] [[retry_after:{wait}]] limited"
    prompts = [first] + [f"[[latency:0.05]] p{i}" for i in range(1, 8)]
    batch = await process_prompts(build(kind, server), prompts, config=FAST, preserve_order=True)
    assert batch.succeeded == 8
    limited = batch.results[0]
    assert (limited.attempts, limited.timing.backoff) == (2, 0.0)
    assert limited.timing.cooldown == pytest.approx(wait)  # it waited in its scope's cooldown
    requests = server.requests
    (rate_limited,) = [r for r in requests if r.outcome == "error:429"]
    assert rate_limited.answered == rate_limited.arrival  # answered at once, so the cooldown began then
    offsets = [r.arrival - rate_limited.arrival for r in requests]
    # Four calls were admitted before the 429 came back; nobody in the scope started another until the
    # server's Retry-After had passed, and then the retry and four more went out at once.
    assert offsets == pytest.approx([0.0] * 4 + [wait] * 5)
    assert sorted(str(r.prompt) for r in requests[:4]) == sorted(prompts[:4])


@pytest.mark.parametrize("anyio_backend", autojump_backends(EXACT))
@pytest.mark.parametrize("kind", KINDS)
async def test_hang_hits_the_attempt_timeout_and_is_retried(server: MockServer, kind: str) -> None:
    config = ProcessorConfig(concurrency=2, attempt_timeout=0.3, retry=NO_BACKOFF)
    batch = await process_prompts(build(kind, server), ["[[hangx1]] stuck once", "free"], config=config,
                                  preserve_order=True)
    stuck, free = batch.results
    assert (stuck.success, stuck.output, stuck.attempts) == (True, "echo: [[hangx1]] stuck once", 2)
    assert stuck.timing.execution == pytest.approx(0.3)
    assert (free.success, free.attempts) == (True, 1)
    stats = await server.wait_for(lambda s: s.in_flight == 0)
    assert (stats.requests, stats.hangs, stats.disconnects, stats.succeeded) == (3, 1, 1, 2)
    hung, retried = [r for r in server.requests if r.prompt == "[[hangx1]] stuck once"]
    assert (hung.outcome, hung.client_disconnected, hung.answered) == ("hang", True, None)
    assert retried.arrival == pytest.approx(hung.arrival + 0.3)  # the attempt timeout, to the instant


@pytest.mark.parametrize("kind", KINDS)
async def test_connection_reset_is_retried_and_succeeds(server: MockServer, kind: str) -> None:
    batch = await process_prompts(build(kind, server), ["[[resetx1]] dropped once"], config=FAST)
    (result,) = batch.results
    assert (result.success, result.output, result.attempts) == (True, "echo: [[resetx1]] dropped once", 2)
    assert result.token_usage == usage_of("[[resetx1]] dropped once")
    assert [r.outcome for r in server.requests] == ["reset", "ok"]


# -- cancellation leaks no connection -------------------------------------------------------------


@pytest.mark.parametrize("owner", ["user", "engine"])
@pytest.mark.parametrize("kind", KINDS)
async def test_leaving_the_stream_early_leaks_no_connection(
    server: MockServer, kind: str, owner: str
) -> None:
    http = create_client(concurrency=4) if owner == "user" else None
    try:
        strategy = build(kind, server, http=http)
        prompts = ["quick"] + [f"{SLOW} slow {i}" for i in range(6)]
        async with process_stream(strategy, prompts, concurrency=4) as results:
            async for result in results:
                assert result.output == "echo: quick"
                client = http_client_of(strategy)
                # the freed worker picked up the next slow prompt: four requests wait in the server
                await server.wait_for(lambda s: s.requests == 5 and s.in_flight == 4)
                assert pool_statistics(client).active == 4
                break
        stats = await server.wait_for(lambda s: s.in_flight == 0)
        assert (stats.requests, stats.disconnects, stats.succeeded) == (5, 4, 1)
        pool = pool_statistics(client)
        assert (pool.active, pool.connections) == (0, pool.idle)
        if http is None:
            assert pool.connections == 0  # the last lease closed the client it opened
            assert client.is_closed
        else:  # the user's client is theirs: still open, still usable
            assert not http.is_closed
            assert await call(strategy, "again", config=FAST) == "echo: again"
    finally:
        if http is not None:
            await http.aclose()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.filterwarnings("ignore:concurrency=4 but:UserWarning")  # a 3-connection pool, on purpose
async def test_cancelling_a_pool_submitter_leaks_no_connection(server: MockServer, kind: str) -> None:
    http = create_client(concurrency=3)
    strategy = build(kind, server, http=http)
    scopes = [anyio.CancelScope() for _ in range(3)]
    outcomes: list[str] = []

    async def submit(index: int, pool: LLMCallPool[str]) -> None:
        with scopes[index]:
            outcomes.append(await pool.submit(f"{SLOW} submitter {index}"))

    async with http, LLMCallPool(strategy, config=FAST) as pool, anyio.create_task_group() as tg:
        for index in range(3):
            tg.start_soon(submit, index, pool)
        await server.wait_for(lambda s: s.in_flight == 3)
        assert (pool.pending, pool_statistics(http).active) == (3, 3)
        scopes[1].cancel()
        stats = await server.wait_for(lambda s: s.disconnects == 1)
        assert stats.in_flight == 2
        assert (pool.pending, pool_statistics(http).active) == (2, 2)
        assert pool.statistics().admission.in_flight == 2  # its slot went back to the scope
        assert await pool.submit("still serving") == "echo: still serving"
        scopes[0].cancel()
        scopes[2].cancel()
        await server.wait_for(lambda s: s.in_flight == 0)
    assert outcomes == []
    assert server.stats.disconnects == 3
    pool_after = pool_statistics(http)
    assert pool_after.active == 0


# -- call(), call_result(), LLMCallPool ------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_call_call_result_and_pool(server: MockServer, kind: str) -> None:
    strategy = build(kind, server)
    assert await call(strategy, "hello", config=FAST) == "echo: hello"
    with pytest.raises(LLMCallError) as info:
        await call(strategy, "[[fail:401]] denied", config=FAST)
    failed = info.value.result
    assert failed is not None
    assert (failed.error_category, failed.attempts) == (ErrorCategory.AUTHENTICATION, 1)
    assert info.value.__cause__ is failed.exception
    expected_type = openai.AuthenticationError if kind == "sdk" else ProviderError
    assert type(failed.exception) is expected_type

    recovered = await call_result(strategy, "[[fail:429x1]] once limited", config=FAST)
    assert (recovered.success, recovered.attempts) == (True, 2)
    assert recovered.token_usage == usage_of("[[fail:429x1]] once limited")

    async with LLMCallPool(strategy, config=FAST) as pool, anyio.create_task_group() as tg:
        answers: dict[int, str] = {}

        async def ask(index: int) -> None:
            answers[index] = await pool.submit(f"[[latency:0.02]] q{index}")

        for index in range(10):
            tg.start_soon(ask, index)
    assert answers == {i: f"echo: [[latency:0.02]] q{i}" for i in range(10)}
    stats = server.stats
    assert stats.max_in_flight <= 4
    assert (stats.requests, stats.in_flight) == (14, 0)
