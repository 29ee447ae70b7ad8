"""Concurrent ``call()``s on one strategy share its limits within an event loop (issue 21)."""

from __future__ import annotations

import gc
import logging

import anyio
import pytest

from trio_batch_llm import (
    CallableStrategy,
    ErrorCategory,
    LLMCallError,
    ProcessorConfig,
    ProviderError,
    call,
    call_result,
)
from trio_batch_llm._engine._call_limits import call_limits

pytestmark = pytest.mark.anyio


class InFlight:
    """A strategy's function that counts the calls in flight and remembers the most."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self.calls = 0

    async def __call__(self, prompt: str) -> str:
        self.now += 1
        self.calls += 1
        self.peak = max(self.peak, self.now)
        try:
            await anyio.sleep(0.01)
        finally:
            self.now -= 1
        return prompt.upper()


async def gather(n: int, strategy: CallableStrategy[str], config: ProcessorConfig | None) -> list[str]:
    outputs: list[str] = []

    async def one(i: int) -> None:
        outputs.append(await call(strategy, f"p{i}", config=config))

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return outputs


async def test_gathered_calls_share_the_configured_concurrency() -> None:
    counter = InFlight()
    outputs = await gather(10, CallableStrategy(counter), ProcessorConfig(concurrency=4))
    assert sorted(outputs) == sorted(f"P{i}" for i in range(10))
    assert counter.peak == 4  # was 10: each call had limits of its own


async def test_without_a_config_calls_share_the_default_limits() -> None:
    counter = InFlight()
    await gather(12, CallableStrategy(counter), None)
    assert counter.peak == ProcessorConfig().provider_concurrency == 5


async def test_different_strategies_and_different_limits_do_not_share() -> None:
    first, second = InFlight(), InFlight()
    a, b = CallableStrategy(first), CallableStrategy(second)
    async with anyio.create_task_group() as tg:
        tg.start_soon(gather, 6, a, ProcessorConfig(concurrency=2))
        tg.start_soon(gather, 6, a, ProcessorConfig(concurrency=3))
        tg.start_soon(gather, 6, b, ProcessorConfig(concurrency=2))
    assert first.peak == 5 and second.peak == 2


async def test_equal_quota_keys_share_one_scope() -> None:
    counter = InFlight()
    one = CallableStrategy(counter, identity="endpoint-x")
    two = CallableStrategy(counter, identity="endpoint-x")
    async with anyio.create_task_group() as tg:
        tg.start_soon(gather, 5, one, ProcessorConfig(concurrency=3))
        tg.start_soon(gather, 5, two, ProcessorConfig(concurrency=3))
    assert counter.peak == 3


async def test_a_cancelled_caller_frees_its_place() -> None:
    gate = anyio.Event()
    counter = InFlight()

    async def held(prompt: str) -> str:
        await gate.wait()
        return await counter(prompt)

    strategy = CallableStrategy(held)
    config = ProcessorConfig(concurrency=2)
    done: list[str] = []

    async def one(i: int) -> None:
        done.append(await call(strategy, f"p{i}", config=config))

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(one, i)
        with anyio.CancelScope() as cancelled:
            cancelled.cancel()
            await call(strategy, "never", config=config)  # cancelled while it waits for a place
        await anyio.wait_all_tasks_blocked()
        gate.set()
    assert sorted(done) == ["P0", "P1", "P2", "P3"] and counter.peak == 2
    shared = call_limits().shared(strategy, config)
    assert shared is not None
    stats = shared.scope.statistics()
    assert (stats.in_flight, stats.waiting) == (0, 0)


async def test_the_shared_limits_go_with_the_strategy() -> None:
    limits = call_limits()
    before = limits.statistics()
    strategy = CallableStrategy(InFlight())
    await call(strategy, "x", config=ProcessorConfig(concurrency=1))
    assert limits.statistics() == before + 1
    del strategy
    gc.collect()
    assert limits.statistics() == before


async def test_failing_gathered_calls_leave_their_failures_to_their_callers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Each caller holds its failure (call()'s exception, call_result()'s result): DEBUG, no WARNING
    # (issue 35); a pool and a batch keep their one WARNING per category (test_logging_policy).
    caplog.set_level(logging.DEBUG, logger="trio_batch_llm")

    async def refuses(prompt: str) -> str:
        await anyio.lowlevel.checkpoint()
        raise ProviderError("refused", category=ErrorCategory.CONTENT_POLICY)

    strategy = CallableStrategy(refuses)
    failed = 0

    async def one(i: int) -> None:
        nonlocal failed
        try:
            await call(strategy, f"p{i}", config=ProcessorConfig(concurrency=3))
        except LLMCallError:
            failed += 1

    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(one, i)
    assert failed == 8
    result = await call_result(strategy, "again", config=ProcessorConfig(concurrency=3))
    assert result.error_category is ErrorCategory.CONTENT_POLICY
    engine = [r for r in caplog.records if r.name == "trio_batch_llm.engine" and "failed after" in r.message]
    assert [r.levelno for r in engine] == [logging.DEBUG] * 9
