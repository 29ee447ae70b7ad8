"""AnthropicStrategy end to end against the served mock's Anthropic route (real loopback HTTP, both backends).

The mock answers Anthropic's Messages dialect from Anthropic's documented format and imports
nothing from our client, so a wire mistake of the client fails here. Waits are on the
engine's results, never on wall-clock sleeps.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel

from trio_batch_llm import (
    AnthropicStrategy,
    ErrorCategory,
    ProcessorConfig,
    RateLimitConfig,
    RetryConfig,
    StopReason,
    call,
    process_prompts,
    process_stream,
)
from trio_batch_llm.mock import MockServer, MockServerConfig, serve_mock

pytestmark = pytest.mark.anyio

KEY = "sk-ant-mock-KEY-0042"
FAST = ProcessorConfig(concurrency=4, retry=RetryConfig(max_attempts=3, initial_wait=0.0, max_wait=0.0),
                       rate_limit=RateLimitConfig(cooldown_seconds=0.05, slow_start_seconds=0.0))


@pytest.fixture
async def server(anyio_backend: Any) -> AsyncIterator[MockServer]:
    async with serve_mock(MockServerConfig(api_key=KEY, retry_after=0.05)) as running:
        yield running


def claude(server: MockServer, **kwargs: Any) -> AnthropicStrategy:
    return AnthropicStrategy("claude-haiku-4-5", base_url=server.base_urls["anthropic"], api_key=KEY,
                             **kwargs)


class Verdict(BaseModel):
    label: str
    score: int


async def test_process_prompts_stream_and_call(server: MockServer) -> None:
    strategy = claude(server, system_prompt="Be brief.")
    batch = await process_prompts(strategy, ["one", "two", "three"], config=FAST, preserve_order=True)
    assert batch.succeeded == 3
    for result in batch.results:
        assert isinstance(result.output, str) and result.output
        assert result.token_usage["input_tokens"] > 0 and result.token_usage["output_tokens"] > 0
        assert result.metadata["stop_reason"] == "end_turn"
    seen = 0
    async with process_stream(strategy, [f"s{i}" for i in range(5)], concurrency=2) as results:
        async for result in results:
            assert result.success
            seen += 1
    assert seen == 5
    assert isinstance(await call(strategy, "just one", config=FAST), str)


async def test_structured_output_validated_and_a_violation_retried(server: MockServer) -> None:
    strategy = claude(server, response_model=Verdict)
    batch = await process_prompts(strategy, ["rate this", "[[schema_violationx1]] rate that"], config=FAST,
                                  preserve_order=True)
    first, second = batch.results
    assert first.success and isinstance(first.output, Verdict) and first.attempts == 1
    assert second.success and isinstance(second.output, Verdict) and second.attempts == 2


async def test_a_429_then_success_and_a_529_retried(server: MockServer) -> None:
    batch = await process_prompts(claude(server), ["[[fail:429x1]] limited", "[[fail:529x1]] overloaded"],
                                  config=FAST, preserve_order=True)
    limited, overloaded = batch.results
    assert (limited.success, limited.attempts) == (True, 2)
    assert (overloaded.success, overloaded.attempts) == (True, 2)


async def test_a_spend_limit_is_insufficient_balance_saying_the_batch_stops(server: MockServer) -> None:
    prompts = ["[[spend_limit]] costly", *(f"later {n}" for n in range(6))]
    batch = await process_prompts(claude(server), prompts, config=ProcessorConfig(concurrency=1),
                                  preserve_order=True)
    result = batch.results[0]
    assert (result.success, result.error_category, result.attempts, result.stop_reason) == \
        (False, ErrorCategory.INSUFFICIENT_BALANCE, 1, StopReason.PROVIDER_RETIRED)
    assert "spend limit" in result.exception.stops_batch  # type: ignore[union-attr]
    # The batch stops at once: nothing after it is called.
    assert batch.termination.kind == "provider_retired" and batch.termination.item_id == result.item_id
    assert [r.error_category for r in batch.results[1:]] == [ErrorCategory.NOT_EXECUTED] * 6


async def test_prompt_caching_writes_the_shared_prefix_once_then_reads_it(server: MockServer) -> None:
    shared = "You review shipping contracts. " * 40
    strategy = claude(server, system_prompt=shared, cache_system_prompt=True)
    batch = await process_prompts(strategy, ["q1", "q2", "q3"], config=ProcessorConfig(concurrency=1),
                                  preserve_order=True)
    usages = [result.token_usage for result in batch.results]
    assert usages[0]["cache_write_input_tokens"] > 0 and usages[0]["cached_input_tokens"] == 0
    prefix = usages[0]["cache_write_input_tokens"]
    later = [(u["cached_input_tokens"], u["cache_write_input_tokens"]) for u in usages[1:]]
    assert later == [(prefix, 0)] * 2
    # input_tokens counts every input token: the cached prefix included.
    assert all(u["input_tokens"] > prefix for u in usages)


async def test_rate_limit_headers_reach_the_result_for_admission(anyio_backend: Any) -> None:
    config = MockServerConfig(api_key=KEY, rpm_limit=50, tpm_limit=40_000, ratelimit_headers=True)
    async with serve_mock(config) as server:
        result = (await process_prompts(claude(server), ["hello"], config=FAST)).results[0]
    assert result.metadata["request_id"] and result.metadata["id"].startswith("msg_")
    reported = result.metadata["rate_limit"]
    assert reported["anthropic-ratelimit-requests-limit"] == "50"
    assert int(reported["anthropic-ratelimit-requests-remaining"]) <= 49


@pytest.mark.parametrize(("prompt", "category"), [
    ("[[context_length]] a very long prompt", ErrorCategory.CONTEXT_LENGTH),
    ("[[reject_schema]] rate this", ErrorCategory.INVALID_REQUEST),
])
async def test_final_errors_are_not_retried(server: MockServer, prompt: str, category: ErrorCategory) -> None:
    batch = await process_prompts(claude(server, response_model=Verdict), [prompt], config=FAST)
    (result,) = batch.results
    assert (result.success, result.error_category, result.attempts) == (False, category, 1)


async def test_a_wrong_key_is_an_authentication_failure_that_shows_no_key(server: MockServer) -> None:
    wrong = "sk-ant-wrong-key-0099"
    strategy = AnthropicStrategy("claude-haiku-4-5", base_url=server.base_urls["anthropic"], api_key=wrong)
    batch = await process_prompts(strategy, ["hi"], config=FAST)
    (result,) = batch.results
    assert (result.success, result.error_category, result.attempts) == \
        (False, ErrorCategory.AUTHENTICATION, 1)
    assert wrong not in str(result.error) and KEY not in str(result.error)
