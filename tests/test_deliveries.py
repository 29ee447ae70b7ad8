"""Regression tests for how a close counts cancellation deliveries (CONTRACT C3), issue 16 case 3.

Case 3 (asyncio): the first delivery is the cancellation of a scope around the
call (a deadline of ``move_on_after``/``fail_after``, or a ``CancelScope``
cancelled by hand), the close hangs in a strategy's ``cleanup()``, and then a
native ``Task.cancel()`` arrives. That second delivery forces the close and
must propagate *past* the caller's scope: the task ends cancelled, and code
after the scope never runs. Every entry point and every owner, with the first
delivery landing before the close and during it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
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
    RetryState,
    TokenUsage,
    call,
    call_result,
    process_prompts,
    process_stream,
)

from .conftest import ASYNCIO_ONLY

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[1]


class HangingCleanup(LLMCallStrategy[str]):
    """``execute`` answers at once (or hangs, ``execute_hangs``); ``cleanup`` hangs until released."""

    def __init__(self, *, execute_hangs: bool = False) -> None:
        self.execute_hangs = execute_hangs
        self.working = anyio.Event()
        self.cleanup_started = anyio.Event()
        self.release = anyio.Event()
        self.cleanup_cancelled = False
        self.cleanup_finished = False

    async def execute(
        self, prompt: str, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[str, TokenUsage | None, Any]:
        self.working.set()
        if self.execute_hangs:
            await anyio.sleep_forever()
        await anyio.lowlevel.checkpoint()
        return f"out:{prompt}", None, None

    async def cleanup(self) -> None:
        self.cleanup_started.set()
        try:
            await self.release.wait()
        except anyio.get_cancelled_exc_class():
            self.cleanup_cancelled = True
            raise
        self.cleanup_finished = True


async def _lazy(prompts: list[str]) -> Any:
    for prompt in prompts:
        await anyio.lowlevel.checkpoint()
        yield prompt


async def _use_process_prompts(strategy: HangingCleanup) -> None:
    await process_prompts(strategy, ["a", "b"])


async def _use_process_prompts_lazy(strategy: HangingCleanup) -> None:
    await process_prompts(strategy, _lazy(["a", "b"]))


async def _use_process_stream(strategy: HangingCleanup) -> None:
    async with process_stream(strategy, ["a", "b"]) as results:
        async for _ in results:
            pass


async def _use_call(strategy: HangingCleanup) -> None:
    await call(strategy, "a")


async def _use_call_result(strategy: HangingCleanup) -> None:
    await call_result(strategy, "a")


async def _use_processor(strategy: HangingCleanup) -> None:
    async with ParallelBatchProcessor[str]() as proc:
        await proc.add_work(LLMWorkItem(item_id="a", strategy=strategy, prompt="a"))
        await proc.process_all()


async def _use_pool(strategy: HangingCleanup) -> None:
    async with LLMCallPool(strategy) as pool:
        await pool.submit_result("a")


async def _use_host(strategy: HangingCleanup) -> None:
    async with ExecutorHost() as host:
        await host.ensure_prepared(strategy)  # its lease is the hanging close step
        strategy.working.set()
        if strategy.execute_hangs:
            await anyio.sleep_forever()


ENTRY_POINTS: dict[str, Callable[[HangingCleanup], Awaitable[None]]] = {
    "process_prompts": _use_process_prompts,
    "process_prompts_lazy": _use_process_prompts_lazy,
    "process_stream": _use_process_stream,
    "call": _use_call,
    "call_result": _use_call_result,
    "ParallelBatchProcessor": _use_processor,
    "LLMCallPool": _use_pool,
    "ExecutorHost": _use_host,
}


def _enclosing_scope(kind: str) -> Any:
    if kind == "move_on_after":
        return anyio.move_on_after(3600)
    if kind == "fail_after":
        return anyio.fail_after(3600)
    return anyio.CancelScope()


def _first_delivery(scope: anyio.CancelScope, kind: str) -> None:
    if kind == "cancel_scope":
        scope.cancel()
    else:
        scope.deadline = anyio.current_time()  # the deadline itself expires (anyio's timer path)


async def _settle() -> None:
    for _ in range(50):
        await anyio.lowlevel.checkpoint()


@ASYNCIO_ONLY
@pytest.mark.parametrize("first", ["before_close", "during_close"])
@pytest.mark.parametrize("scope_kind", ["move_on_after", "fail_after", "cancel_scope"])
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
async def test_rel3_second_native_cancel_propagates_past_the_callers_scope(
    entry: str, scope_kind: str, first: str, caplog: pytest.LogCaptureFixture
) -> None:
    strategy = HangingCleanup(execute_hangs=first == "before_close")
    scopes: list[anyio.CancelScope] = []
    reached: list[str] = []

    async def caller() -> None:
        with _enclosing_scope(scope_kind) as scope:
            scopes.append(scope)
            await ENTRY_POINTS[entry](strategy)
            reached.append("end of block")  # pragma: no cover - the first delivery cancels the block
        reached.append("after the block")

    task = asyncio.get_running_loop().create_task(caller())
    try:
        if first == "before_close":
            await strategy.working.wait()
            _first_delivery(scopes[0], scope_kind)  # cancels the work; the close starts cancelled
            await strategy.cleanup_started.wait()
        else:
            await strategy.cleanup_started.wait()
            _first_delivery(scopes[0], scope_kind)  # lands while the close hangs
        await _settle()
        assert not task.done(), "the first delivery must be deferred while the close runs"
        task.cancel()  # the second delivery: a native Task.cancel() of the closing task
        await asyncio.wait({task}, timeout=10)  # the timeout is a failsafe only: the abort is immediate
    finally:
        strategy.release.set()
    assert task.cancelled(), f"the task must end cancelled; it ended with {task!r}"
    assert reached == [], "code after the caller's scope ran: the second delivery was swallowed"
    assert strategy.cleanup_cancelled and not strategy.cleanup_finished  # the close was forced
    aborted = [r.getMessage() for r in caplog.records if "close aborted" in r.getMessage()]
    assert len(aborted) == 1 and "Task.cancel()" in aborted[0]


@pytest.mark.parametrize("scope_kind", ["move_on_after", "cancel_scope"])
async def test_rel3_a_cancellation_during_the_close_is_counted_when_it_happens(scope_kind: str) -> None:
    """Both backends: the caller's scope, cancelled while a cleanup hangs, is the first delivery at once.

    So the next delivery (here ``force_close()``) is a second one and forces;
    with nothing native in play, the caller's scope then ends its own
    cancellation as usual.
    """
    strategy = HangingCleanup()
    proc = ParallelBatchProcessor[str]()
    reached: list[str] = []
    scopes: list[anyio.CancelScope] = []

    async def caller() -> None:
        with _enclosing_scope(scope_kind) as scope:
            scopes.append(scope)
            async with proc:
                await proc.add_work(LLMWorkItem(item_id="a", strategy=strategy, prompt="a"))
                await proc.process_all()
        reached.append("after the block")

    async with anyio.create_task_group() as tg:
        tg.start_soon(caller)
        try:
            await strategy.cleanup_started.wait()
            assert proc.host.ledger.statistics().deliveries == 0
            _first_delivery(scopes[0], scope_kind)
            await _settle()
            assert proc.host.ledger.statistics().deliveries == 1  # counted now, not after the close
            assert not reached
            proc.force_close()
        finally:
            strategy.release.set()
    assert reached == ["after the block"] and scopes[0].cancelled_caught
    assert strategy.cleanup_cancelled and proc.state == "closing"
    assert proc.host.ledger.statistics().deliveries == 2


@ASYNCIO_ONLY
@pytest.mark.parametrize("scope_kind", ["move_on_after", "fail_after", "cancel_scope"])
async def test_first_delivery_alone_still_ends_in_the_callers_scope(scope_kind: str) -> None:
    """The counterpart: the deferred first delivery alone ends in the caller's scope, as before."""
    strategy = HangingCleanup()
    reached: list[str] = []

    async def caller() -> None:
        try:
            with _enclosing_scope(scope_kind) as scope:
                async with ParallelBatchProcessor[str]() as proc:
                    await proc.add_work(LLMWorkItem(item_id="a", strategy=strategy, prompt="a"))
                    await proc.process_all()
                    _first_delivery(scope, scope_kind)
            reached.append("after the block")
        except TimeoutError:
            reached.append("TimeoutError")

    task = asyncio.get_running_loop().create_task(caller())
    await strategy.cleanup_started.wait()
    await _settle()
    assert not task.done()
    strategy.release.set()
    await task
    assert strategy.cleanup_finished
    assert reached == ["TimeoutError" if scope_kind == "fail_after" else "after the block"]

