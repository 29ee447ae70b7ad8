"""The same drain scenarios on async-batch-llm 0.28 (asyncio only), for comparison.

Shapes match ``_drain_inproc``: N calls hanging (or finishing ``remaining``
seconds after ``go``), 10×N queued, one sample per ``asyncio.run``.

- cancel: the task running ``async with ParallelBatchProcessor(...)`` gets ``Task.cancel()``.
- graceful: the trigger call raises ``ValueError`` (async-batch-llm classifies it
  ``logic_error``, not retried), which is in ``abort_on_error_categories`` with
  ``AbortMode.DRAIN_ACTIVE``.
- deadline: ``GuardrailConfig(batch_timeout=...)``, measured from the deadline
  instant (taken just before ``process_all()``, which starts its timer).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from async_batch_llm import AbortMode, GuardrailConfig, LLMWorkItem, ParallelBatchProcessor, ProcessorConfig
from async_batch_llm.llm_strategies import LLMCallStrategy

from _drain_inproc import QUEUED_PER_CALL, TRIGGER

_USAGE = {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}


class AblHangingStrategy(LLMCallStrategy[str]):
    """async-batch-llm twin of ``_drain_inproc.HangingStrategy``."""

    def __init__(self, expected: int, remaining: float | None = None) -> None:
        self.expected = expected
        self.remaining = remaining
        self.started = 0
        self.in_flight = 0
        self.cleanups = 0
        self.all_started = asyncio.Event()
        self.all_started_at = float("inf")
        self.go = asyncio.Event()

    async def execute(self, prompt: str, attempt: int, timeout: float, state: Any = None) -> Any:
        self.started += 1
        self.in_flight += 1
        if self.started == self.expected:
            self.all_started_at = time.perf_counter()
            self.all_started.set()
        try:
            if self.remaining is None:
                await asyncio.sleep(3600)
            await self.go.wait()
            if prompt == TRIGGER:
                raise ValueError("benchmark stop")
            await asyncio.sleep(self.remaining)
            return "ok", _USAGE, None
        finally:
            self.in_flight -= 1

    async def cleanup(self) -> None:
        self.cleanups += 1


def _config(n: int, **guardrails: Any) -> ProcessorConfig:
    return ProcessorConfig(max_workers=n, attempt_timeout=7200.0, progress_interval=10**9,
                           guardrails=GuardrailConfig(**guardrails))


async def _fill(proc: ParallelBatchProcessor, strategy: AblHangingStrategy, n: int, first: str = "p") -> None:
    for i in range(n * (1 + QUEUED_PER_CALL)):
        await proc.add_work(LLMWorkItem(item_id=f"i{i}", strategy=strategy, prompt=first if i == 0 else "p"))


def _checks(strategy: AblHangingStrategy) -> dict[str, Any]:
    return {"calls_left_running": strategy.in_flight, "strategy_cleanups": strategy.cleanups}


async def abl_cancel(n: int) -> dict[str, Any]:
    strategy = AblHangingStrategy(n)

    async def body() -> None:
        async with ParallelBatchProcessor(config=_config(n)) as proc:
            await _fill(proc, strategy, n)
            await proc.process_all()

    task = asyncio.ensure_future(body())
    await strategy.all_started.wait()
    t0 = time.perf_counter()
    task.cancel()
    await asyncio.wait({task})
    ms = (time.perf_counter() - t0) * 1000
    assert task.cancelled()
    return {"ms": ms, **_checks(strategy)}


async def abl_graceful(n: int, remaining: float) -> dict[str, Any]:
    strategy = AblHangingStrategy(n, remaining=remaining)
    done: list[Any] = []

    async def body() -> None:
        config = _config(n, abort_on_error_categories=frozenset({"logic_error"}), abort_mode=AbortMode.DRAIN_ACTIVE)
        async with ParallelBatchProcessor(config=config) as proc:
            await _fill(proc, strategy, n, first=TRIGGER)
            batch = await proc.process_all()
        done.extend((time.perf_counter(), batch))

    task = asyncio.ensure_future(body())
    await strategy.all_started.wait()
    t0 = time.perf_counter()
    strategy.go.set()
    await task
    t_done, batch = done
    return {"ms": (t_done - t0 - remaining) * 1000, "termination": batch.termination.kind,
            "results": len(batch.results), **_checks(strategy)}


async def abl_deadline(n: int, timeout: float) -> dict[str, Any]:
    strategy = AblHangingStrategy(n)
    # CANCEL_ACTIVE: under its default DRAIN_ACTIVE, async-batch-llm lets in-flight calls run past the
    # batch deadline (they would hang here for ever); ours always cuts them short at the deadline.
    config = _config(n, batch_timeout=timeout, abort_mode=AbortMode.CANCEL_ACTIVE)
    async with ParallelBatchProcessor(config=config) as proc:
        await _fill(proc, strategy, n)
        deadline = time.perf_counter() + timeout
        batch = await proc.process_all()
    ms = (time.perf_counter() - deadline) * 1000
    return {"ms": ms, "termination": batch.termination.kind, "results": len(batch.results),
            "all_in_flight_before_deadline": strategy.all_started_at < deadline, **_checks(strategy)}
