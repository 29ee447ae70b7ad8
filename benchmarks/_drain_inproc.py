"""Drain scenarios without a network: our engine and the bare floors, on any anyio backend.

Every function here runs inside one ``anyio.run`` (see ``_common.run_on``) and
returns one sample: the drain in milliseconds plus what was checked. N calls
are in flight and 10×N items queued behind them when the stop is requested.

- cancel: the enclosing cancel scope (Trio) or the task (asyncio, a native
  ``Task.cancel()``, as an asyncio application would do it) is cancelled.
- graceful: every in-flight call has ``remaining`` seconds left when an item
  fails with an abort category under ``AbortMode.DRAIN_ACTIVE`` (the public
  trigger); the sample is the drain *minus* ``remaining``.
- deadline: the batch deadline expires; the sample is measured from that instant.

Drain ends when the call that owned the work has returned: the ``async with``
around the processor has exited, so workers, timers, progress, strategy
cleanup and (when there is one) the store are done.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import sniffio

from trio_batch_llm import (
    AbortMode,
    CircuitBreakerConfig,
    ErrorCategory,
    GuardrailConfig,
    LLMCallStrategy,
    LLMWorkItem,
    ParallelBatchProcessor,
    ProcessorConfig,
    ProviderError,
)

TRIGGER = "trigger"
QUEUED_PER_CALL = 10


def ours_config(n: int, **options: Any) -> ProcessorConfig:
    """The engine's defaults for N calls in flight, but for the circuit breaker's threshold, raised to N.

    Until an endpoint has answered once, a quota scope lets at most ``threshold`` (10 by default)
    attempts be in flight, for ``pause`` (5 s) at most, so that a dead endpoint costs ten attempts,
    not one per worker. The calls here hang until the stop and never answer, so with the default
    only ten would be in flight for the first 5 s: the deadline rows would drain ten calls, not N
    (their own check said so), and every other row would wait 5 s before its stop. The breaker
    still gates every attempt; only its start-up bound no longer binds.
    """
    return ProcessorConfig(concurrency=n, circuit_breaker=CircuitBreakerConfig(threshold=max(n, 1)), **options)


class HangingStrategy(LLMCallStrategy[str]):
    """Calls that hang (``remaining=None``) or wait for ``go`` and then finish after ``remaining`` s.

    The call whose prompt is ``TRIGGER`` fails with an abort category as soon as ``go`` is set.
    Create it inside the event loop (it holds anyio Events).
    """

    def __init__(self, expected: int, remaining: float | None = None) -> None:
        self.expected = expected
        self.remaining = remaining
        self.started = 0
        self.in_flight = 0
        self.cleanups = 0
        self.all_started = anyio.Event()
        self.all_started_at = float("inf")
        self.go = anyio.Event()

    async def execute(self, prompt: str, attempt: int, timeout: float | None, state: Any = None) -> Any:
        self.started += 1
        self.in_flight += 1
        if self.started == self.expected:
            self.all_started_at = anyio.current_time()
            self.all_started.set()
        try:
            if self.remaining is None:
                await anyio.sleep_forever()
            await self.go.wait()
            if prompt == TRIGGER:
                raise ProviderError("benchmark stop", category=ErrorCategory.INVALID_REQUEST)
            await anyio.sleep(self.remaining)
            return "ok", None, None
        finally:
            self.in_flight -= 1

    async def cleanup(self) -> None:
        self.cleanups += 1
        await anyio.lowlevel.checkpoint()


def _items(strategy: HangingStrategy, n: int, first: str = "p") -> list[LLMWorkItem[str]]:
    total = n * (1 + QUEUED_PER_CALL)
    return [LLMWorkItem(item_id=f"i{i}", strategy=strategy, prompt=first if i == 0 else "p") for i in range(total)]


def _checks(strategy: HangingStrategy, proc: ParallelBatchProcessor[str]) -> dict[str, Any]:
    return {
        "calls_left_running": strategy.in_flight,
        "strategy_cleanups": strategy.cleanups,
        "runtime_tasks_left": proc.host.statistics().runtime_tasks,
        "state": proc.state,
    }


async def cancel_from_outside(body: Callable[[], Awaitable[None]], ready: Callable[[], Awaitable[Any]]) -> float:
    """Start ``body``; once ``await ready()`` returns, cancel it and return ms until it is gone.

    Trio (and anyio's asyncio) style: cancel the enclosing scope. Native asyncio
    (an ``asyncio.run`` application): ``Task.cancel()`` the task running ``body``.
    """
    if sniffio.current_async_library() == "asyncio":
        import asyncio

        task = asyncio.ensure_future(body())
        await ready()
        t0 = time.perf_counter()
        task.cancel()
        await asyncio.wait({task})
        elapsed = time.perf_counter() - t0
        assert task.cancelled(), "the processor task finished instead of being cancelled"
        return elapsed * 1000
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(body)
            await ready()
            t0 = time.perf_counter()
            scope.cancel()
    return (time.perf_counter() - t0) * 1000


# --- ours ------------------------------------------------------------------


async def ours_cancel(n: int) -> dict[str, Any]:
    strategy = HangingStrategy(n)
    proc = ParallelBatchProcessor[str](ours_config(n))

    async def body() -> None:
        async with proc:
            for item in _items(strategy, n):
                await proc.add_work(item)
            await proc.process_all()

    ms = await cancel_from_outside(body, strategy.all_started.wait)
    return {"ms": ms, **_checks(strategy, proc)}


async def ours_graceful(n: int, remaining: float) -> dict[str, Any]:
    strategy = HangingStrategy(n, remaining=remaining)
    guard = GuardrailConfig(abort_on_error_categories={ErrorCategory.INVALID_REQUEST},
                            abort_mode=AbortMode.DRAIN_ACTIVE)
    proc = ParallelBatchProcessor[str](ours_config(n, guardrails=guard))
    done: list[Any] = []

    async def body() -> None:
        async with proc:
            for item in _items(strategy, n, first=TRIGGER):
                await proc.add_work(item)
            batch = await proc.process_all()
        done.append(time.perf_counter())
        done.append(batch)

    async with anyio.create_task_group() as tg:
        tg.start_soon(body)
        await strategy.all_started.wait()
        t0 = time.perf_counter()
        strategy.go.set()
    t_done, batch = done
    return {"ms": (t_done - t0 - remaining) * 1000, "termination": batch.termination.kind,
            "results": len(batch.results), **_checks(strategy, proc)}


async def ours_deadline(n: int, timeout: float) -> dict[str, Any]:
    strategy = HangingStrategy(n)
    proc = ParallelBatchProcessor[str](ours_config(n, guardrails=GuardrailConfig(batch_timeout=timeout)))
    async with proc:
        for item in _items(strategy, n):
            await proc.add_work(item)
        # process_all() starts the batch clock synchronously, so this is its deadline; perf_counter,
        # not the loop clock, because uvloop's clock has millisecond resolution.
        deadline, perf_deadline = anyio.current_time() + timeout, time.perf_counter() + timeout
        batch = await proc.process_all()
    ms = (time.perf_counter() - perf_deadline) * 1000
    return {"ms": ms, "termination": batch.termination.kind, "results": len(batch.results),
            "all_in_flight_before_deadline": strategy.all_started_at < deadline, **_checks(strategy, proc)}


# --- floors: a bare task group of N tasks, same shapes -----------------------


async def _hang(counter: list[int], n: int, ready: anyio.Event) -> None:
    counter[0] += 1
    if counter[0] == n:
        ready.set()
    await anyio.sleep_forever()


async def floor_cancel(n: int) -> dict[str, Any]:
    """The anchor's floor: N hanging tasks in a task group whose enclosing scope is cancelled."""
    ready, counter = anyio.Event(), [0]
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(_hang, counter, n, ready)
            await ready.wait()
            t0 = time.perf_counter()
            scope.cancel()
    return {"ms": (time.perf_counter() - t0) * 1000}


async def floor_cancel_native(n: int) -> dict[str, Any]:
    """asyncio only: N hanging tasks in an ``asyncio.TaskGroup`` whose task gets ``Task.cancel()``."""
    import asyncio

    ready, counter = asyncio.Event(), [0]

    async def hang() -> None:
        counter[0] += 1
        if counter[0] == n:
            ready.set()
        await asyncio.sleep(3600)

    async def body() -> None:
        async with asyncio.TaskGroup() as tg:
            for _ in range(n):
                tg.create_task(hang())

    task = asyncio.ensure_future(body())
    await ready.wait()
    t0 = time.perf_counter()
    task.cancel()
    await asyncio.wait({task})
    return {"ms": (time.perf_counter() - t0) * 1000}


async def floor_graceful(n: int, remaining: float) -> dict[str, Any]:
    """N tasks wait for ``go``, then finish after ``remaining`` s; the sample is the exit minus ``remaining``."""
    ready, go, counter = anyio.Event(), anyio.Event(), [0]

    async def call() -> None:
        counter[0] += 1
        if counter[0] == n:
            ready.set()
        await go.wait()
        await anyio.sleep(remaining)

    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(call)
        await ready.wait()
        t0 = time.perf_counter()
        go.set()
    return {"ms": (time.perf_counter() - t0 - remaining) * 1000}


async def floor_deadline(n: int, timeout: float) -> dict[str, Any]:
    """N hanging tasks in a task group under ``move_on_at(deadline)``."""
    ready, counter = anyio.Event(), [0]
    deadline, perf_deadline = anyio.current_time() + timeout, time.perf_counter() + timeout
    with anyio.move_on_at(deadline):
        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(_hang, counter, n, ready)
    return {"ms": (time.perf_counter() - perf_deadline) * 1000}
