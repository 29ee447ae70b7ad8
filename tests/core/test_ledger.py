"""CONTRACT C2–C4, C7.3–C7.4: the CleanupLedger with misbehaving fake steps, on both backends.

An observer records the exact order in which steps start and end. Steps that
must stay running are gated on Events the test sets, so no test waits on
wall-clock time; the one timing test runs on Trio's virtual clock (and on
asyncio with a tiny bound, synchronised on the warning record itself).
Tests are named after the clause they prove, so the engine-level contract
module can pick them up.
"""

from __future__ import annotations

import gc
import logging
import math
import signal
import weakref
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from trio_batch_llm._core._ledger import (
    CLEANUP_SLOW_WARNING_SECONDS,
    PHASES,
    PROGRESS_TASK_CANCELLATION_TIMEOUT,
    WORKER_CANCELLATION_TIMEOUT,
    CleanupLedger,
    CleanupStep,
    LedgerState,
    unwrap_group,
)
from trio_batch_llm._core._ledger import logger as cleanup_logger
from trio_batch_llm._values._errors import AdmissionClosedError, CleanupInterruptedError

from ..conftest import ASYNCIO_ONLY, raise_foreign_cancellation, trio_virtual_clock

pytestmark = pytest.mark.anyio

async def let_others_run(checkpoints: int) -> None:
    """Give every other task many chances to run (a linked cancellation would land meanwhile)."""
    for _ in range(checkpoints):
        await anyio.lowlevel.checkpoint()


class Steps:
    """Fake steps whose behaviour is scripted per name and may change between closes.

    Modes: ok, raise (a fresh ValueError named after the step), gate (waits
    for ``release(name)``), linger (waits forever; when cancelled, lingers
    shielded until ``release(name)``, then re-raises), interrupt (raises a
    foreign cancellation), keyboard_interrupt, system_exit.
    """

    def __init__(self) -> None:
        self.events: list[str] = []
        self.modes: dict[str, str] = {}
        self.started: defaultdict[str, anyio.Event] = defaultdict(anyio.Event)
        self.gates: defaultdict[str, anyio.Event] = defaultdict(anyio.Event)
        self.lingering: defaultdict[str, anyio.Event] = defaultdict(anyio.Event)
        self.errors: dict[str, list[BaseException]] = defaultdict(list)
        self.deadline_inside: dict[str, float] = {}

    def release(self, name: str) -> None:
        self.gates[name].set()

    def make(self, name: str, mode: str = "ok") -> Callable[[], Awaitable[None]]:
        self.modes[name] = mode

        async def run() -> None:
            self.events.append(f"{name}:start")
            self.started[name].set()
            self.deadline_inside[name] = anyio.current_effective_deadline()
            try:
                await self._behave(name, self.modes[name])
            except anyio.get_cancelled_exc_class():
                self.events.append(f"{name}:cancelled")
                raise
            except BaseException:
                self.events.append(f"{name}:raised")
                raise
            self.events.append(f"{name}:end")

        return run

    async def _behave(self, name: str, mode: str) -> None:
        if mode == "ok":
            for _ in range(3):  # several checkpoints: a linked caller cancellation would land here
                await anyio.lowlevel.checkpoint()
        elif mode == "raise":
            await anyio.lowlevel.checkpoint()
            error = ValueError(f"{name} failed")
            self.errors[name].append(error)
            raise error
        elif mode == "gate":
            await self.gates[name].wait()
        elif mode == "linger":
            try:
                await anyio.sleep_forever()
            finally:
                self.events.append(f"{name}:lingering")
                self.lingering[name].set()
                with anyio.CancelScope(shield=True):
                    await self.gates[name].wait()
        elif mode == "interrupt":
            await raise_foreign_cancellation()
        elif mode == "keyboard_interrupt":
            await anyio.lowlevel.checkpoint()
            raise KeyboardInterrupt
        elif mode == "system_exit":
            await anyio.lowlevel.checkpoint()
            raise SystemExit(3)
        else:  # pragma: no cover
            raise AssertionError(mode)

    def starts(self) -> list[str]:
        return [e.split(":")[0] for e in self.events if e.endswith(":start")]


def build(spec: list[tuple[str, str, str]]) -> tuple[CleanupLedger, Steps]:
    """A ledger from ``(phase, name, mode)`` triples, registered in the given order."""
    steps = Steps()
    ledger = CleanupLedger("host")
    for phase, name, mode in spec:
        ledger.add_step(phase, name, steps.make(name, mode))  # type: ignore[arg-type]
    return ledger, steps


class Closer:
    """Runs ``ledger.aclose()`` in a task, under a scope the test may cancel; records the outcome."""

    def __init__(self, ledger: CleanupLedger, **kwargs: Any) -> None:
        self.ledger = ledger
        self.kwargs = kwargs
        self.scope = anyio.CancelScope()
        self.outcome: tuple[str, Any] | None = None
        self.done = anyio.Event()

    async def run(self) -> None:
        try:
            with self.scope:
                try:
                    report = await self.ledger.aclose(**self.kwargs)
                except anyio.get_cancelled_exc_class() as exc:
                    self.outcome = ("cancelled", exc)
                    raise  # absorbed by self.scope when the test cancelled it
                except BaseException as exc:
                    self.outcome = ("raised", exc)
                    return
                self.outcome = ("returned", report)
        finally:
            self.done.set()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "trio_batch_llm.cleanup" and r.levelno == logging.WARNING]


