"""A cancellation that reaches a worker inside a group stays a cancellation, inside its own scope (issue 37).

On Trio a task group raises even a lone ``Cancelled`` in a group when the scope
that was cancelled is outside it (strict exception groups): a strategy whose call
runs its own nursery -- ``trio.open_tcp_stream`` does, so an HTTP connect in
flight does -- gives its worker ``BaseExceptionGroup([Cancelled])`` when the
processor's close or a stop cuts the call. The worker took that for a crash: the
batch recorded a "crash" holding a ``Cancelled``, and the host's task group was
cancelled as for a failure, so the owner's body could not absorb its own
cancellation any more and a bare ``Cancelled`` left ``async with processor``
with no cancelled scope left to catch it: it reached ``trio.run``'s caller
(a durable-run driver whose lease expired while frozen exited 1 in
``tests/test_runs_leases_crash.py``, about 1 run in 8 on a loaded machine).

CONTRACT: cancellation is never swallowed and never leaks; what a close cancels
ends inside the close.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from trio_batch_llm import (
    BatchInterruptedError,
    LLMCallStrategy,
    LLMWorkItem,
    ProcessorConfig,
    RetryState,
    TokenUsage,
)
from trio_batch_llm._engine._processor import ParallelBatchProcessor

pytestmark = pytest.mark.anyio
TRIO_ONLY = pytest.mark.parametrize("anyio_backend", ["trio"])  # strict groups of Cancelled are Trio's


class NurseryCall(LLMCallStrategy[str]):
    """A call that waits inside its own strict Trio nursery, as ``trio.open_tcp_stream`` does."""

    def __init__(self) -> None:
        self.working = anyio.Event()

    async def execute(
        self, prompt: str, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[str, TokenUsage | None, Any]:
        import trio

        self.working.set()
        async with trio.open_nursery() as nursery:  # strict: a Cancelled from outside comes out grouped
            nursery.start_soon(trio.sleep_forever)
            await trio.sleep_forever()
        raise AssertionError("unreachable")


@TRIO_ONLY
async def test_a_call_cut_by_the_close_ends_inside_the_close() -> None:
    strategy = NurseryCall()
    proc = ParallelBatchProcessor[str](ProcessorConfig(concurrency=2))
    after = False
    async with proc:
        proc.start()
        await proc.add_work(LLMWorkItem("a", strategy, "prompt"))
        await strategy.working.wait()
        # Leaving the block closes the processor: its close cancels the call in flight.
    after = True
    assert after  # (before the fix a bare Cancelled left the block: no scope of ours was cancelled)
    # The stream ends as a close before finish() does, not with a "crash" holding a Cancelled.
    with pytest.raises(BatchInterruptedError, match="closed before finish"):
        async for _ in proc.results():
            pass


@TRIO_ONLY
async def test_a_segment_cancelled_around_a_cut_call_absorbs_its_own_cancellation() -> None:
    # What a durable run's drive segment does when its lease is found expired: stop the
    # processor and cancel the segment's task group, with calls in flight.
    strategy = NurseryCall()
    proc = ParallelBatchProcessor[str](ProcessorConfig(concurrency=2))
    async with proc:
        proc.start()
        async with anyio.create_task_group() as tg:
            await proc.add_work(LLMWorkItem("a", strategy, "prompt"))
            await strategy.working.wait()
            proc.request_stop("lease lost")
            tg.cancel_scope.cancel("segment detached")
            await anyio.sleep_forever()
        assert tg.cancel_scope.cancelled_caught
    assert proc.termination.kind == "interrupted", proc.termination


async def test_the_owner_exit_keeps_its_host_task_groups_verdict() -> None:
    # The owner's block runs inside its host's task group. Once that group's own scope is
    # cancelled (what a failing runtime task does), a Cancelled raised in the block belongs to
    # it and ends at the owner's exit: the host's task group absorbs it, and the owner's
    # __aexit__ must say so rather than let Python re-raise it past its scope.
    proc = ParallelBatchProcessor[str](ProcessorConfig(concurrency=2))
    after = False
    async with proc:
        proc.start()
        async with anyio.create_task_group() as tg:
            proc._host._tg.cancel_scope.cancel("a runtime task failed")  # (the host's own scope)
            tg.cancel_scope.cancel("segment detached")
            await anyio.sleep_forever()
    after = True
    assert after
