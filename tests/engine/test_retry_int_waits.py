"""Retry waits given as whole numbers (``initial_wait=0``, ``retry_after=1``) are waits, not results."""

from __future__ import annotations

import anyio
import pytest

from trio_batch_llm import (
    CallableStrategy,
    ErrorCategory,
    ProcessorConfig,
    ProviderError,
    RetryConfig,
    call_result,
    process_prompts,
)

pytestmark = pytest.mark.anyio


async def test_whole_number_backoff_and_retry_after_retry_the_item() -> None:
    seen: dict[str, int] = {}

    async def twice(prompt: str) -> str:
        await anyio.lowlevel.checkpoint()
        seen[prompt] = seen.get(prompt, 0) + 1
        if seen[prompt] == 1:
            after = 0 if prompt == "a" else None
            raise ProviderError("hiccup", category=ErrorCategory.SERVER, retry_after=after)
        return prompt

    retry = RetryConfig(max_attempts=3, initial_wait=0, max_wait=0, jitter=False)
    batch = await process_prompts(CallableStrategy(twice), ["a", "b"], config=ProcessorConfig(retry=retry))
    assert [(r.success, r.attempts) for r in batch.in_input_order()] == [(True, 2), (True, 2)]
    result = await call_result(CallableStrategy(twice), "c", config=ProcessorConfig(retry=retry))
    assert (result.success, result.attempts) == (True, 2)
