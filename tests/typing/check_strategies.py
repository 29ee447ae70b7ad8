"""Type-checked (not run): strategy types infer and compose as users write them."""

from __future__ import annotations

from typing import assert_type

from trio_batch_llm import CallableStrategy, CallOutcome, FakeStrategy, LLMCallStrategy, call, process_prompts


async def plain(prompt: str) -> int:
    return len(prompt)


async def with_usage(prompt: str) -> CallOutcome[str]:
    return CallOutcome(prompt, token_usage={"total_tokens": 1})


async def use() -> None:
    assert_type(CallableStrategy(plain), CallableStrategy[int])
    assert_type(CallableStrategy(with_usage), CallableStrategy[str])
    # Covariance: a str strategy is usable where any strategy is expected.
    general: LLMCallStrategy[object] = FakeStrategy()
    print(await call(FakeStrategy(), "p"), general)
    batch = await process_prompts(CallableStrategy(with_usage), ["a"])
    assert_type(batch.outputs(), list[str | None])
