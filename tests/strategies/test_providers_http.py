"""Provider strategies over real loopback HTTP against the bundled mock server, on both backends.

Real clock, real sockets. Nothing sleeps to pass: waits are on the server's
counters (``server.wait_for``), and deadlines only bound hangs that never end.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
import openai
import pytest

from trio_batch_llm import BatchLLMError, ErrorCategory, ProviderError
from trio_batch_llm._engine._classify import Classification, classify
from trio_batch_llm._strategies.openai._compatible import OpenAICompatibleStrategy
from trio_batch_llm._strategies.openai._http import pool_statistics
from trio_batch_llm._strategies.openai._sdk import OpenAIStrategy
from trio_batch_llm.mock import MockServer, MockServerConfig, serve_mock
from trio_batch_llm.mock._state import mock_token_count

pytestmark = pytest.mark.anyio

KEY = "sk-mock-KEY-do-not-leak-42"
Strategy = OpenAICompatibleStrategy | OpenAIStrategy


@pytest.fixture
async def server() -> AsyncIterator[MockServer]:
    async with serve_mock(MockServerConfig(api_key=KEY, retry_after=0.5)) as running:
        yield running


def build(kind: str, server: MockServer, api: str = "chat", **kwargs: Any) -> Strategy:
    kwargs.setdefault("api_key", KEY)
    if kind == "compatible":
        return OpenAICompatibleStrategy("mock-model", base_url=server.base_url, api=api, **kwargs)
    return OpenAIStrategy("mock-model", base_url=server.base_url, api=api, **kwargs)


def http_client_of(strategy: Strategy) -> Any:
    client = strategy._client_for_call()
    return client if isinstance(strategy, OpenAICompatibleStrategy) else client._client


async def failure(
    strategy: Strategy, prompt: str, timeout: float | None = None
) -> tuple[Exception, Classification]:
    """The exception ``execute`` raised, and the engine's verdict on it (with the strategy's classifier).

    The direct client raises :class:`ProviderError`; the SDK strategy raises the
    SDK's own exceptions (or ``json.JSONDecodeError``), never wrapped (CONTRACT C7.2).
    """
    compatible = isinstance(strategy, OpenAICompatibleStrategy)
    expected = ProviderError if compatible else (openai.OpenAIError, json.JSONDecodeError)
    with pytest.raises(expected) as info:
        await strategy.execute(prompt, 1, timeout)
    assert compatible or not isinstance(info.value, BatchLLMError)
    return info.value, classify(info.value, strategy_classifier=strategy.classify_error)


KINDS = ["compatible", "sdk"]


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("kind", KINDS)
async def test_success_with_usage(server: MockServer, kind: str, api: str) -> None:
    strategy = build(kind, server, api=api, system_prompt="be brief", headers={"X-Run": "r1"})
    await strategy.prepare()
    try:
        text, usage, metadata = await strategy.execute("hello mock", 1, None)
    finally:
        await strategy.cleanup()
    prompt = "be brief\nhello mock"  # what the server saw: the system prompt and the user prompt
    assert text == "echo: " + prompt
    input_tokens, output_tokens = mock_token_count(prompt), mock_token_count("echo: " + prompt)
    assert usage == {"input_tokens": input_tokens, "output_tokens": output_tokens,
                     "total_tokens": input_tokens + output_tokens, "cached_input_tokens": 0,
                     "reasoning_tokens": 0}
    assert metadata["model"] == "mock-model"
    assert metadata["api"] == api
    (request,) = server.requests
    assert request.path == ("/v1/chat/completions" if api == "chat" else "/v1/responses")
    assert request.headers["x-run"] == "r1"
    assert "authorization" not in request.headers
    assert KEY not in repr(request)
    stats = server.stats
    assert (stats.requests, stats.succeeded, stats.prompt_tokens) == (1, 1, input_tokens)


ERROR_PROMPTS = [
    # (prompt, category, status_code, retry_after, the SDK's exception type)
    ("[[fail:429]] a", ErrorCategory.RATE_LIMIT, 429, 0.5, openai.RateLimitError),
    ("[[fail:500]] b", ErrorCategory.SERVER, 500, None, openai.InternalServerError),
    ("[[fail:503]] [[retry_after:2]] c", ErrorCategory.SERVER, 503, 2.0, openai.InternalServerError),
    ("[[fail:402]] d", ErrorCategory.INSUFFICIENT_BALANCE, 402, None, openai.APIStatusError),
    ("[[fail:403]] e", ErrorCategory.AUTHENTICATION, 403, None, openai.PermissionDeniedError),
    ("[[fail:422]] f", ErrorCategory.INVALID_REQUEST, 422, None, openai.UnprocessableEntityError),
    ("[[fail:408]] g", ErrorCategory.TIMEOUT, 408, None, openai.APIStatusError),
    ("[[context_length]] h", ErrorCategory.CONTEXT_LENGTH, 400, None, openai.BadRequestError),
    ("[[content_policy]] i", ErrorCategory.CONTENT_POLICY, 400, None, openai.BadRequestError),
    ("[[malformed]] j", ErrorCategory.PARSE, None, None, json.JSONDecodeError),
    ("[[reset]] k", ErrorCategory.TRANSIENT, None, None, openai.APIConnectionError),
]


@pytest.mark.parametrize("kind", KINDS)
async def test_each_error_mapping_over_http(server: MockServer, kind: str) -> None:
    strategy = build(kind, server)
    await strategy.prepare()
    try:
        for prompt, category, status, retry_after, sdk_type in ERROR_PROMPTS:
            error, verdict = await failure(strategy, prompt)
            got = (verdict.category, verdict.status_code, verdict.retry_after)
            assert got == (category, status, retry_after), prompt
            if kind == "sdk":
                assert type(error) is sdk_type, prompt
            assert KEY not in str(error), prompt
        assert (await strategy.execute("still fine after all that", 1, None))[0].startswith("echo:")
    finally:
        await strategy.cleanup()
    stats = server.stats
    assert (stats.resets, stats.malformed, stats.rate_limited, stats.succeeded) == (1, 1, 1, 1)


@pytest.mark.parametrize("kind", KINDS)
async def test_wrong_key_is_authentication(server: MockServer, kind: str) -> None:
    strategy = build(kind, server, api_key="sk-wrong-key-123")
    await strategy.prepare()
    try:
        error, verdict = await failure(strategy, "hi")
    finally:
        await strategy.cleanup()
    assert (verdict.category, verdict.status_code) == (ErrorCategory.AUTHENTICATION, 401)
    assert kind == "compatible" or isinstance(error, openai.AuthenticationError)
    assert "sk-wrong-key-123" not in str(error)


@pytest.mark.parametrize("kind", KINDS)
async def test_hang_hits_the_callers_deadline_and_leaks_no_connection(server: MockServer, kind: str) -> None:
    strategy = build(kind, server)
    await strategy.prepare()
    try:
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.3):
                await strategy.execute("[[hang]]", 1, None)
        stats = await server.wait_for(lambda s: s.disconnects == 1)
        assert (stats.hangs, stats.in_flight) == (1, 0)
        assert pool_statistics(http_client_of(strategy)).active == 0
        assert (await strategy.execute("next", 1, None))[0] == "echo: next"
    finally:
        await strategy.cleanup()


@pytest.mark.parametrize("kind", KINDS)
async def test_cancel_mid_request_leaks_no_connection(server: MockServer, kind: str) -> None:
    strategy = build(kind, server, concurrency=4)
    await strategy.prepare()
    try:
        client = http_client_of(strategy)
        await strategy.execute("warm the pool", 1, None)
        assert pool_statistics(client).idle == 1
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(strategy.execute, f"[[latency:60]] slow {i}", 1, None)
            await server.wait_for(lambda s: s.in_flight == 3)
            assert pool_statistics(client).active == 3
            tg.cancel_scope.cancel(reason="test cancels mid-request")
        # cancellation closed the three half-used connections on the way out: none stays checked out
        after = pool_statistics(client)
        assert (after.active, after.connections) == (0, after.idle)
        stats = await server.wait_for(lambda s: s.in_flight == 0)
        assert stats.disconnects == 3
        assert (await strategy.execute("after the cancel", 1, None))[0] == "echo: after the cancel"
    finally:
        await strategy.cleanup()
    assert pool_statistics(client).connections == 0


async def test_read_timeout_is_timeout(server: MockServer) -> None:
    strategy = build("compatible", server, timeout=0.2)
    informational = build("sdk", server)
    await strategy.prepare()
    await informational.prepare()
    try:
        assert (await failure(strategy, "[[hang]] a"))[1].category is ErrorCategory.TIMEOUT
        error, verdict = await failure(informational, "[[hang]] b", 0.2)  # the engine's informational timeout
        assert isinstance(error, openai.APITimeoutError)
        assert verdict.category is ErrorCategory.TIMEOUT
    finally:
        await strategy.cleanup()
        await informational.cleanup()
    await server.wait_for(lambda s: s.disconnects == 2)


@pytest.mark.parametrize("kind", KINDS)
async def test_connection_refused_is_transient(kind: str) -> None:
    async with serve_mock() as stopped:
        pass
    strategy = build(kind, stopped)
    await strategy.prepare()
    try:
        error, verdict = await failure(strategy, "anyone there?")
    finally:
        await strategy.cleanup()
    assert verdict.category is ErrorCategory.TRANSIENT
    assert kind == "compatible" or isinstance(error, openai.APIConnectionError)


async def test_server_enforced_rpm_gives_rate_limit_with_retry_after() -> None:
    async with serve_mock(MockServerConfig(rpm_limit=2)) as server:
        strategy = build("compatible", server)
        await strategy.prepare()
        try:
            for i in range(2):
                await strategy.execute(f"p{i}", 1, None)
            _, verdict = await failure(strategy, "p2")
        finally:
            await strategy.cleanup()
        stats = server.stats
    assert (verdict.category, verdict.status_code) == (ErrorCategory.RATE_LIMIT, 429)
    assert verdict.retry_after is not None
    assert 59.0 < verdict.retry_after <= 60.0  # retry-after-ms: the exact wait, rounded up to a millisecond
    assert (stats.rate_limited_enforced, stats.max_served_per_window) == (1, 2)


async def test_concurrency_sizes_the_connection_pool() -> None:
    async with serve_mock() as server:
        strategy = build("compatible", server, concurrency=2)
        await strategy.prepare()
        try:
            async with anyio.create_task_group() as tg:
                for i in range(6):
                    tg.start_soon(strategy.execute, f"[[latency:0.05]] {i}", 1, None)
        finally:
            await strategy.cleanup()
        stats = server.stats
    assert (stats.succeeded, stats.max_in_flight) == (6, 2)


async def test_equal_strategies_share_one_pool(server: MockServer) -> None:
    first, second = build("compatible", server), build("compatible", server)
    await first.prepare()
    await second.prepare()
    try:
        assert first._client_for_call() is second._client_for_call()
        await first.execute("a", 1, None)
        await second.execute("b", 1, None)
        assert pool_statistics(first._client_for_call()).connections == 1  # one keep-alive connection reused
    finally:
        await first.cleanup()
        await second.cleanup()


@pytest.mark.parametrize("kind", KINDS)
async def test_key_never_reaches_logs(
    server: MockServer, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    strategy = build(kind, server)
    await strategy.prepare()
    try:
        await strategy.execute("logged call", 1, None)
        await failure(strategy, "[[fail:429]] logged failure")
    finally:
        await strategy.cleanup()
    assert caplog.records  # httpx2 and the SDK did log the calls ...
    assert KEY not in caplog.text  # ... without the key
