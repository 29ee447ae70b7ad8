"""Regression tests for how a close counts cancellation deliveries (CONTRACT C3), issue 16 cases 3 and 4.

Case 3 (asyncio): the first delivery is the cancellation of a scope around the
call (a deadline of ``move_on_after``/``fail_after``, or a ``CancelScope``
cancelled by hand), the close hangs in a strategy's ``cleanup()``, and then a
native ``Task.cancel()`` arrives. That second delivery forces the close and
must propagate *past* the caller's scope: the task ends cancelled, and code
after the scope never runs. Every entry point and every owner, with the first
delivery landing before the close and during it.

Case 4 (Trio): a first Ctrl+C reaching a close that hangs is deferred (the
store still closes, the KeyboardInterrupt comes afterwards); the second forces.
Real SIGINT delivery: through Trio's own signal handler in-process, and with
``os.kill`` from another process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
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

from .._paths import ROOT
from ..conftest import ASYNCIO_ONLY

pytestmark = pytest.mark.anyio



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


# --- case 4: Ctrl+C on Trio -------------------------------------------------------------------


class Recorder:
    """A minimal artifact store that records its close (the store step)."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.path = Path("memory://recorder")

    async def open(self) -> None:
        await anyio.lowlevel.checkpoint()

    async def load(self) -> dict[str, Any]:
        await anyio.lowlevel.checkpoint()
        return {}

    async def count_records(self) -> int:
        await anyio.lowlevel.checkpoint()
        return 0

    async def append(self, result: Any, *, fingerprint: str, prompt: str | None = None) -> None:
        await anyio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        self.events.append("store closed")
        await anyio.lowlevel.checkpoint()


def _needs_default_sigint() -> None:
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:  # pragma: no cover
        pytest.skip("SIGINT handler replaced by the environment")