def errors_of(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "trio_batch_llm.cleanup" and r.levelno == logging.ERROR]


# -- C2: ordered close --------------------------------------------------------------------------


async def test_c2_1_phases_in_dependency_order_steps_sequential() -> None:
    ledger, steps = build([
        ("store", "d1", "ok"),
        ("strategies", "c1", "ok"),
        ("runtime", "a1", "ok"),
        ("admission", "b1", "ok"),
        ("runtime", "a2", "ok"),
        ("store", "d2", "ok"),
    ])
    assert ledger.state is LedgerState.OPEN
    report = await ledger.aclose()
    assert steps.events == [
        f"{n}:{e}" for n in ("a1", "a2", "b1", "c1", "d1", "d2") for e in ("start", "end")
    ]
    assert report.outcome == "completed"
    assert report.completed == ("a1", "a2", "b1", "c1", "d1", "d2")
    assert ledger.state is LedgerState.CLOSED
    assert PHASES == ("runtime", "admission", "strategies", "store")


async def test_c2_1_no_deadline_constants() -> None:
    assert WORKER_CANCELLATION_TIMEOUT == PROGRESS_TASK_CANCELLATION_TIMEOUT == 2.0
    assert CLEANUP_SLOW_WARNING_SECONDS == 10.0


async def test_c2_2_failure_does_not_stop_siblings(caplog: pytest.LogCaptureFixture) -> None:
    ledger, steps = build([
        ("runtime", "a1", "raise"),
        ("runtime", "a2", "ok"),
        ("admission", "b1", "raise"),
        ("store", "d1", "ok"),
    ])
    with pytest.raises(ValueError) as info:
        await ledger.aclose()
    # C7.3: every step attempted; the first failure raised as the same instance;
    # every failure logged with its traceback.
    assert steps.starts() == ["a1", "a2", "b1", "d1"]
    assert info.value is steps.errors["a1"][0]
    errors = errors_of(caplog)
    assert [r.exc_info[1] for r in errors if r.exc_info] == [steps.errors["a1"][0], steps.errors["b1"][0]]
    assert ledger.state is LedgerState.CLOSING
    stats = ledger.statistics()
    assert stats.completed == ("a2", "d1")
    assert stats.pending == ("a1", "b1")
    assert stats.failures == 2


async def test_c2_3_running_step_is_a_barrier() -> None:
    ledger, steps = build([
        ("runtime", "worker", "gate"),
        ("strategies", "lease", "ok"),
        ("store", "db", "ok"),
    ])
    closer = Closer(ledger)
    async with anyio.create_task_group() as tg:
        tg.start_soon(closer.run)
        await steps.started["worker"].wait()
        await let_others_run(20)
        assert steps.events == ["worker:start"]
        assert ledger.statistics().running == "worker"
        assert not ledger.phase_closing("strategies")
        steps.release("worker")
    assert steps.events == ["worker:start", "worker:end", "lease:start", "lease:end", "db:start", "db:end"]
    assert closer.outcome is not None
    assert closer.outcome[0] == "returned"


async def test_c2_4_phase_discovered_after_preceding_barriers() -> None:
    steps = Steps()
    ledger = CleanupLedger("pool")
    prepared: list[str] = []
    discovered_after: list[list[str]] = []
    drain = steps.make("drain", "gate")
    ledger.add_step("runtime", "drain", drain)

    def strategy_steps() -> list[CleanupStep]:
        discovered_after.append(list(steps.events))
        return [CleanupStep(f"lease:{name}", steps.make(f"lease:{name}")) for name in prepared]

    ledger.add_phase_provider("strategies", strategy_steps)
    closer = Closer(ledger)
    async with anyio.create_task_group() as tg:
        tg.start_soon(closer.run)
        await steps.started["drain"].wait()
        # In-flight work prepares a strategy while the drain runs; the phase
        # is not closing yet, so it is accepted.
        assert not ledger.phase_closing("strategies")
        prepared.append("late")
        steps.release("drain")
    assert discovered_after == [["drain:start", "drain:end"]]
    assert steps.events[-2:] == ["lease:late:start", "lease:late:end"]
    assert ledger.state is LedgerState.CLOSED


