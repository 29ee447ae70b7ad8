"""OpenRouter: llm("openrouter:VENDOR/MODEL"), its key rule and headers, and errors inside an HTTP 200 body.

No sockets: httpx2.MockTransport stands in for openrouter.ai (and for a gateway
at a mock base URL), so the default base URL is exercised without network.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import openai
import pytest

from trio_batch_llm import (
    ConfigurationError,
    ErrorCategory,
    OpenRouterErrorClassifier,
    ProcessorConfig,
    ProviderError,
    RateLimitConfig,
    RetryConfig,
    process_prompts,
)
from trio_batch_llm._engine._classify import classify
from trio_batch_llm._strategies._factory import llm
from trio_batch_llm._strategies.openai._compatible import OpenAICompatibleStrategy
from trio_batch_llm._strategies.openai._sdk import OpenAIStrategy
from trio_batch_llm.mock import MockServerConfig, serve_mock

pytestmark = pytest.mark.anyio

ROUTER_KEY = "sk-or-v1-ROUTER-secret-0123456789"
NAMED_KEY = "sk-gateway-NAMED-0123456789"
MOCK_BASE = "http://mock.test/v1"
CHAT_OK = {
    "id": "gen-1", "model": "openai/gpt-4o-mini", "object": "chat.completion", "created": 1,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
}


class Recorder:
    def __init__(self, *responses: httpx2.Response) -> None:
        self.responses = list(responses)
        self.requests: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        return self.responses[min(len(self.requests), len(self.responses)) - 1]


def router(recorder: Recorder, model: str = "openai/gpt-4o-mini", **kwargs: Any) -> OpenAICompatibleStrategy:
    client = httpx2.AsyncClient(transport=httpx2.MockTransport(recorder))
    strategy = llm(f"openrouter:{model}", client=client, **kwargs)
    assert isinstance(strategy, OpenAICompatibleStrategy)
    return strategy


async def failure(strategy: OpenAICompatibleStrategy | OpenAIStrategy) -> Exception:
    with pytest.raises(Exception) as info:
        await strategy.execute("p", 1, None)
    return info.value


def in_body(code: object, message: str = "upstream said no", **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


# -- the strategy, its key and headers --------------------------------------------------------


async def test_openrouter_is_the_compatible_strategy_at_openrouter_with_its_key_and_headers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENROUTER_API_KEY", ROUTER_KEY)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-MUST-NOT-GO-0123456789")
    rec = Recorder(httpx2.Response(200, json=CHAT_OK))
    strategy = router(rec, http_referer="https://example.org/app", x_title="My batch")
    assert strategy.base_url == "https://openrouter.ai/api/v1"
    assert strategy.model == "openai/gpt-4o-mini"
    text, usage, _ = await strategy.execute("hello", 1, None)
    assert text == "hi" and usage is not None and usage["input_tokens"] == 5
    (request,) = rec.requests
    assert str(request.url) == "https://openrouter.ai/api/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {ROUTER_KEY}"
    assert request.headers["http-referer"] == "https://example.org/app"
    assert request.headers["x-title"] == "My batch"
    assert json.loads(request.content)["model"] == "openai/gpt-4o-mini"
    assert ROUTER_KEY not in repr(strategy)


async def test_openrouter_key_is_not_sent_to_another_base_url_unless_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENROUTER_API_KEY", ROUTER_KEY)
    monkeypatch.setenv("GATEWAY_KEY", NAMED_KEY)
    unauthorized = httpx2.Response(401, json={"error": {"code": 401, "message": "No auth credentials found"}})
    rec = Recorder(unauthorized)
    strategy = router(rec, base_url=MOCK_BASE)
    error = await failure(strategy)
    assert "authorization" not in rec.requests[0].headers
    assert isinstance(error, ProviderError) and error.category is ErrorCategory.AUTHENTICATION
    assert "OPENROUTER_API_KEY goes only to https://openrouter.ai" in str(error)
    assert ROUTER_KEY not in str(error)

    named = Recorder(httpx2.Response(200, json=CHAT_OK))
    await router(named, base_url=MOCK_BASE, api_key_env="GATEWAY_KEY").execute("p", 1, None)
    assert named.requests[0].headers["authorization"] == f"Bearer {NAMED_KEY}"

    unset = Recorder(unauthorized)
    error = await failure(router(unset, base_url=MOCK_BASE, api_key_env="NOT_SET_ANYWHERE"))
    assert "NOT_SET_ANYWHERE (api_key_env=) is not set" in str(error)


def test_openrouter_model_names_vendor_and_model() -> None:
    with pytest.raises(ConfigurationError, match=r"model.*'gpt-4o-mini'.*VENDOR/NAME"):
        llm("openrouter:gpt-4o-mini")
    with pytest.raises(ConfigurationError, match="x_title"):
        llm("openrouter:openai/gpt-4o-mini", x_title="")


# -- errors inside an HTTP 200 body, and OpenRouter's statuses ----------------------------------


async def test_a_429_inside_a_200_body_is_a_rate_limit_with_the_headers_wait() -> None:
    answer = httpx2.Response(200, json=in_body(429, "Rate limit exceeded"), headers={"retry-after": "7"})
    rec = Recorder(answer)
    error = await failure(router(rec, api_key=ROUTER_KEY))
    assert isinstance(error, ProviderError)
    assert (error.category, error.retry_after, error.status_code) == (ErrorCategory.RATE_LIMIT, 7.0, 429)
    assert "inside an HTTP 200 answer" in str(error) and "Rate limit exceeded" in str(error)
    verdict = classify(error)
    assert verdict.category is ErrorCategory.RATE_LIMIT and verdict.retry_after == 7.0


@pytest.mark.parametrize(
    ("body", "category"),
    [
        (in_body(400, "bad request"), ErrorCategory.INVALID_REQUEST),
        (in_body("502", "provider down"), ErrorCategory.SERVER),
        (in_body("no_provider_available", "No provider available"), ErrorCategory.SERVER),
        (in_body(None, "something broke"), ErrorCategory.SERVER),
    ],
)
async def test_every_endpoint_treats_a_200_error_body_without_choices_as_a_failure(
    body: dict[str, Any], category: ErrorCategory
) -> None:
    rec = Recorder(httpx2.Response(200, json=body))
    client = httpx2.AsyncClient(transport=httpx2.MockTransport(rec))
    strategy = OpenAICompatibleStrategy("m", base_url=MOCK_BASE, client=client, api_key=NAMED_KEY)
    error = await failure(strategy)
    assert isinstance(error, ProviderError) and error.category is category, error
    assert error.stops_batch is None


async def test_the_sdk_strategy_also_refuses_a_200_error_body() -> None:
    rec = Recorder(httpx2.Response(200, json=in_body(429, "Rate limit exceeded")))
    http = httpx2.AsyncClient(transport=httpx2.MockTransport(rec))
    client = openai.AsyncOpenAI(api_key=NAMED_KEY, base_url=MOCK_BASE, http_client=http, max_retries=0)
    error = await failure(OpenAIStrategy("m", client=client))
    assert isinstance(error, ProviderError) and error.category is ErrorCategory.RATE_LIMIT


async def test_502_no_provider_available_is_retried() -> None:
    body = in_body(502, "No provider available", metadata={"reason": "no_provider_available"})
    error = await failure(router(Recorder(httpx2.Response(502, json=body)), api_key=ROUTER_KEY))
    assert isinstance(error, ProviderError) and error.category is ErrorCategory.SERVER
    assert error.category.retryable and classify(error).category is ErrorCategory.SERVER


@pytest.mark.parametrize("status", [200, 402])
async def test_insufficient_credits_stops_the_batch(status: int) -> None:
    body = in_body(402, "Insufficient credits. Add more using https://openrouter.ai/credits")
    error = await failure(router(Recorder(httpx2.Response(status, json=body)), api_key=ROUTER_KEY))
    assert isinstance(error, ProviderError) and error.category is ErrorCategory.INSUFFICIENT_BALANCE
    assert error.stops_batch is not None and "402" in error.stops_batch
    verdict = classify(error)
    assert verdict.category is ErrorCategory.INSUFFICIENT_BALANCE and verdict.stops_batch == error.stops_batch


# -- the classifier object ---------------------------------------------------------------------


class BodyError(Exception):
    """An exception shaped like an SDK's status error: ``status_code`` and the decoded ``body``."""

    def __init__(self, status_code: int, body: Any) -> None:
        super().__init__(f"status {status_code}")
        self.status_code = status_code
        self.body = body