class CtrlC(LLMCallStrategy[str]):
    """A strategy whose ``cleanup()`` presses Ctrl+C (a real SIGINT through Trio's handler) on demand.

    ``presses`` is how many times; after each one it waits until the close has
    counted it. ``where`` is ``"checkpoint"``: the signal arrives while Trio's
    handler defers it to the main task's next checkpoint (the closer's wait),
    or ``"in_step"``: it lands in the cleanup's own synchronous code and is
    raised right there. ``then`` is what the cleanup does afterwards:
    ``"return"`` or ``"hang"``.
    """

    def __init__(
        self, events: list[str], *, presses: int, where: str = "checkpoint", then: str = "return"
    ) -> None:
        self.events = events
        self.presses = presses
        self.where = where
        self.then = then
        self.proc: ParallelBatchProcessor[str] | None = None

    async def execute(
        self, prompt: str, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[str, TokenUsage | None, Any]:
        await anyio.lowlevel.checkpoint()
        return prompt, None, None

    def deliveries(self) -> int:
        assert self.proc is not None
        return self.proc.host.ledger.statistics().deliveries

    async def cleanup(self) -> None:
        import trio

        @trio.lowlevel.enable_ki_protection
        def press_at_checkpoint() -> None:
            signal.raise_signal(signal.SIGINT)  # Trio's handler runs inside: the KeyboardInterrupt is pending

        self.events.append("cleanup start")
        try:
            for _ in range(self.presses):
                before = self.deliveries()
                if self.where == "in_step":
                    signal.raise_signal(signal.SIGINT)  # unprotected: raised here, in the step
                press_at_checkpoint()
                for _ in range(100):
                    await trio.lowlevel.checkpoint()
                    if self.deliveries() > before:
                        break
                self.events.append(f"deliveries={self.deliveries()}")
            if self.then == "hang":
                await trio.sleep_forever()
        except trio.Cancelled:
            self.events.append("cleanup cancelled")
            raise
        except KeyboardInterrupt:
            self.events.append("cleanup interrupted")
            raise
        self.events.append("cleanup end")


def _run_trio_close(
    strategy: CtrlC, events: list[str], *, cancelled_first: bool = False
) -> ParallelBatchProcessor[str]:
    import trio

    proc = ParallelBatchProcessor[str](artifact_store=Recorder(events))
    strategy.proc = proc

    async def main() -> None:
        with trio.CancelScope() as caller:
            async with proc:
                await proc.add_work(LLMWorkItem(item_id="a", strategy=strategy, prompt="a"))
                await proc.process_all()
                if cancelled_first:
                    caller.cancel()
                    await trio.lowlevel.checkpoint()
        events.append("after the block")

    with pytest.raises(KeyboardInterrupt):
        trio.run(main)
    return proc


def test_rel4_first_ctrl_c_during_a_hanging_close_is_deferred_trio(caplog: pytest.LogCaptureFixture) -> None:
    _needs_default_sigint()
    events: list[str] = []
    proc = _run_trio_close(CtrlC(events, presses=1), events)
    # Counted as the first delivery; the close went on in order, then the KeyboardInterrupt came.
    assert events == ["cleanup start", "deliveries=1", "cleanup end", "store closed"]
    assert proc.state == "closed"
    assert not [r for r in caplog.records if "close aborted" in r.getMessage()]


def test_rel4_second_ctrl_c_forces_the_close_trio(caplog: pytest.LogCaptureFixture) -> None:
    _needs_default_sigint()
    events: list[str] = []
    proc = _run_trio_close(CtrlC(events, presses=2, then="hang"), events)
    # The second press forced the close: the cleanup was cancelled at its next checkpoint.
    assert events == ["cleanup start", "deliveries=1", "cleanup cancelled"]
    assert proc.state == "closing"  # the store step was skipped: it stays open
    assert proc.host.ledger.statistics().deliveries == 2
    aborted = [r.getMessage() for r in caplog.records if "close aborted" in r.getMessage()]
    assert len(aborted) == 1 and "KeyboardInterrupt" in aborted[0] and "'artifact store'" in aborted[0]


def test_ctrl_c_after_the_callers_cancellation_forces_trio() -> None:
    _needs_default_sigint()
    events: list[str] = []
    proc = _run_trio_close(CtrlC(events, presses=1, then="hang"), events, cancelled_first=True)
    assert events == ["cleanup start", "cleanup cancelled"]  # no "after the block": the Ctrl+C propagated
    assert proc.state == "closing"
    assert proc.host.ledger.statistics().deliveries == 2


def test_rel4_ctrl_c_landing_in_a_steps_own_code_is_deferred_trio() -> None:
    """The signal arrives while the cleanup runs synchronous code: Python raises it there, in the step."""
    _needs_default_sigint()
    events: list[str] = []
    proc = _run_trio_close(CtrlC(events, presses=1, where="in_step"), events)
    assert events == ["cleanup start", "cleanup interrupted", "store closed"]
    assert proc.state == "closing"  # the interrupted step is retried by a later close
    stats = proc.host.ledger.statistics()
    assert stats.deliveries == 1 and "artifact store" in stats.completed


def test_rel4_ctrl_c_in_the_body_then_one_at_the_close_forces_trio() -> None:
    """A first Ctrl+C that unwinds the ``async with`` body is the close's first delivery: the next forces."""
    import trio

    _needs_default_sigint()
    events: list[str] = []
    strategy = CtrlC(events, presses=1, then="hang")
    proc = ParallelBatchProcessor[str](artifact_store=Recorder(events))
    strategy.proc = proc

    async def main() -> None:
        async with proc:
            await proc.add_work(LLMWorkItem(item_id="a", strategy=strategy, prompt="a"))
            await proc.process_all()
            signal.raise_signal(signal.SIGINT)  # raised right here, in the body
        events.append("after the block")  # pragma: no cover

    with pytest.raises(KeyboardInterrupt):
        trio.run(main)
    assert events == ["cleanup start", "cleanup cancelled"]
    assert proc.state == "closing" and proc.host.ledger.statistics().deliveries == 2


def test_rel4_close_outside_the_main_task_sees_ctrl_c_only_as_its_callers_cancellation_trio() -> None:
    """The state docs/cleanup-contract.md names: Trio delivers Ctrl+C to the main task only.

    The close runs in a child task while the main task waits for it in a task
    group. The first Ctrl+C cancels that task group: the close counts it as
    its caller's cancellation (the first delivery, deferred). The second never
    reaches the close: it goes on to the end, store included.
    """
    import trio

    _needs_default_sigint()
    events: list[str] = []
    strategy = CtrlC(events, presses=2)
    proc = ParallelBatchProcessor[str](artifact_store=Recorder(events))
    strategy.proc = proc

    async def closes_in_a_child_task() -> None:
        async with proc:
            await proc.add_work(LLMWorkItem(item_id="a", strategy=strategy, prompt="a"))
            await proc.process_all()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(closes_in_a_child_task)

    with pytest.raises(KeyboardInterrupt):
        trio.run(main)
    assert events == ["cleanup start", "deliveries=1", "deliveries=1", "cleanup end", "store closed"]
    assert proc.state == "closed"


def _read_line(child: subprocess.Popen[str], timeout: float = 30.0) -> str:
    import selectors

    assert child.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(child.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):  # a failsafe: the child answers within milliseconds
            child.kill()
            pytest.fail("the child process stopped answering")
    return child.stdout.readline().strip()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("mode", ["once", "twice"])
def test_rel4_real_sigint_from_another_process_trio(mode: str, tmp_path: Path) -> None:
    """``os.kill(pid, SIGINT)`` from the parent, as a terminal's Ctrl+C would send it."""
    path = tmp_path / "run.jsonl"
    with subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "_sigint_child.py"), mode, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    ) as child:
        assert child.stdin is not None
        try:
            assert _read_line(child) == "cleanup-started"
            os.kill(child.pid, signal.SIGINT)  # the first Ctrl+C: deferred
            child.stdin.write("go\n")
            child.stdin.flush()
            assert _read_line(child) == "cleanup-resumed deliveries=1"
            if mode == "twice":
                os.kill(child.pid, signal.SIGINT)  # the second Ctrl+C: forces
                assert _read_line(child) == "cleanup-cancelled"
            else:
                assert _read_line(child) == "cleanup-finished"
            summary = _read_line(child)
            child.stdin.close()
            assert child.wait(timeout=30) == 0
        finally:
            if child.poll() is None:  # pragma: no cover - only after a failed assertion
                child.kill()
    assert summary.startswith("outcome=KeyboardInterrupt ")
    if mode == "once":
        assert "state=closed deliveries=1" in summary and "'artifact store'" in summary
    else:
        assert "state=closing deliveries=2" in summary and "'artifact store'" not in summary
    # Every result was checkpointed before the close either way; after the deferred Ctrl+C the
    # store was closed too (its lock released: a new writer may open it).
    lines = [line for line in path.read_text().splitlines() if '"kind":"result"' in line.replace(" ", "")]
    assert len(lines) == 3
