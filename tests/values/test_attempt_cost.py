"""Per-attempt usage and cost on AttemptTiming: each call of a retried item carries its own tokens and
cost (a failed call's from its exception), and they add up to the item's (both backends)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from trio_batch_llm import (
    DEFAULT_MODEL_RATES,
    AttemptTiming,
    BatchResult,
    GuardrailConfig,
    LLMCallStrategy,
    ProcessorConfig,
    RetryConfig,
    RetryState,
    call_result,
)
from trio_batch_llm._values._categories import ErrorCategory
from trio_batch_llm._values._errors import ProviderError
from trio_batch_llm._values._usage import add_usage

pytestmark = pytest.mark.anyio

_FIRST = {"input_tokens": 100, "output_tokens": 20}  # a 500 that was billed
_SECOND = {"input_tokens": 200, "output_tokens": 40, "total_tokens": 240}  # answered, did not parse
_THIRD = {"input_tokens": 300, "cached_input_tokens": 100, "output_tokens": 60, "total_tokens": 360}


class _ThreeCalls(LLMCallStrategy[str]):
    """Fails with billed usage, then answers something that does not parse, then answers."""

    def __init__(self, model: str = "gpt-4o-mini") -> None:
        self.model = model

    @property
    def model_name(self) -> str:
        return self.model

    async def execute(self, prompt: str, attempt: int, timeout: float | None,
                      state: RetryState | None = None) -> tuple[str, dict[str, int], dict[str, Any]]:
        await anyio.lowlevel.checkpoint()
        if attempt == 1:
            raise ProviderError("overloaded", category=ErrorCategory.SERVER, token_usage=_FIRST)
        if attempt == 2:
            return "not json", dict(_SECOND), {"model": self.model}
        return "ok", dict(_THIRD), {"model": self.model}

    def parse_output(self, raw: Any, metadata: dict[str, Any]) -> str:
        if raw == "not json":
            raise ProviderError("unparseable answer", category=ErrorCategory.PARSE)
        return str(raw)


_RETRY = RetryConfig(max_attempts=3, initial_wait=0.0, jitter=False)


async def test_each_attempt_carries_its_own_usage_and_cost(anyio_backend: Any) -> None:
    result = await call_result(_ThreeCalls(), "p", config=ProcessorConfig(retry=_RETRY))
    assert result.success and result.attempts == 3
    records = result.timing.attempts
    assert [r.attempt for r in records] == [1, 2, 3]
    assert all(isinstance(r, AttemptTiming) for r in records)
    assert [r.token_usage for r in records] == [_FIRST, _SECOND, _THIRD]
    assert [(r.input_tokens, r.output_tokens, r.cached_input_tokens) for r in records] == \
        [(100, 20, None), (200, 40, None), (300, 60, 100)]
    rates = DEFAULT_MODEL_RATES["gpt-4o-mini"]  # 0.15 in, 0.60 out, 0.075 cached per million
    assert [r.cost for r in records] == pytest.approx([
        (100 * 0.15 + 20 * 0.60) / 1e6,
        (200 * 0.15 + 40 * 0.60) / 1e6,
        (200 * 0.15 + 100 * 0.075 + 60 * 0.60) / 1e6,
    ])
    assert rates.cost(_THIRD) == pytest.approx(records[2].cost)
    # they add up to the item's usage and the item's estimated cost
    summed: dict[str, int] = {}
    for record in records:
        add_usage(summed, record.token_usage)
    assert summed == result.token_usage
    costs = [r.cost for r in records]
    assert all(c is not None for c in costs)
    assert sum(c for c in costs if c is not None) == pytest.approx(
        BatchResult.from_results([result]).estimated_cost())


async def test_the_configs_cost_function_prices_each_attempt(anyio_backend: Any) -> None:
    def dollars(usage: Any) -> float:
        return usage.get("input_tokens", 0) / 1000

    config = ProcessorConfig(retry=_RETRY, guardrails=GuardrailConfig(cost_function=dollars))
    result = await call_result(_ThreeCalls(model="no-such-model"), "p", config=config)
    assert [r.cost for r in result.timing.attempts] == pytest.approx([0.1, 0.2, 0.3])


async def test_an_attempt_without_usage_or_rates_has_no_cost(anyio_backend: Any) -> None:
    result = await call_result(_ThreeCalls(model="no-such-model"), "p", config=ProcessorConfig(retry=_RETRY))
    assert [r.cost for r in result.timing.attempts] == [None, None, None]  # not in the table: unknown
    bare = AttemptTiming(1, execution=0.5)
    assert (bare.token_usage, bare.input_tokens, bare.cost) == ({}, None, None)
    assert hash(AttemptTiming(1, token_usage=_FIRST)) == hash(AttemptTiming(1))  # still hashable