@pytest.mark.parametrize(
    ("exc", "category", "retryable", "rate_limit"),
    [
        (BodyError(200, in_body(429)), "rate_limit", True, True),
        (BodyError(200, {"code": "429", "message": "inner object"}), "rate_limit", True, True),
        (BodyError(402, in_body(402)), "insufficient_balance", False, False),
        (BodyError(200, in_body("no_provider_available")), "server", True, False),
        (BodyError(502, in_body(502)), "server", True, False),
        (BodyError(400, in_body(400)), "invalid_request", False, False),
        (BodyError(503, "plain text"), "server", True, False),  # no OpenRouter body: the built-in rules
    ],
)
def test_openrouter_error_classifier(
    exc: Exception, category: str, retryable: bool, rate_limit: bool
) -> None:
    info = OpenRouterErrorClassifier().classify(exc)
    assert (info.error_category, info.is_retryable, info.is_rate_limit) == (category, retryable, rate_limit)
    assert (info.hint is not None) == (category == "insufficient_balance")  # why the batch stops


# -- against the mock's OpenRouter flavour, through the engine ----------------------------------

MOCK_KEY = "sk-or-mock-KEY-0123456789"
FAST = ProcessorConfig(concurrency=4, retry=RetryConfig(max_attempts=3, initial_wait=0.0, max_wait=0.0),
                       rate_limit=RateLimitConfig(cooldown_seconds=0.05, slow_start_seconds=0.0))


async def test_the_engine_retries_openrouters_error_in_200_and_no_provider() -> None:
    async with serve_mock(MockServerConfig(api_key=MOCK_KEY)) as server:
        strategy = llm("openrouter:vendor/mock-model", base_url=server.base_urls["openai"], api_key=MOCK_KEY)
        prompts = ["a [[error_in_200:429x1]]", "b [[no_provider:502x1]]", "c plain"]
        batch = await process_prompts(strategy, prompts, config=FAST)
    by_prompt = {r.item_id: r for r in batch.results}
    assert [r.success for r in batch.results] == [True, True, True], [r.error for r in batch.results]
    assert sorted(r.attempts for r in by_prompt.values()) == [1, 2, 2]
    assert all(str(r.output).startswith("echo:") for r in batch.results)
    assert server.stats.rate_limited == 1 and server.stats.server_errors == 1


async def test_spent_credits_inside_a_200_end_the_item_unretried() -> None:
    async with serve_mock(MockServerConfig(api_key=MOCK_KEY)) as server:
        strategy = llm("openrouter:vendor/mock-model", base_url=server.base_urls["openai"], api_key=MOCK_KEY)
        batch = await process_prompts(strategy, ["a [[error_in_200:402]]"], config=FAST)
    (result,) = batch.results
    assert not result.success and result.attempts == 1
    assert result.error_category is ErrorCategory.INSUFFICIENT_BALANCE
    assert "inside an HTTP 200 answer" in str(result.error) and MOCK_KEY not in str(result.error)
