"""async-batch-llm's example_gateway.py, changed only as the guide lists.

Its MockAgent becomes a CallableStrategy; asyncio.gather and create_task become
a task group, so the example runs on Trio and asyncio alike.
"""

import asyncio
from dataclasses import dataclass

import anyio

from trio_batch_llm import (
    CallableStrategy,
    LLMCallError,
    LLMCallPool,
    ProcessorConfig,
    RateLimitConfig,
    RetryConfig,
)
from trio_batch_llm.testing import FakeRateLimitError


@dataclass
class Reply:
    text: str


def mock_model(
    latency: float, rate_limit_on_call: int | None = None
) -> CallableStrategy[Reply]:
    calls = 0

    async def model(prompt: str) -> Reply:
        nonlocal calls
        calls += 1
        if calls == rate_limit_on_call:
            raise FakeRateLimitError()
        await anyio.sleep(latency)
        return Reply(text=f"answer to: {prompt}")

    return CallableStrategy(model)


def build_pool() -> LLMCallPool[Reply]:
    config = ProcessorConfig(
        max_workers=4,
        rate_limit=RateLimitConfig(cooldown_seconds=0.1),
        retry=RetryConfig(max_attempts=3, max_rate_limit_retries=5),
    )
    return LLMCallPool(mock_model(0.05, rate_limit_on_call=3), config=config)


async def handle_request(pool: LLMCallPool[Reply], n: int) -> None:
    reply = await pool.submit(f"request #{n}")
    print(f"  request #{n} -> {reply.text!r}")


async def main() -> None:
    async with build_pool() as pool:
        print("Dispatching 8 concurrent requests through the shared call pool...")
        async with anyio.create_task_group() as tg:
            for n in range(8):
                tg.start_soon(handle_request, pool, n)
        result = await pool.submit_result("one more, please")
        print(f"submit_result() -> success={result.success}")

    try:
        await pool.submit("too late")
    except Exception as exc:  # noqa: BLE001 - shows what a closed pool says
        print(f"submit after close -> {type(exc).__name__}")

    print("Load-shedding knobs:")
    slow = mock_model(0.3)
    one = ProcessorConfig(max_workers=1)
    pool = LLMCallPool(slow, config=one, max_pending=0)
    async with pool, anyio.create_task_group() as tg:
        tg.start_soon(pool.submit_result, "holds the slot")
        await anyio.sleep(0.05)
        rejected = await pool.submit_result("over the cap")
        print(f"  over-cap submit -> success={rejected.success}")
    two = ProcessorConfig(max_workers=2)
    async with LLMCallPool(slow, config=two, submit_timeout=0.05) as pool:
        timed_out = await pool.submit_result("too slow for the budget")
        print(f"  timed-out submit -> success={timed_out.success}")
    try:
        async with LLMCallPool(slow, config=two, submit_timeout=0.05) as pool:
            await pool.submit("too slow, raised")
    except LLMCallError as exc:
        category = exc.result and exc.result.error_category
        print(f"  submit() raises LLMCallError -> {category}")


if __name__ == "__main__":
    asyncio.run(main())
