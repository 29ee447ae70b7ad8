"""PydanticAIStrategy end to end: pydantic-ai's OpenAI model, over the openai SDK, against our served mock.

Real loopback HTTP on 127.0.0.1 only; the SDK is built with ``max_retries=0`` so that every
retry is the engine's. On Trio the strategy refuses at input (pydantic-ai's agent loop is
asyncio-only) and the mock sees no request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from trio_batch_llm import ErrorCategory, ProcessorConfig, PydanticAIStrategy, RetryConfig, process_prompts
from trio_batch_llm.mock import MockServer, MockServerConfig, serve_mock

pytestmark = pytest.mark.anyio

KEY = "sk-mock-pydantic-ai-0042"
FAST = ProcessorConfig(concurrency=4, retry=RetryConfig(max_attempts=2, initial_wait=0.0, max_wait=0.0,
                                                        max_rate_limit_retries=1))


@pytest.fixture
async def server(anyio_backend: Any) -> AsyncIterator[MockServer]:
    async with serve_mock(MockServerConfig(api_key=KEY, retry_after=0.01)) as running:
        yield running


def agent_for(server: MockServer, *, key: str = KEY) -> tuple[Agent[None, str], AsyncOpenAI]:
    client = AsyncOpenAI(base_url=server.base_url, api_key=key, max_retries=0)
    model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(openai_client=client))
    return Agent(model, system_prompt="Be brief."), client


async def test_an_agent_over_the_openai_model_answers_from_the_mock(server: MockServer,
                                                                     anyio_backend: Any) -> None:
    agent, client = agent_for(server)
    strategy = PydanticAIStrategy(agent)
    assert strategy.provider_name == "openai" and strategy.model_name == "gpt-4o-mini"
    assert strategy.quota_scope() == ("pydantic-ai", "openai", "gpt-4o-mini", server.base_url + "/")
    async with client:
        if anyio_backend == "trio":
            with pytest.raises(ValueError, match="Trio"):
                await process_prompts(strategy, ["one"], config=FAST)
            assert server.stats.requests == 0
            return
        batch = await process_prompts(strategy, ["one", "two", "three"], config=FAST, preserve_order=True)
    assert batch.succeeded == 3
    for result, prompt in zip(batch.results, ["one", "two", "three"], strict=True):
        assert isinstance(result.output, str) and prompt in result.output  # the mock echoes the prompt
        assert result.token_usage["input_tokens"] > 0 and result.token_usage["output_tokens"] > 0
    assert server.stats.requests == 3
    sent = server.requests[0].body
    assert sent["model"] == "gpt-4o-mini"
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}


async def test_the_mock_s_refusals_are_filed_by_their_status(server: MockServer, anyio_backend: Any) -> None:
    if anyio_backend == "trio":
        return
    agent, client = agent_for(server, key="sk-wrong-key-0000")
    async with client:
        batch = await process_prompts(PydanticAIStrategy(agent), ["q"], config=FAST)
    result = batch.results[0]
    assert not result.success and result.error_category is ErrorCategory.AUTHENTICATION
    assert isinstance(result.exception, ModelHTTPError) and result.exception.status_code == 401
    assert "sk-wrong-key-0000" not in (result.error or "")


async def test_a_429_from_the_mock_is_a_rate_limit_with_its_retry_after(anyio_backend: Any) -> None:
    if anyio_backend == "trio":
        return
    async with serve_mock(MockServerConfig(api_key=KEY, rate_limit_rate=1.0, retry_after=0.01)) as server:
        agent, client = agent_for(server)
        async with client:
            batch = await process_prompts(PydanticAIStrategy(agent), ["q"], config=FAST)
    result = batch.results[0]
    assert not result.success and result.error_category is ErrorCategory.RATE_LIMIT
    assert isinstance(result.exception, ModelHTTPError) and result.exception.status_code == 429
    assert result.exception.retry_after == pytest.approx(0.01)
    assert server.stats.requests == 2  # the first call and the one rate-limit retry allowed