@pytest.mark.parametrize(
    "anyio_backend",
    [pytest.param("asyncio", id="asyncio"), pytest.param(trio_virtual_clock(), id="trio-virtual-clock")],
)
async def test_c2_7_slow_step_warns_once_and_the_wait_goes_on(
    anyio_backend: Any, caplog: pytest.LogCaptureFixture
) -> None:
    virtual = anyio_backend != "asyncio"
    bound = WORKER_CANCELLATION_TIMEOUT if virtual else 0.01
    warned = anyio.Event()

    class Signal(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "still running" in record.getMessage():
                warned.set()

    handler = Signal()
    cleanup_logger.addHandler(handler)
    times: dict[str, float] = {}

    async def slow_worker_cancellation() -> None:
        if virtual:
            await anyio.sleep(25)
        else:
            await warned.wait()  # finishes only after the warning: the bound is no deadline
        times["end"] = anyio.current_time()

    ledger = CleanupLedger("host")
    ledger.add_step("runtime", "workers", slow_worker_cancellation, slow_warning_after=bound)
    try:
        start = anyio.current_time()
        await ledger.aclose()
    finally:
        cleanup_logger.removeHandler(handler)
    slow = [r for r in warnings_of(caplog) if "still running" in r.getMessage()]
    assert len(slow) == 1
    assert "'workers'" in slow[0].getMessage()
    assert ledger.state is LedgerState.CLOSED
    if virtual:
        assert times["end"] - start == 25
        assert anyio.current_time() - start == 25


# -- C3: deliveries -----------------------------------------------------------------------------


async def test_c3_1_cancelled_at_entry_is_first_delivery_and_deferred() -> None:
    ledger, steps = build([("runtime", "a", "ok"), ("store", "d", "ok")])
    reached_after_close: list[bool] = []
    with anyio.CancelScope() as scope:
        scope.cancel()
        try:
            await anyio.sleep_forever()
        finally:
            await ledger.aclose()
            reached_after_close.append(True)
    assert scope.cancelled_caught
    assert reached_after_close == []  # the cancellation was re-raised by the close
    assert steps.events == ["a:start", "a:end", "d:start", "d:end"]
    assert steps.deadline_inside["a"] == math.inf  # C3.4: not linked to the caller
    assert ledger.statistics().deliveries == 1
    assert ledger.state is LedgerState.CLOSED


async def test_c3_1_entry_delivery_counted_once_with_exc_and_cancelled_scope() -> None:
    ledger, steps = build([("runtime", "a", "ok")])
    with anyio.CancelScope() as scope:
        scope.cancel()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class() as exc:
            # an __aexit__ passes the exception it is handling; the scope is cancelled too
            await ledger.aclose(body_exception=exc)
            raise
    assert scope.cancelled_caught
    assert ledger.statistics().deliveries == 1
    assert steps.events == ["a:start", "a:end"]


async def test_c3_2_cancel_during_close_is_deferred_until_teardown_finished(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger, steps = build([("runtime", "a", "gate"), ("admission", "b", "raise"), ("store", "d", "ok")])
    closer = Closer(ledger)
    async with anyio.create_task_group() as tg:
        tg.start_soon(closer.run)
        await steps.started["a"].wait()
        closer.scope.cancel()
        await let_others_run(10)
        assert not closer.done.is_set()
        steps.release("a")
    # Teardown finished in order, the cleanup error was logged, and the
    # cancellation (not the ValueError) came out (C3.2, C7.4).
    assert steps.events == ["a:start", "a:end", "b:start", "b:raised", "d:start", "d:end"]
    assert closer.outcome is not None
    assert closer.outcome[0] == "cancelled"
    assert closer.scope.cancelled_caught
    assert [r.exc_info[1] for r in errors_of(caplog) if r.exc_info] == steps.errors["b"]
    assert ledger.statistics().deliveries == 1


@ASYNCIO_ONLY
async def test_c3_2_native_cancel_is_deferred_and_reraised_asyncio() -> None:
    import asyncio

    ledger, steps = build([("runtime", "a", "gate"), ("store", "d", "ok")])
    task = asyncio.ensure_future(ledger.aclose())
    await steps.started["a"].wait()
    task.cancel()
    for _ in range(10):
        await asyncio.sleep(0)
    assert not task.done()
    steps.release("a")
    with pytest.raises(asyncio.CancelledError):
        await task
    assert steps.events == ["a:start", "a:end", "d:start", "d:end"]
    assert ledger.statistics().deliveries == 1
    assert ledger.state is LedgerState.CLOSED


async def test_c3_3_force_close_abandons_running_step(caplog: pytest.LogCaptureFixture) -> None:
    ledger, steps = build([
        ("runtime", "a", "ok"),
        ("runtime", "b", "linger"),
        ("runtime", "c", "ok"),
        ("store", "d", "ok"),
    ])
    closer = Closer(ledger)
    async with anyio.create_task_group() as tg:
        tg.start_soon(closer.run)
        await steps.started["b"].wait()
        assert ledger.force_close() is True
        await steps.lingering["b"].wait()
        await let_others_run(10)
        # The abort waits for the abandoned step to exit; nothing else starts.
        assert not closer.done.is_set()
        assert steps.starts() == ["a", "b"]
        steps.release("b")
    assert closer.outcome is not None
    assert closer.outcome[0] == "raised"
    assert isinstance(closer.outcome[1], CleanupInterruptedError)
    assert steps.events == ["a:start", "a:end", "b:start", "b:lingering", "b:cancelled"]
    warnings = warnings_of(caplog)
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "'b'" in message
    assert "'c'" in message
    assert "'d'" in message
    assert ledger.state is LedgerState.CLOSING
    report = ledger.last_attempt_report
    assert report is not None
    assert (report.outcome, report.abandoned, report.skipped) == ("aborted", "b", ("c", "d"))
    assert report.phases_not_reached == ("admission", "strategies", "store")

    # C4.7: a later close resumes only the unfinished steps.
    steps.modes["b"] = "ok"
    await ledger.aclose()
    assert steps.starts() == ["a", "b", "b", "c", "d"]
    assert ledger.state is LedgerState.CLOSED


async def test_c3_3_force_after_first_delivery_propagates_cancellation_at_once() -> None:
    ledger, steps = build([("runtime", "a", "linger"), ("store", "d", "ok")])
    closer = Closer(ledger)
    async with anyio.create_task_group() as tg:
        tg.start_soon(closer.run)
        await steps.started["a"].wait()
        closer.scope.cancel()  # first delivery: deferred
        await let_others_run(5)
        assert ledger.force_close()  # second delivery: abort
        await steps.lingering["a"].wait()
        steps.release("a")
    assert closer.outcome is not None
    assert closer.outcome[0] == "cancelled"
    assert steps.starts() == ["a"]
    assert ledger.state is LedgerState.CLOSING
    assert ledger.statistics().deliveries == 2


async def test_c3_3_force_close_from_thread() -> None:
    ledger, steps = build([("runtime", "a", "linger"), ("store", "d", "ok")])
    steps.release("a")  # lingering is immediate once cancelled
    closer = Closer(ledger)
    async with anyio.create_task_group() as tg:
        tg.start_soon(closer.run)
        await steps.started["a"].wait()
        assert await anyio.to_thread.run_sync(ledger.force_close_from_thread) is True
    assert closer.outcome is not None
    assert isinstance(closer.outcome[1], CleanupInterruptedError)
    assert steps.events == ["a:start", "a:lingering", "a:cancelled"]
    assert ledger.state is LedgerState.CLOSING


async def test_c3_3_force_close_without_close_in_flight_is_a_noop() -> None:
    ledger, steps = build([("runtime", "a", "ok")])
    assert ledger.force_close() is False
    assert ledger.force_close_from_thread() is False
    await ledger.aclose()
    assert ledger.force_close() is False
    assert steps.events == ["a:start", "a:end"]
    assert ledger.statistics().deliveries == 0


@ASYNCIO_ONLY
async def test_c3_3_second_native_cancel_aborts_asyncio(caplog: pytest.LogCaptureFixture) -> None:
    import asyncio

    ledger, steps = build([("runtime", "a", "linger"), ("admission", "b", "ok")])
    steps.release("a")
    task = asyncio.ensure_future(ledger.aclose())
    await steps.started["a"].wait()
    task.cancel()  # first: deferred
    for _ in range(5):
        await asyncio.sleep(0)
    assert not steps.lingering["a"].is_set()
    task.cancel()  # second: forced abort
    with pytest.raises(asyncio.CancelledError):
        await task
    assert steps.events == ["a:start", "a:lingering", "a:cancelled"]
    assert len(warnings_of(caplog)) == 1
    assert ledger.state is LedgerState.CLOSING
    assert ledger.statistics().deliveries == 2


@ASYNCIO_ONLY
async def test_c3_3_native_cancel_after_entry_delivery_aborts_asyncio() -> None:
    import asyncio

    ledger, steps = build([("runtime", "a", "linger"), ("store", "d", "ok")])
    steps.release("a")

    async def close_from_cancelled_scope() -> None:
        with anyio.CancelScope() as scope:
            scope.cancel()  # first delivery, seen at entry
            await ledger.aclose()

    task = asyncio.ensure_future(close_from_cancelled_scope())
    await steps.started["a"].wait()
    task.cancel()  # a further native cancel: second delivery
    with pytest.raises(asyncio.CancelledError):
        await task  # the caught native cancellation propagates through the caller's scope
    assert steps.events == ["a:start", "a:lingering", "a:cancelled"]
    assert ledger.statistics().deliveries == 2
    assert ledger.state is LedgerState.CLOSING


def _ctrl_c_ledger(presses: list[int]) -> tuple[CleanupLedger, list[str]]:
    """A ledger whose step ``b`` presses Ctrl+C ``presses[0]`` times (then hangs if more than one).

    Trio delivers a pending KeyboardInterrupt to the *main task*'s next
    checkpoint whatever its cancel scopes say, so the closer must be the main
    task of a ``trio.run`` of its own. The step presses Ctrl+C with
    ``signal.raise_signal`` from a KI-protected function: Trio's handler then
    marks the interrupt pending instead of raising it inside the step.
    Deterministic: the handler runs inside ``raise_signal``.
    """
    import trio

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:  # pragma: no cover
        pytest.skip("SIGINT handler replaced by the environment")

    @trio.lowlevel.enable_ki_protection
    def press_ctrl_c() -> None:
        signal.raise_signal(signal.SIGINT)

    events: list[str] = []
    ledger = CleanupLedger("cli")

    async def pressing() -> None:
        events.append("b:start")
        try:
            for press in range(presses[0]):
                press_ctrl_c()
                while ledger.statistics().deliveries <= press:
                    await trio.lowlevel.checkpoint()
                events.append(f"b:counted {press + 1}")
            if presses[0] > 1:
                await trio.sleep_forever()
        except trio.Cancelled:
            events.append("b:cancelled")
            raise
        events.append("b:end")

    async def ok_step() -> None:
        events.append("c:start")
        await trio.lowlevel.checkpoint()

    ledger.add_step("runtime", "b", pressing)
    ledger.add_step("store", "c", ok_step)
    return ledger, events


def test_c3_2_first_keyboard_interrupt_at_closers_wait_is_deferred_trio(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A first Ctrl+C on Trio is the first delivery: teardown goes on in order, then it is re-raised."""
    import trio

    ledger, events = _ctrl_c_ledger([1])
    with pytest.raises(KeyboardInterrupt):
        trio.run(ledger.aclose)
    assert events == ["b:start", "b:counted 1", "b:end", "c:start"]
    assert ledger.state is LedgerState.CLOSED
    assert warnings_of(caplog) == []


def test_c3_3_keyboard_interrupt_at_closers_wait_aborts_trio(caplog: pytest.LogCaptureFixture) -> None:
    """A second Ctrl+C on Trio forces: the running step is cancelled, the rest is skipped."""
    import trio

    presses = [2]
    ledger, events = _ctrl_c_ledger(presses)
    with pytest.raises(KeyboardInterrupt):
        trio.run(ledger.aclose)
    assert events == ["b:start", "b:counted 1", "b:cancelled"]
    assert ledger.state is LedgerState.CLOSING
    warnings = warnings_of(caplog)
    assert len(warnings) == 1
    assert "KeyboardInterrupt" in warnings[0].getMessage()
    assert "'c'" in warnings[0].getMessage()

    presses[0] = 0  # a later close (a new run) resumes b and c
    trio.run(ledger.aclose)
    assert events[3:] == ["b:start", "b:end", "c:start"]
    assert ledger.state is LedgerState.CLOSED


async def test_c3_4_step_is_not_linked_to_caller_cancellation() -> None:
    ledger, steps = build([("runtime", "a", "gate")])
    closer = Closer(ledger)
    async with anyio.create_task_group() as tg:
        tg.start_soon(closer.run)
        await steps.started["a"].wait()
        closer.scope.cancel()
        await let_others_run(10)
        assert steps.events == ["a:start"]  # not cancelled
        steps.release("a")
    assert steps.events == ["a:start", "a:end"]
    assert steps.deadline_inside["a"] == math.inf


async def test_c3_4_cancelled_inside_step_is_an_interruption(caplog: pytest.LogCaptureFixture) -> None:
    ledger, steps = build([("runtime", "a", "interrupt"), ("store", "d", "ok")])
    with pytest.raises(CleanupInterruptedError) as info:
        await ledger.aclose()
    assert isinstance(info.value.__cause__, anyio.get_cancelled_exc_class())
    assert steps.events == ["a:start", "a:cancelled", "d:start", "d:end"]
    assert ledger.state is LedgerState.CLOSING
    report = ledger.last_attempt_report
    assert report is not None
    assert report.problems[0].kind == "interrupted"
    # not checkpointed: retried by a later explicit close
    steps.modes["a"] = "ok"
    await ledger.aclose()
    assert steps.starts() == ["a", "d", "a"]
    assert ledger.state is LedgerState.CLOSED


@ASYNCIO_ONLY
async def test_c3_4_third_party_native_cancel_of_step_is_an_interruption_asyncio() -> None:
    import asyncio

    step_task: list[asyncio.Task[Any]] = []
    ledger, steps = build([("store", "d", "ok")])

    async def victim() -> None:
        task = asyncio.current_task()
        assert task is not None
        step_task.append(task)
        await anyio.sleep_forever()

    ledger.add_step("runtime", "victim", victim)
    closer = Closer(ledger)
    async with anyio.create_task_group() as tg:
        tg.start_soon(closer.run)
        while not step_task:
            await anyio.lowlevel.checkpoint()
        step_task[0].cancel()  # a third party
    assert closer.outcome is not None
    assert isinstance(closer.outcome[1], CleanupInterruptedError)
    assert steps.events == ["d:start", "d:end"]
    assert ledger.statistics().pending == ("victim",)


async def test_c3_4_close_from_inside_own_step_is_refused() -> None:
    ledger = CleanupLedger("host")
    seen: list[BaseException] = []

    async def reentrant() -> None:
        try:
            await ledger.aclose()
        except RuntimeError as exc:
            seen.append(exc)

    ledger.add_step("runtime", "reentrant", reentrant)
    await ledger.aclose()
    assert len(seen) == 1
    assert "own cleanup steps" in str(seen[0])


# -- C4: retry, idempotency, lifecycle -----------------------------------------------------------


async def test_c4_1_completed_steps_never_repeated() -> None:
    ledger, steps = build([("runtime", "a", "ok"), ("admission", "b", "raise"), ("store", "d", "ok")])
    with pytest.raises(ValueError):
        await ledger.aclose()
    steps.modes["b"] = "ok"
    await ledger.aclose()
    await ledger.aclose()  # closed: nothing runs again
    assert steps.starts() == ["a", "b", "d", "b"]
    assert ledger.statistics().attempts == 2


async def test_c4_2_failed_step_retried_only_by_a_later_explicit_close() -> None:
    ledger, steps = build([("runtime", "a", "raise"), ("runtime", "b", "raise")])
    for expected in (1, 2, 3):
        with pytest.raises(ValueError) as info:
            await ledger.aclose()
        assert info.value is steps.errors["a"][-1]
        assert steps.starts().count("a") == expected  # once per call, never twice within one
        assert steps.starts().count("b") == expected
    assert ledger.state is LedgerState.CLOSING


async def test_c4_3_automatic_exit_applies_previous_report_without_retry() -> None:
    ledger, steps = build([("runtime", "a", "raise"), ("store", "d", "ok")])
    with pytest.raises(ValueError):
        await ledger.aclose()  # e.g. a stream's finalization
    report = await ledger.aclose(automatic=True)  # the context manager's exit
    assert report is ledger.last_attempt_report
    assert report.outcome == "failed"
    assert report.problems[0].name == "a"
    assert steps.starts() == ["a", "d"]  # nothing retried
    steps.modes["a"] = "ok"
    await ledger.aclose()  # an explicit close retries
    assert ledger.state is LedgerState.CLOSED


async def test_c4_3_automatic_exit_runs_the_first_attempt() -> None:
    ledger, steps = build([("runtime", "a", "ok")])
    report = await ledger.aclose(automatic=True)
    assert report.outcome == "completed"
    assert steps.starts() == ["a"]


async def test_c4_4_concurrent_closes_share_one_attempt() -> None:
    ledger, steps = build([("runtime", "a", "gate"), ("admission", "b", "raise"), ("store", "d", "ok")])
    closers = [Closer(ledger), Closer(ledger), Closer(ledger, automatic=True)]
    async with anyio.create_task_group() as tg:
        tg.start_soon(closers[0].run)
        await steps.started["a"].wait()
        for closer in closers[1:]:
            tg.start_soon(closer.run)
        await let_others_run(10)
        assert ledger.statistics().attempts == 1
        steps.release("a")
    assert steps.starts() == ["a", "b", "d"]
    assert ledger.statistics().attempts == 1
    for closer in closers:
        assert closer.outcome is not None
        assert closer.outcome[0] == "raised"
        assert closer.outcome[1] is steps.errors["b"][0]


async def test_c4_4_force_reaches_every_caller_of_the_shared_attempt() -> None:
    ledger, steps = build([("runtime", "a", "linger")])
    steps.release("a")
    first, second = Closer(ledger), Closer(ledger)
    async with anyio.create_task_group() as tg:
        tg.start_soon(first.run)
        await steps.started["a"].wait()
        tg.start_soon(second.run)
        second.scope.cancel()  # the second caller has a deferred cancellation of its own
        await let_others_run(5)
        ledger.force_close()
    assert first.outcome is not None
    assert isinstance(first.outcome[1], CleanupInterruptedError)
    assert second.outcome is not None
    assert second.outcome[0] == "cancelled"


async def test_c4_6_failed_outcomes_not_retained(monkeypatch: pytest.MonkeyPatch) -> None:
    # pytest's log capture would keep the records (and their exc_info) alive.
    monkeypatch.setattr(cleanup_logger, "disabled", True)
    refs: list[weakref.ref[BaseException]] = []

    class Tracked(ValueError):
        pass  # builtin exceptions take no weak references; subclasses do

    async def failing() -> None:
        await anyio.lowlevel.checkpoint()
        error = Tracked("kept?")
        refs.append(weakref.ref(error))
        raise error

    async def interrupted() -> None:
        try:
            await raise_foreign_cancellation()
        except anyio.get_cancelled_exc_class() as exc:
            refs.append(weakref.ref(exc))
            raise

    ledger = CleanupLedger("host")
    ledger.add_step("runtime", "a", failing)
    ledger.add_step("admission", "b", interrupted)
    ledger.add_step("store", "c", failing)
    caught = 0
    for _ in range(2):
        try:
            await ledger.aclose()
        except ValueError:
            caught += 1
    gc.collect()
    assert caught == 2
    assert len(refs) == 6
    assert [ref() for ref in refs] == [None] * 6
    report = ledger.last_attempt_report
    assert report is not None
    assert report.problems[0].error.endswith("Tracked: kept?")


async def test_c4_7_lifecycle_one_way_and_strategy_phase_rejects_preparation() -> None:
    ledger, steps = build([("runtime", "a", "gate"), ("admission", "b", "gate")])
    seen: list[LedgerState] = [ledger.state]
    closer = Closer(ledger)
    async with anyio.create_task_group() as tg:
        tg.start_soon(closer.run)
        await steps.started["a"].wait()
        seen.append(ledger.state)
        assert not ledger.phase_closing("strategies")
        ledger.add_step("strategies", "late", steps.make("late"))  # still accepted
        with pytest.raises(AdmissionClosedError):
            ledger.add_step("runtime", "too-late", steps.make("too-late"))
        steps.release("a")
        await steps.started["b"].wait()
        assert ledger.phase_closing("admission")
        assert not ledger.phase_closing("strategies")
        steps.release("b")
    seen.append(ledger.state)
    assert seen == [LedgerState.OPEN, LedgerState.CLOSING, LedgerState.CLOSED]
    assert all(ledger.phase_closing(phase) for phase in PHASES)
    with pytest.raises(AdmissionClosedError):
        ledger.add_step("strategies", "after", steps.make("after"))
    with pytest.raises(AdmissionClosedError):
        ledger.add_phase_provider("store", list)
    assert steps.starts() == ["a", "b", "late"]


async def test_c4_7_failed_close_stays_closing_then_resumes() -> None:
    ledger, steps = build([("runtime", "a", "ok"), ("strategies", "c", "raise")])
    with pytest.raises(ValueError):
        await ledger.aclose()
    assert ledger.state is LedgerState.CLOSING
    assert ledger.phase_closing("strategies")
    steps.modes["c"] = "ok"
    await ledger.aclose()
    assert ledger.state is LedgerState.CLOSED
    assert steps.starts() == ["a", "c", "c"]


# -- C7: precedence ------------------------------------------------------------------------------


async def test_c7_3_first_failure_raised_after_every_step_attempted() -> None:
    ledger, steps = build([("admission", "b", "raise"), ("strategies", "c", "raise"), ("store", "d", "ok")])
    with pytest.raises(ValueError) as info:
        await ledger.aclose()
    assert info.value is steps.errors["b"][0]
    assert steps.starts() == ["b", "c", "d"]


async def test_c7_4_body_exception_not_replaced_by_cleanup_error(caplog: pytest.LogCaptureFixture) -> None:
    ledger, steps = build([("runtime", "a", "raise"), ("store", "d", "ok")])
    body = KeyError("body")
    report = await ledger.aclose(body_exception=body)  # returns: the caller's exception goes on
    assert report.outcome == "failed"
    assert len(errors_of(caplog)) == 1
    assert steps.starts() == ["a", "d"]


async def test_c7_4_step_keyboard_interrupt_beats_deferred_cancellation() -> None:
    ledger, steps = build([("runtime", "a", "keyboard_interrupt"), ("store", "d", "ok")])
    with anyio.CancelScope() as scope:
        scope.cancel()
        with pytest.raises(KeyboardInterrupt):
            await ledger.aclose()
    assert steps.events == ["a:start", "a:raised"]
    assert ledger.state is LedgerState.CLOSING


async def test_c3_2_keyboard_interrupt_raised_in_a_step_is_a_deferred_first_delivery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A Ctrl+C landing in a step's own code is raised there; it counts like one at the closer's wait."""
    ledger, steps = build([("runtime", "a", "keyboard_interrupt"), ("store", "d", "ok")])
    with pytest.raises(KeyboardInterrupt):
        await ledger.aclose()
    assert steps.events == ["a:start", "a:raised", "d:start", "d:end"]  # teardown went on in order
    assert ledger.statistics().deliveries == 1
    assert ledger.state is LedgerState.CLOSING  # the interrupted step is not checkpointed
    report = ledger.last_attempt_report
    assert report is not None and [(p.name, p.kind) for p in report.problems] == [("a", "interrupted")]
    assert any("interrupted by KeyboardInterrupt" in r.getMessage() for r in warnings_of(caplog))
    steps.modes["a"] = "ok"
    await ledger.aclose()  # a later close retries it, and only it
    assert steps.starts() == ["a", "d", "a"] and ledger.state is LedgerState.CLOSED


def test_c3_2_ctrl_c_landing_in_the_closers_own_code_is_held_for_its_wait_trio() -> None:
    """The close is KI-protected on Trio: a SIGINT while its own code runs waits for its next checkpoint."""
    import trio

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:  # pragma: no cover
        pytest.skip("SIGINT handler replaced by the environment")
    ledger, steps = build([("runtime", "a", "ok"), ("store", "d", "ok")])

    def presses_ctrl_c() -> list[CleanupStep]:
        signal.raise_signal(signal.SIGINT)  # runs inside the closer (phase discovery), unmarked itself
        return [CleanupStep("c", steps.make("c"))]

    ledger.add_phase_provider("strategies", presses_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        trio.run(ledger.aclose)
    assert steps.starts() == ["a", "c", "d"]  # deferred: every step still ran, in order
    assert ledger.state is LedgerState.CLOSED and ledger.statistics().deliveries == 1


async def test_c3_3_keyboard_interrupt_raised_by_the_closers_own_code_aborts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Not a wait, not a step: the phase loop is broken off, so the close is an abort whatever the count."""
    ledger, steps = build([("runtime", "a", "ok"), ("store", "d", "ok")])

    def raises() -> list[CleanupStep]:
        raise KeyboardInterrupt

    ledger.add_phase_provider("strategies", raises)
    with pytest.raises(KeyboardInterrupt):
        await ledger.aclose()
    assert steps.starts() == ["a"] and ledger.state is LedgerState.CLOSING
    warnings = [r.getMessage() for r in warnings_of(caplog)]
    assert len(warnings) == 1 and "close itself" in warnings[0] and "'d'" in warnings[0]


async def test_c7_4_step_system_exit_keeps_its_code() -> None:
    ledger, steps = build([("runtime", "a", "system_exit"), ("store", "d", "ok")])
    with pytest.raises(SystemExit) as info:
        await ledger.aclose(body_exception=ValueError("body"))
    assert info.value.code == 3
    assert steps.starts() == ["a"]


# -- registration, discovery, boundaries ---------------------------------------------------------


async def test_registration_is_validated() -> None:
    ledger, steps = build([("runtime", "a", "ok")])
    with pytest.raises(ValueError, match="name='a'"):
        ledger.add_step("store", "a", steps.make("a2"))
    with pytest.raises(ValueError, match="phase="):
        ledger.add_step("teardown", "x", steps.make("x"))  # type: ignore[arg-type]
    for bad in (0, -1, math.nan, True):
        with pytest.raises(ValueError, match="slow_warning_after="):
            ledger.add_step("store", f"bad-{bad}", steps.make("x"), slow_warning_after=bad)
    await ledger.aclose()
    assert steps.starts() == ["a"]


async def test_discovery_failure_is_a_step_failure(caplog: pytest.LogCaptureFixture) -> None:
    ledger, steps = build([("runtime", "a", "ok"), ("strategies", "c", "ok"), ("store", "d", "ok")])
    calls: list[int] = []

    def broken() -> list[CleanupStep]:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("registry unreadable")
        return [CleanupStep("c2", steps.make("c2"))]

    ledger.add_phase_provider("strategies", broken)
    with pytest.raises(OSError, match="unreadable"):
        await ledger.aclose()
    assert steps.starts() == ["a", "c", "d"]
    assert ledger.state is LedgerState.CLOSING
    await ledger.aclose()
    assert steps.starts() == ["a", "c", "d", "c2"]
    assert ledger.state is LedgerState.CLOSED


async def test_closed_ledger_close_checkpoints_and_reraises_caller_cancellation() -> None:
    ledger, _ = build([])
    await ledger.aclose()
    with anyio.CancelScope() as scope:
        scope.cancel()
        await ledger.aclose()
        pytest.fail("aclose() on a closed ledger must still checkpoint")  # pragma: no cover
    assert scope.cancelled_caught


def test_unwrap_group_keeps_type_code_and_instance() -> None:
    ki, exit_, error = KeyboardInterrupt(), SystemExit(4), ValueError("x")
    assert unwrap_group(BaseExceptionGroup("g", [BaseExceptionGroup("h", [ki])])) is ki
    assert unwrap_group(BaseExceptionGroup("g", [exit_])) is exit_
    assert unwrap_group(error) is error
    pair = ExceptionGroup("g", [ValueError(), KeyError()])
    assert unwrap_group(pair) is pair

    original_context = RuntimeError("context")
    error.__context__ = original_context
    with pytest.raises(ValueError) as info, unwrap_group():
        raise ExceptionGroup("g", [error])
    assert info.value is error
    assert error.__context__ is original_context
    with pytest.raises(SystemExit) as exit_info, unwrap_group():
        raise BaseExceptionGroup("g", [exit_])
    assert exit_info.value.code == 4
    with pytest.raises(ExceptionGroup), unwrap_group():
        raise pair


async def test_c7_5_only_failed_in_tells_strategy_only_failures() -> None:
    ledger, steps = build([
        ("runtime", "a", "ok"),
        ("strategies", "c1", "raise"),
        ("strategies", "c2", "raise"),
    ])
    assert not ledger.only_failed_in("strategies")
    with pytest.raises(ValueError):
        await ledger.aclose()
    assert ledger.only_failed_in("strategies")
    assert not ledger.only_failed_in("store")
    assert not ledger.finished
    steps.modes.update(c1="ok", c2="ok")
    await ledger.aclose()
    assert ledger.finished
    assert not ledger.only_failed_in("strategies")

    mixed, mixed_steps = build([("strategies", "c", "raise"), ("store", "d", "raise")])
    with pytest.raises(ValueError):
        await mixed.aclose()
    assert not mixed.only_failed_in("strategies")
    assert mixed_steps.starts() == ["c", "d"]


async def test_c2_4_provider_may_return_name_and_function_pairs() -> None:
    steps = Steps()
    ledger = CleanupLedger("host")
    ledger.add_phase_provider("strategies", lambda: [("lease one", steps.make("one"))])
    ledger.add_phase_provider("strategies", lambda: [CleanupStep("lease two", steps.make("two"))])
    await ledger.aclose()
    assert steps.starts() == ["one", "two"]
    assert ledger.statistics().completed == ("lease one", "lease two")
