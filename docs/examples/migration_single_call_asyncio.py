"""async-batch-llm's example_single_call.py, changed only as the guide lists.

Its MockAgent becomes a CallableStrategy; a 429 is testing.FakeRateLimitError.
"""

import asyncio
from dataclasses import dataclass
from typing import Any

import anyio

from trio_batch_llm import (
    CallableStrategy,
    CallOutcome,
    LLMCallError,
    ProcessorConfig,
    RateLimitConfig,
    RetryConfig,
    call,
    call_result,
)
from trio_batch_llm.testing import FakeRateLimitError


@dataclass
class Summary:
    headline: str
    sentiment: str


def _strategy(
    *, rate_limit_on_call: int | None = None, failure_rate: float = 0.0
) -> CallableStrategy[Summary]:
    calls = 0

    async def model(prompt: str) -> CallOutcome[Summary]:
        nonlocal calls
        calls += 1
        await anyio.sleep(0.02)
        if calls == rate_limit_on_call:
            raise FakeRateLimitError()
        if failure_rate >= 1.0:
            raise RuntimeError("mock failure")
        usage: Any = {"input_tokens": 12, "output_tokens": 8, "total_tokens": 20}
        summary = Summary(headline=f"Re: {prompt[:40]}", sentiment="positive")
        return CallOutcome(summary, token_usage=usage)

    return CallableStrategy(model)


async def main() -> None:
    summary = await call(_strategy(), "Quarterly numbers are up across every region.")
    print(f"call() -> {summary.headline!r} ({summary.sentiment})")

    result = await call_result(_strategy(), "Summarize the all-hands recap.")
    print(
        f"call_result() -> success={result.success}, "
        f"tokens={result.token_usage.get('total_tokens')}"
    )

    cfg = ProcessorConfig(
        rate_limit=RateLimitConfig(cooldown_seconds=0.1),
        retry=RetryConfig(max_attempts=3, max_rate_limit_retries=5),
    )
    recovered = await call(_strategy(rate_limit_on_call=1), "Try me once.", config=cfg)
    print(f"recovered after a 429 -> {recovered.headline!r}")

    two_tries = ProcessorConfig(retry=RetryConfig(max_attempts=2, initial_wait=0.01))
    failed = await call_result(
        _strategy(failure_rate=1.0), "This one always fails.", config=two_tries
    )
    print(
        f"call_result() on failure -> success={failed.success}, "
        f"error={failed.error!r}, exception={type(failed.exception).__name__}"
    )

    # Here call() raises LLMCallError; the provider's exception is its __cause__.
    try:
        await call(
            _strategy(failure_rate=1.0), "This one always fails.", config=two_tries
        )
    except LLMCallError as exc:
        print(f"call() raised LLMCallError -> {exc.result and exc.result.error}")


if __name__ == "__main__":
    asyncio.run(main())
