"""The fixed cost of a close, counted in scheduler rounds (issue 36, point 4).

A close of ten calls used to cost several times a bare task group's stop, whatever N: most of
it was scheduler rounds the close spent on steps with nothing to wait for (a synchronous quota
close in a task of its own, checkpoints in the runtime step after its tasks were gone, a
checkpoint before a strategy's cleanup). Rounds are counted by a task that does nothing but
checkpoint, so the counts are deterministic up to the order of tasks within one round; the
bounds leave that margin and are well below what the close took before (noted per test).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from trio_batch_llm import (
    ExecutorHost,
    LLMCallPool,
    LLMCallStrategy,
    LLMWorkItem,
    ParallelBatchProcessor,
    ProcessorConfig,
)

from ..conftest import ASYNCIO_ONLY

pytestmark = pytest.mark.anyio


class RoundCounter:
    """Counts scheduler rounds: its task checkpoints in a loop, once per round."""

    def __init__(self) -> None:
        self.rounds = 0

    async def tick(self) -> None:
        while True:
            self.rounds += 1
            await anyio.lowlevel.checkpoint()

    async def spent(self, fn: Callable[[], Awaitable[Any]]) -> int:
        before = self.rounds
        await fn()
        return self.rounds - before


@asynccontextmanager
async def counting_rounds() -> AsyncIterator[RoundCounter]:
    counter = RoundCounter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(counter.tick)
        await anyio.lowlevel.checkpoint()
        yield counter
        tg.cancel_scope.cancel()


class Hanging(LLMCallStrategy[str]):
    """Calls that hang until cancelled; ``cleanup()`` checkpoints once, as a client's close would."""

    def __init__(self, expected: int = 0) -> None:
        self.expected = expected
        self.started = 0
        self.in_flight = 0
        self.cleanups = 0
        self.all_started = anyio.Event()

    async def execute(self, prompt: str, attempt: int, timeout: float | None, state: Any = None) -> Any:
        self.started += 1
        self.in_flight += 1
        if self.started == self.expected:
            self.all_started.set()
        try:
            if prompt == "hang":
                await anyio.sleep_forever()
            await anyio.lowlevel.checkpoint()
            return "ok", None, None
        finally:
            self.in_flight -= 1

    async def cleanup(self) -> None:
        self.cleanups += 1
        await anyio.lowlevel.checkpoint()


def _items(strategy: Hanging, count: int, prompt: str) -> list[LLMWorkItem[str]]:
    return [LLMWorkItem(item_id=f"i{i}", strategy=strategy, prompt=prompt) for i in range(count)]


async def test_cancelling_ten_calls_in_flight_closes_in_a_few_rounds() -> None:
    # Before: 17 rounds from the cancel until the processor's block was left (Trio), 19 on
    # asyncio; now 10-12. The floor (a task group of ten hanging tasks) takes 2.
    strategy = Hanging(expected=10)
    proc = ParallelBatchProcessor[str](ProcessorConfig(concurrency=10))

    async def body() -> None:
        async with proc:
            for item in _items(strategy, 110, "hang"):
                await proc.add_work(item)
            await proc.process_all()

    async with counting_rounds() as counter:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(body)
                await strategy.all_started.wait()
                before = counter.rounds
                scope.cancel()
        spent = counter.rounds - before
    assert strategy.in_flight == 0
    assert strategy.cleanups == 1
    assert proc.state == "closed"
    assert proc.host.statistics().runtime_tasks == 0
    assert spent <= 13, f"the close took {spent} scheduler rounds"


@ASYNCIO_ONLY
async def test_a_native_cancel_of_ten_calls_closes_in_a_few_rounds() -> None:
    # An asyncio application cancels the task (Task.cancel()); before: 21 rounds, now 13.
    import asyncio

    strategy = Hanging(expected=10)
    proc = ParallelBatchProcessor[str](ProcessorConfig(concurrency=10))

    async def body() -> None:
        async with proc:
            for item in _items(strategy, 110, "hang"):
                await proc.add_work(item)
            await proc.process_all()

    async with counting_rounds() as counter:
        task = asyncio.ensure_future(body())
        await strategy.all_started.wait()
        before = counter.rounds
        task.cancel()
        await asyncio.wait({task})
        spent = counter.rounds - before
    assert task.cancelled()
    assert strategy.in_flight == 0
    assert strategy.cleanups == 1
    assert proc.state == "closed"
    assert spent <= 14, f"the close took {spent} scheduler rounds"


async def test_leaving_a_finished_batch_closes_in_a_few_rounds() -> None:
    # Ten items done, then the block is left: nothing runs any more, so only the strategy's
    # cleanup is awaited in a task of its own. Before: 14 rounds; now 5.
    strategy = Hanging()
    proc = ParallelBatchProcessor[str](ProcessorConfig(concurrency=10))
    async with counting_rounds() as counter:
        await proc.__aenter__()
        for item in _items(strategy, 10, "ok"):
            await proc.add_work(item)
        batch = await proc.process_all()
        spent = await counter.spent(lambda: proc.__aexit__(None, None, None))
    assert len(batch.results) == 10
    assert strategy.cleanups == 1
    assert proc.state == "closed"
    assert spent <= 6, f"the close took {spent} scheduler rounds"


async def test_a_host_with_nothing_prepared_closes_in_one_or_two_rounds() -> None:
    # Its in-process quota scopes close synchronously: no step task, no task group for steps.
    # Before: 5-6 rounds; now 1-3 (the close's one schedule point, the host's task group exit).
    async with counting_rounds() as counter:
        host = ExecutorHost()
        await host.__aenter__()
        host.quota_scope(Hanging())
        spent = await counter.spent(lambda: host.__aexit__(None, None, None))
    assert host.state == "closed"
    assert spent <= 3, f"the close took {spent} scheduler rounds"


async def test_a_pool_with_nothing_in_flight_closes_without_waiting_for_its_drain() -> None:
    # The pool's drain step has nothing to drain: no task for it. Before: 12 rounds; now 5.
    strategy = Hanging()
    async with counting_rounds() as counter:
        pool = LLMCallPool[str](strategy, config=ProcessorConfig(concurrency=2))
        await pool.__aenter__()
        assert await pool.submit("ok") == "ok"
        spent = await counter.spent(lambda: pool.__aexit__(None, None, None))
    assert strategy.cleanups == 1
    assert pool.state == "closed"
    assert spent <= 6, f"the close took {spent} scheduler rounds"


async def test_a_host_sharing_a_strategy_releases_its_lease_without_a_task() -> None:
    # Not the last holder: the release is bookkeeping, and the strategy's cleanup does not run.
    # Before: 8-9 rounds; now 1-3.
    strategy = Hanging()
    async with counting_rounds() as counter, ExecutorHost() as keeper:
        await keeper.ensure_prepared(strategy)
        host = ExecutorHost()
        await host.__aenter__()
        await host.ensure_prepared(strategy)
        spent = await counter.spent(lambda: host.__aexit__(None, None, None))
        assert host.state == "closed"
        assert strategy.cleanups == 0
    assert strategy.cleanups == 1
    assert spent <= 3, f"the close took {spent} scheduler rounds"
