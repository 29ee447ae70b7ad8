"""A cleanup step's synchronous twin (``nowait``) and what a close allocates (issue 36, point 4).

The twin runs in the closer's own task; only when it cannot finish does the step get its
private task and scope (CONTRACT C3.4). Its outcomes are settled like a step's: a failure is
retried by a later explicit close and never twice in one call (C4.2), a KeyboardInterrupt it
raises is a delivery (C3.1), a SystemExit aborts (C7.4).
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from trio_batch_llm import ExecutorHost, LLMCallStrategy
from trio_batch_llm._core._ledger import CleanupLedger, CleanupStep, LedgerState

from .test_close_cost_rounds import counting_rounds

pytestmark = pytest.mark.anyio


class Twin:
    """A step whose nowait twin answers from ``answers`` (a bool, or an exception to raise)."""

    def __init__(self, *answers: bool | BaseException) -> None:
        self.answers = list(answers)
        self.nowait_tasks: list[int] = []
        self.run_tasks: list[int] = []

    def nowait(self) -> bool:
        self.nowait_tasks.append(anyio.get_current_task().id)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def run(self) -> None:
        self.run_tasks.append(anyio.get_current_task().id)
        await anyio.lowlevel.checkpoint()


def ledger_with(twin: Twin, *, after: Callable[[], Awaitable[None]] | None = None) -> CleanupLedger:
    ledger = CleanupLedger("test")
    ledger.add_step("admission", "twin", twin.run, nowait=twin.nowait)
    if after is not None:
        ledger.add_step("store", "after", after)
    return ledger


async def test_a_twin_that_finishes_runs_in_the_closers_task_and_no_step_task_starts() -> None:
    twin = Twin(True)
    ledger = ledger_with(twin)
    async with counting_rounds() as counter:
        closer = anyio.get_current_task().id
        spent = await counter.spent(ledger.aclose)
    assert twin.nowait_tasks == [closer]
    assert twin.run_tasks == []
    assert ledger.state is LedgerState.CLOSED
    report = ledger.last_attempt_report
    assert report is not None and report.completed == ("twin",)
    assert spent <= 2  # the close's one schedule point (and the counter's place in the round)


async def test_a_twin_that_cannot_finish_hands_the_step_to_its_private_task() -> None:
    twin = Twin(False)
    ledger = ledger_with(twin)
    closer = anyio.get_current_task().id
    await ledger.aclose()
    assert twin.nowait_tasks == [closer]
    assert len(twin.run_tasks) == 1 and twin.run_tasks[0] != closer
    assert ledger.state is LedgerState.CLOSED


async def test_a_failing_twin_is_retried_by_the_next_explicit_close_never_twice_in_one() -> None:
    later: list[str] = []

    async def after() -> None:
        later.append("after")
        await anyio.lowlevel.checkpoint()

    twin = Twin(ValueError("boom"), True)
    ledger = ledger_with(twin, after=after)
    with pytest.raises(ValueError, match="boom"):
        await ledger.aclose()
    assert len(twin.nowait_tasks) == 1 and twin.run_tasks == []  # not run again by its task
    assert later == ["after"]  # its failure did not stop the later phase (C2.2)
    report = ledger.last_attempt_report
    assert report is not None and [(p.name, p.kind) for p in report.problems] == [("twin", "failed")]
    assert ledger.state is LedgerState.CLOSING
    await ledger.aclose()
    assert len(twin.nowait_tasks) == 2 and later == ["after"]
    assert ledger.state is LedgerState.CLOSED


async def test_a_keyboard_interrupt_raised_by_a_twin_is_a_deferred_first_delivery() -> None:
    later: list[str] = []

    async def after() -> None:
        later.append("after")
        await anyio.lowlevel.checkpoint()

    twin = Twin(KeyboardInterrupt(), True)
    ledger = ledger_with(twin, after=after)
    with pytest.raises(KeyboardInterrupt):
        await ledger.aclose()
    assert later == ["after"]  # teardown went on in order
    assert ledger.statistics().deliveries == 1
    report = ledger.last_attempt_report
    assert report is not None and [(p.name, p.kind) for p in report.problems] == [("twin", "interrupted")]
    await ledger.aclose()
    assert ledger.state is LedgerState.CLOSED


async def test_a_system_exit_raised_by_a_twin_aborts_the_close() -> None:
    later: list[str] = []

    async def after() -> None:
        later.append("after")

    ledger = ledger_with(Twin(SystemExit(5)), after=after)
    with pytest.raises(SystemExit) as info:
        await ledger.aclose()
    assert info.value.code == 5
    assert later == []  # nothing further starts
    assert ledger.state is LedgerState.CLOSING


async def test_a_provider_may_return_steps_with_twins() -> None:
    twin = Twin(True)
    ledger = CleanupLedger("test")
    ledger.add_phase_provider("strategies", lambda: [CleanupStep("twin", twin.run, nowait=twin.nowait)])
    await ledger.aclose()
    assert len(twin.nowait_tasks) == 1 and twin.run_tasks == []
    assert ledger.state is LedgerState.CLOSED


class _Strategy(LLMCallStrategy[str]):
    async def execute(self, prompt: str, attempt: int, timeout: float | None, state: Any = None) -> Any:
        await anyio.lowlevel.checkpoint()
        return "ok", None, None


async def test_closing_a_host_with_nothing_prepared_allocates_little() -> None:
    # Peak traced memory during the close: before, a task group, a step task with its scopes and
    # events (about 17 KB on both backends); now the report and the close call's records (5-6 KB).
    peaks = []
    for _ in range(3):  # the first close of a process pays for lazy imports and caches
        host = ExecutorHost()
        await host.__aenter__()
        host.quota_scope(_Strategy())
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            await host.__aexit__(None, None, None)
            peaks.append(tracemalloc.get_traced_memory()[1] - base)
        finally:
            tracemalloc.stop()
        assert host.state == "closed"
    assert min(peaks) < 10_000, peaks
