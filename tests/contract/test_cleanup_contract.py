"""CONTRACT.md, clause by clause, at the level of the owners users hold.

Each test is named after the clause it proves (``test_c2_3_...``) and runs on
both backends unless the clause is backend-specific, in which case the other
backend's equivalent is tested too. The ledger's own unit tests
(tests/core/test_ledger.py, tests/core/test_leases.py) prove the mechanism in isolation;
these prove that ExecutorHost, ParallelBatchProcessor, LLMCallPool and the
high-level surfaces keep the contract.
"""

from __future__ import annotations

import gc
import logging
import signal
import weakref
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from trio_batch_llm import (
    CLEANUP_FAILED,
    CLEANUP_TIMED_OUT,
    PROGRESS_TASK_CANCELLATION_TIMEOUT,
    WORKER_CANCELLATION_TIMEOUT,
    AdmissionClosedError,
    BatchInterruptedError,
    BatchLLMError,
    CleanupInterruptedError,
    FakeStrategy,
    LLMCallPool,
    LLMCallStrategy,
    LLMWorkItem,
    ParallelBatchProcessor,
    ProcessorConfig,
    RetryState,
    StreamFinalizationError,
    TokenUsage,
    call_result,
    process_prompts,
    process_stream,
    with_cleanup,
)
from trio_batch_llm._core._leases import lease_registry

from .._paths import ROOT
from ..conftest import ASYNCIO_ONLY, raise_foreign_cancellation, trio_virtual_clock

pytestmark = pytest.mark.anyio

TRIO_VIRTUAL = pytest.mark.parametrize(
    "anyio_backend", [pytest.param(trio_virtual_clock(), id="trio-virtual")]
)


# --- misbehaving fakes --------------------------------------------------------


class Log:
    """The exact order of step starts and ends, across every fake."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def __call__(self, event: str) -> None:
        self.events.append(event)

    def index(self, event: str) -> int:
        return self.events.index(event)


class Scripted(LLMCallStrategy[str]):
    """A strategy whose execute and cleanup misbehave on demand.

    execute modes: "ok", "hang" (until cancelled), "linger" (when cancelled,
    lingers shielded for ``linger`` seconds), "gate" (waits for ``gate``).
    cleanup modes: "ok", "raise", "hang", "slow" (``slow`` seconds), "interrupt"
    (raises a third party's cancellation), "keyboard_interrupt", "system_exit".
    """

    def __init__(
        self,
        log: Log,
        name: str = "s",
        *,
        execute: str = "ok",
        cleanup: str = "ok",
        linger: float = 0.0,
        slow: float = 0.0,
    ) -> None:
        self.log = log
        self.name = name
        self.execute_mode = execute
        self.cleanup_mode = cleanup
        self.linger = linger
        self.slow = slow
        self.gate = anyio.Event()
        self.started = anyio.Event()
        self.prepares = 0
        self.cleanups = 0
        self.errors: list[BaseException] = []

    async def prepare(self) -> None:
        self.prepares += 1
        self.log(f"{self.name}:prepare")
        await anyio.lowlevel.checkpoint()

    async def execute(
        self, prompt: str, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[str, TokenUsage | None, Any]:
        self.started.set()
        mode = self.execute_mode
        try:
            if mode == "hang":
                await anyio.sleep_forever()
            elif mode == "gate":
                await self.gate.wait()
            elif mode == "linger":
                await anyio.sleep_forever()
            else:
                await anyio.lowlevel.checkpoint()
        except anyio.get_cancelled_exc_class():
            self.log(f"{self.name}:execute cancelled")
            if mode == "linger":
                with anyio.CancelScope(shield=True):
                    await anyio.sleep(self.linger)
                self.log(f"{self.name}:execute lingered")
            raise
        return f"{self.name}:{prompt}", {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}, None

    async def cleanup(self) -> None:
        self.cleanups += 1
        self.log(f"{self.name}:cleanup start")
        mode = self.cleanup_mode
        try:
            if mode == "raise":
                await anyio.lowlevel.checkpoint()
                error = CleanupBoom(f"{self.name} cleanup failed")
                self.errors.append(error)
                raise error
            if mode == "hang":
                await anyio.sleep_forever()
            if mode == "slow":
                await anyio.sleep(self.slow)
            if mode == "interrupt":
                await raise_foreign_cancellation()
            if mode == "keyboard_interrupt":
                await anyio.lowlevel.checkpoint()
                raise KeyboardInterrupt
            if mode == "system_exit":
                await anyio.lowlevel.checkpoint()
                raise SystemExit(3)
            await anyio.lowlevel.checkpoint()
        except anyio.get_cancelled_exc_class():
            self.log(f"{self.name}:cleanup cancelled")
            raise
        self.log(f"{self.name}:cleanup end")


class CleanupBoom(RuntimeError):
    """A user cleanup failure (a subclass, so a weak reference can watch it die)."""


class RecordingStore:
    """An in-memory artifact store that logs open/append/close, with a scriptable close."""

    def __init__(self, log: Log, *, close: str = "ok", slow: float = 0.0, fail_append: bool = False) -> None:
        self.log = log
        self.close_mode = close
        self.slow = slow
        self.fail_append = fail_append
        self.records: list[str] = []
        self.closes = 0
        self.path = Path("memory://recording")

    async def open(self) -> None:
        self.log("store:open")
        await anyio.lowlevel.checkpoint()

    async def load(self) -> dict[str, Any]:
        await anyio.lowlevel.checkpoint()
        return {}

    async def count_records(self) -> int:
        await anyio.lowlevel.checkpoint()
        return 0

    async def append(self, result: Any, *, fingerprint: str, prompt: str | None = None) -> None:
        await anyio.lowlevel.checkpoint()
        if self.fail_append:
            raise OSError("disk full")
        self.records.append(result.item_id)

    async def aclose(self) -> None:
        self.closes += 1
        self.log("store:close start")
        if self.close_mode == "slow":
            await anyio.sleep(self.slow)
        elif self.close_mode == "raise":
            await anyio.lowlevel.checkpoint()
            raise OSError("store close failed")
        else:
            await anyio.lowlevel.checkpoint()
        self.log("store:close end")


def item(strategy: LLMCallStrategy[str], n: int) -> LLMWorkItem[str]:
    return LLMWorkItem(item_id=f"i{n}", strategy=strategy, prompt=f"p{n}")


async def settle() -> None:
    for _ in range(30):
        await anyio.lowlevel.checkpoint()


@pytest.fixture(autouse=True)
def _collect_strays_first() -> None:
    """Collect an earlier test's dropped leases before this one counts warnings.

    A lease a test let go of on purpose is reported when the garbage collector finds it, which may
    be during a later test: on 3.12 CI once counted it among ``test_c1_4``'s warnings (2, not 1).
    """
    gc.collect()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# --- C1: with_cleanup ----------------------------------------------------------


@pytest.mark.parametrize("body_mode", ["returns", "raises", "cancelled"])
async def test_c1_1_cleanup_starts_exactly_once_on_every_exit_path(body_mode: str) -> None:
    starts: list[str] = []

    async def body() -> int:
        await anyio.lowlevel.checkpoint()
        if body_mode == "raises":
            raise ValueError("body")
        if body_mode == "cancelled":
            await anyio.sleep_forever()
        return 1

    async def cleanup() -> None:
        starts.append("cleanup")
        await anyio.lowlevel.checkpoint()

    with anyio.CancelScope() as scope:
        if body_mode == "cancelled":
            scope.cancel()
        try:
            await with_cleanup(body, cleanup, cleanup_timeout=1)
        except ValueError:
            pass
    assert starts == ["cleanup"]


@TRIO_VIRTUAL
async def test_c1_2_hanging_cleanup_is_cancelled_at_its_bound_and_has_exited() -> None:
    events: list[str] = []

    async def body() -> str:
        await anyio.lowlevel.checkpoint()
        return "v"

    async def cleanup() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            events.append("cleanup exited")

    t0 = anyio.current_time()
    assert await with_cleanup(body, cleanup, cleanup_timeout=3.0) == "v"
    assert anyio.current_time() - t0 == 3.0
    assert events == ["cleanup exited"]


async def test_c1_3_body_exception_kept_with_one_note() -> None:
    original = ValueError("body")

    async def body() -> None:
        await anyio.lowlevel.checkpoint()
        raise original

    async def cleanup() -> None:
        await anyio.lowlevel.checkpoint()
        raise RuntimeError("cleanup")

    with pytest.raises(ValueError) as info:
        await with_cleanup(body, cleanup, cleanup_timeout=1)
    assert info.value is original
    assert info.value.__notes__ == [CLEANUP_FAILED]


async def test_c1_4_body_returned_cleanup_problem_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> int:
        await anyio.lowlevel.checkpoint()
        return 7

    async def cleanup() -> None:
        await anyio.lowlevel.checkpoint()
        raise RuntimeError("cleanup")

    assert await with_cleanup(body, cleanup, cleanup_timeout=1) == 7
    assert len(warnings_of(caplog)) == 1


async def test_c1_5_cleanup_never_swallows_keyboard_interrupt_or_system_exit() -> None:
    async def body() -> int:
        await anyio.lowlevel.checkpoint()
        return 1

    for exc_type in (KeyboardInterrupt, SystemExit):

        async def cleanup(exc_type: type[BaseException] = exc_type) -> None:
            await anyio.lowlevel.checkpoint()
            raise exc_type

        with pytest.raises(exc_type):
            await with_cleanup(body, cleanup, cleanup_timeout=1)


@TRIO_VIRTUAL
async def test_c1_6_timed_out_note_on_cancelled_body() -> None:
    async def body() -> None:
        await anyio.sleep_forever()

    async def cleanup() -> None:
        await anyio.sleep_forever()

    caught: list[BaseException] = []
    with anyio.CancelScope() as scope:
        scope.cancel()
        try:
            await with_cleanup(body, cleanup, cleanup_timeout=2)
        except anyio.get_cancelled_exc_class() as exc:
            caught.append(exc)
            raise
    assert [getattr(e, "__notes__", None) for e in caught] == [[CLEANUP_TIMED_OUT]]


# --- C2: ordered close -----------------------------------------------------------


@TRIO_VIRTUAL
async def test_c2_1_phases_in_order_and_no_close_deadline() -> None:
    log = Log()
    strategy = Scripted(log, execute="hang", cleanup="slow", slow=3600.0)
    store = RecordingStore(log)
    t0 = anyio.current_time()
    async with ParallelBatchProcessor[str](ProcessorConfig(concurrency=2), artifact_store=store) as proc:
        proc.start()
        await proc.add_work(item(strategy, 0))
        await strategy.started.wait()
    # Workers stopped first, then the strategy's (hour-long) cleanup ran to the end, then the store.
    assert log.events == [
        "store:open",
        "s:prepare",
        "s:execute cancelled",
        "s:cleanup start",
        "s:cleanup end",
        "store:close start",
        "store:close end",
    ]
    assert anyio.current_time() - t0 == 3600.0
    assert proc.state == "closed"


async def test_c2_2_a_failing_step_does_not_stop_its_siblings() -> None:
    log = Log()
    first, second = Scripted(log, "a", cleanup="raise"), Scripted(log, "b")
    store = RecordingStore(log)
    proc = ParallelBatchProcessor[str](artifact_store=store)
    with pytest.raises(RuntimeError, match="a cleanup failed"):
        async with proc:
            await proc.add_work(item(first, 0))
            await proc.add_work(item(second, 1))
            await proc.process_all()
    assert "b:cleanup end" in log.events and "store:close end" in log.events
    assert store.closes == 1


@TRIO_VIRTUAL
async def test_c2_3_a_running_worker_is_a_barrier() -> None:
    log = Log()
    strategy = Scripted(log, execute="linger", linger=5.0)
    async with ParallelBatchProcessor[str]() as proc:
        proc.start()
        await proc.add_work(item(strategy, 0))
        await strategy.started.wait()
        t0 = anyio.current_time()
    # The strategy was not cleaned up while the worker using it still lingered.
    assert log.events[-4:] == [
        "s:execute cancelled",
        "s:execute lingered",
        "s:cleanup start",
        "s:cleanup end",
    ]
    assert anyio.current_time() - t0 == 5.0


async def test_c2_4_strategy_prepared_during_the_pools_drain_is_still_closed() -> None:
    log = Log()
    fallback = Scripted(log, "fallback")

    class Escalating(Scripted):
        async def execute(
            self, prompt: str, attempt: int, timeout: float | None, state: RetryState | None = None
        ) -> tuple[str, TokenUsage | None, Any]:
            self.started.set()
            await self.gate.wait()  # released while the pool is already draining
            await pool.host.ensure_prepared(fallback)
            return await fallback.execute(prompt, attempt, timeout, state)

    primary = Escalating(log, "primary")
    pool = LLMCallPool[str](primary)
    results: list[Any] = []
    async with anyio.create_task_group() as tg, pool:

        async def submit() -> None:
            results.append(await pool.submit_result("p"))

        tg.start_soon(submit)
        await primary.started.wait()

        async def release_during_drain() -> None:
            await settle()
            assert pool.state == "closing"
            primary.gate.set()

        tg.start_soon(release_during_drain)
    assert results[0].success and results[0].output == "fallback:p"
    assert fallback.cleanups == 1 and primary.cleanups == 1
    assert log.index("fallback:prepare") < log.index("fallback:cleanup start")


@TRIO_VIRTUAL
async def test_c2_5_pool_drain_and_store_close_run_to_completion() -> None:
    log = Log()
    strategy = Scripted(log, execute="gate")
    pool = LLMCallPool[str](strategy)
    results: list[Any] = []
    async with anyio.create_task_group() as tg, pool:

        async def submit() -> None:
            results.append(await pool.submit_result("p"))

        tg.start_soon(submit)
        await strategy.started.wait()

        async def finish_later() -> None:
            await anyio.sleep(10)
            strategy.gate.set()

        tg.start_soon(finish_later)
        t0 = anyio.current_time()
    assert anyio.current_time() - t0 == 10.0
    assert results[0].success  # the admitted request finished, it was not cancelled
    with pytest.raises(AdmissionClosedError):
        await pool.submit("late")

    store = RecordingStore(log, close="slow", slow=30.0)
    with anyio.CancelScope() as caller:
        async with ParallelBatchProcessor[str](artifact_store=store) as proc:
            await proc.add_work(item(FakeStrategy(), 1))
            await proc.process_all()
            caller.cancel()  # the close below runs with the caller cancelled
    assert log.events[-1] == "store:close end"


async def test_c2_6_process_all_leaves_teardown_to_exit_and_stream_finalizes_first() -> None:
    log = Log()
    strategy = Scripted(log)
    store = RecordingStore(log)
    async with ParallelBatchProcessor[str](artifact_store=store) as proc:
        await proc.add_work(item(strategy, 0))
        await proc.process_all()
        assert strategy.cleanups == 0 and store.closes == 0
    assert strategy.cleanups == 1 and store.closes == 1

    log2 = Log()
    strategy2 = Scripted(log2)
    store2 = RecordingStore(log2)
    async with ParallelBatchProcessor[str](artifact_store=store2) as proc2:
        proc2.start()
        await proc2.add_work(item(strategy2, 0))
        await proc2.finish()
        seen = [r.item_id async for r in proc2.results()]
        # End-of-stream came only after the ordered close.
        assert seen == ["i0"] and strategy2.cleanups == 1 and store2.closes == 1
        assert proc2.state == "closed"


@TRIO_VIRTUAL
async def test_c2_7_worker_timeout_is_diagnostic_only(caplog: pytest.LogCaptureFixture) -> None:
    assert WORKER_CANCELLATION_TIMEOUT == PROGRESS_TASK_CANCELLATION_TIMEOUT == 2.0
    log = Log()
    strategy = Scripted(log, execute="linger", linger=WORKER_CANCELLATION_TIMEOUT * 3)
    async with ParallelBatchProcessor[str]() as proc:
        proc.start()
        await proc.add_work(item(strategy, 0))
        await strategy.started.wait()
        t0 = anyio.current_time()
    assert anyio.current_time() - t0 == WORKER_CANCELLATION_TIMEOUT * 3  # the wait went on
    slow = [m for m in warnings_of(caplog) if "processor workers" in m]
    assert len(slow) == 1
    assert log.index("s:execute lingered") < log.index("s:cleanup start")


# --- C3: cancellation deliveries -------------------------------------------------


async def test_c3_1_cancelled_at_entry_is_one_deferred_delivery() -> None:
    log = Log()
    strategy = Scripted(log)
    store = RecordingStore(log)
    proc = ParallelBatchProcessor[str](artifact_store=store)
    with anyio.CancelScope() as caller:
        async with proc:
            await proc.add_work(item(strategy, 0))
            await proc.process_all()
            caller.cancel()
            await anyio.lowlevel.checkpoint()  # __aexit__ is reached by the cancellation
    assert caller.cancelled_caught
    assert log.events[-4:] == ["s:cleanup start", "s:cleanup end", "store:close start", "store:close end"]
    assert proc.host.ledger.statistics().deliveries == 1


@TRIO_VIRTUAL
async def test_c3_2_cancellation_during_close_is_deferred_then_reraised() -> None:
    log = Log()
    strategy = Scripted(log, cleanup="slow", slow=10.0)
    store = RecordingStore(log)
    with anyio.CancelScope() as caller:
        async with ParallelBatchProcessor[str](artifact_store=store) as proc:
            await proc.add_work(item(strategy, 0))
            await proc.process_all()
            caller.deadline = anyio.current_time() + 1.0  # lands during the 10 s cleanup
        pytest.fail("the deferred cancellation must be re-raised")  # pragma: no cover
    assert caller.cancelled_caught
    assert log.events[-3:] == ["s:cleanup end", "store:close start", "store:close end"]
    assert proc.state == "closed"


async def test_c3_3_force_close_abandons_the_running_step(caplog: pytest.LogCaptureFixture) -> None:
    log = Log()
    strategy = Scripted(log, cleanup="hang")
    store = RecordingStore(log)
    proc = ParallelBatchProcessor[str](artifact_store=store)
    outcome: list[BaseException] = []
    async with proc:
        await proc.add_work(item(strategy, 0))
        await proc.process_all()

        async def close() -> None:
            try:
                await proc.aclose()
            except CleanupInterruptedError as exc:
                outcome.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(close)
            await settle()
            assert log.events[-1] == "s:cleanup start"
            proc.force_close()
        assert len(outcome) == 1
        assert log.events[-1] == "s:cleanup cancelled"  # the running step was cancelled and exited
        assert store.closes == 0  # the dependent store was not closed
        assert proc.state == "closing"
        warning = [m for m in warnings_of(caplog) if "abandon" in m.lower()]
        assert len(warning) == 1 and "artifact store" in warning[0]
        # A later close finishes only the unfinished steps.
        strategy.cleanup_mode = "ok"
        await proc.aclose()
        assert proc.state == "closed" and store.closes == 1 and strategy.cleanups == 2


@ASYNCIO_ONLY
async def test_c3_3_second_native_cancel_aborts_asyncio() -> None:
    import asyncio

    log = Log()
    strategy = Scripted(log, cleanup="hang")
    store = RecordingStore(log)
    proc = ParallelBatchProcessor[str](artifact_store=store)
    entered = asyncio.Event()

    async def owner() -> None:
        async with proc:
            await proc.add_work(item(strategy, 0))
            await proc.process_all()
            entered.set()

    task = asyncio.ensure_future(owner())
    await entered.wait()
    await settle()
    assert log.events[-1] == "s:cleanup start"
    task.cancel()  # first delivery: deferred
    await settle()
    assert not task.done()
    task.cancel()  # second delivery: forced abort
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log.events[-1] == "s:cleanup cancelled" and store.closes == 0
    assert proc.state == "closing"


@ASYNCIO_ONLY
async def test_c3_3_second_native_cancel_propagates_past_the_callers_cancelled_scope() -> None:
    """The caller's deadline was the first delivery; a Task.cancel() forces and must get past that scope."""
    import asyncio

    log = Log()
    strategy = Scripted(log, execute="hang", cleanup="hang")
    store = RecordingStore(log)
    proc = ParallelBatchProcessor[str](artifact_store=store)
    scopes: list[anyio.CancelScope] = []
    reached: list[str] = []

    async def owner() -> None:
        with anyio.move_on_after(3600) as deadline:
            scopes.append(deadline)
            async with proc:
                await proc.add_work(item(strategy, 0))
                await proc.process_all()
        reached.append("after the block")

    task = asyncio.ensure_future(owner())
    await strategy.started.wait()
    scopes[0].deadline = anyio.current_time()  # expires mid-batch: the first delivery, deferred
    await settle()
    assert log.events[-1] == "s:cleanup start" and not task.done()
    task.cancel()  # second delivery: forced abort
    with pytest.raises(asyncio.CancelledError):
        await task
    assert reached == [] and task.cancelled()
    assert log.events[-1] == "s:cleanup cancelled" and store.closes == 0


@TRIO_VIRTUAL
async def test_c3_1_cancellation_during_the_close_is_counted_when_it_happens() -> None:
    log = Log()
    strategy = Scripted(log, cleanup="slow", slow=10.0)
    proc = ParallelBatchProcessor[str](artifact_store=RecordingStore(log))
    counted: list[int] = []

    async def watch() -> None:
        await anyio.sleep(5.0)  # the deadline (1 s) expired during the 10 s cleanup
        counted.append(proc.host.ledger.statistics().deliveries)

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        with anyio.CancelScope() as caller:
            async with proc:
                await proc.add_work(item(strategy, 0))
                await proc.process_all()
                caller.deadline = anyio.current_time() + 1.0
    assert counted == [1] and caller.cancelled_caught
    assert proc.host.ledger.statistics().deliveries == 1 and proc.state == "closed"


def _close_pressing_ctrl_c_trio(presses: int) -> tuple[Log, RecordingStore, ParallelBatchProcessor[str]]:
    """A Trio close whose strategy cleanup presses Ctrl+C ``presses`` times, then hangs.

    Each press goes through Trio's own SIGINT handler from a KI-protected
    function, so the KeyboardInterrupt is handed to the main task's next
    checkpoint: the closer's wait. A first press is counted as the first
    delivery and the cleanup is let go on (it returns when it sees it was
    counted); a further press forces.
    """
    import trio

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:  # pragma: no cover
        pytest.skip("SIGINT handler replaced by the environment")

    @trio.lowlevel.enable_ki_protection
    def press_ctrl_c() -> None:
        signal.raise_signal(signal.SIGINT)

    log = Log()
    proc = ParallelBatchProcessor[str](artifact_store=RecordingStore(log))

    class PressesCtrlC(Scripted):
        async def cleanup(self) -> None:
            self.log("s:cleanup start")
            try:
                for press in range(presses):
                    press_ctrl_c()
                    while proc.host.ledger.statistics().deliveries <= press:
                        await trio.lowlevel.checkpoint()
                    self.log(f"s:counted {press + 1}")
                if presses > 1:
                    await trio.sleep_forever()
            except trio.Cancelled:
                self.log("s:cleanup cancelled")
                raise
            self.log("s:cleanup end")

    strategy = PressesCtrlC(log)

    async def main() -> None:
        async with proc:
            await proc.add_work(item(strategy, 0))
            await proc.process_all()

    with pytest.raises(KeyboardInterrupt):
        trio.run(main)
    return log, proc._publisher.store, proc  # type: ignore[return-value]


def test_c3_2_first_keyboard_interrupt_reaching_the_closer_is_deferred_trio() -> None:
    log, store, proc = _close_pressing_ctrl_c_trio(presses=1)
    assert log.events[-5:] == [
        "s:cleanup start", "s:counted 1", "s:cleanup end", "store:close start", "store:close end",
    ]
    assert store.closes == 1 and proc.state == "closed"


def test_c3_3_second_keyboard_interrupt_reaching_the_closer_aborts_trio() -> None:
    log, store, proc = _close_pressing_ctrl_c_trio(presses=2)
    # The second press forces: the cleanup is cancelled at its next checkpoint, the store stays open.
    assert log.events[-3:] == ["s:cleanup start", "s:counted 1", "s:cleanup cancelled"]
    assert store.closes == 0 and proc.state == "closing"
    assert proc.host.ledger.statistics().deliveries == 2


async def test_c3_4_a_step_interrupted_by_a_third_party_is_retried_later() -> None:
    log = Log()
    strategy = Scripted(log, cleanup="interrupt")
    store = RecordingStore(log)
    proc = ParallelBatchProcessor[str](artifact_store=store)
    with pytest.raises(CleanupInterruptedError) as info:
        async with proc:
            await proc.add_work(item(strategy, 0))
            await proc.process_all()
    assert isinstance(info.value.__cause__, anyio.get_cancelled_exc_class())
    assert proc.state == "closing" and store.closes == 1  # siblings still ran; the step is not checkpointed
    strategy.cleanup_mode = "ok"
    await proc.aclose()
    assert strategy.cleanups == 2 and store.closes == 1 and proc.state == "closed"


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_c3_5_identical_on_both_backends(backend: str) -> None:
    """The same misbehaving close gives the same observable sequence on each backend."""

    async def scenario() -> list[str]:
        log = Log()
        strategy = Scripted(log, cleanup="raise")
        store = RecordingStore(log)
        try:
            async with ParallelBatchProcessor[str](artifact_store=store) as proc:
                await proc.add_work(item(strategy, 0))
                await proc.process_all()
        except RuntimeError:
            log("raised")
        return log.events

    expected = [
        "store:open",
        "s:prepare",
        "s:cleanup start",
        "store:close start",
        "store:close end",
        "raised",
    ]
    assert anyio.run(scenario, backend=backend) == expected


# --- C4: retry, idempotency, lifecycle ------------------------------------------


async def test_c4_1_completed_steps_are_never_repeated() -> None:
    log = Log()
    strategy = Scripted(log, cleanup="raise")
    store = RecordingStore(log)
    proc = ParallelBatchProcessor[str](artifact_store=store)
    with pytest.raises(RuntimeError):
        async with proc:
            await proc.add_work(item(strategy, 0))
            await proc.process_all()
    strategy.cleanup_mode = "ok"
    await proc.aclose()
    await proc.aclose()
    assert store.closes == 1 and strategy.cleanups == 2


async def test_c4_2_failed_step_retried_once_per_explicit_close() -> None:
    log = Log()
    strategy = Scripted(log, cleanup="raise")
    proc = ParallelBatchProcessor[str]()
    with pytest.raises(RuntimeError):
        async with proc:
            await proc.add_work(item(strategy, 0))
            await proc.process_all()
    assert strategy.cleanups == 1
    with pytest.raises(RuntimeError):
        await proc.aclose()
    assert strategy.cleanups == 2


async def test_c4_3_automatic_exit_applies_the_finalization_attempt() -> None:
    log = Log()
    strategy = Scripted(log, cleanup="raise")
    async with ParallelBatchProcessor[str]() as proc:
        proc.start()
        await proc.add_work(item(strategy, 0))
        await proc.finish()
        with pytest.raises(RuntimeError, match="s cleanup failed"):
            async for _ in proc.results():
                pass
    # Leaving the block did not run the close again.
    assert strategy.cleanups == 1 and proc.state == "closing"


async def test_c4_4_concurrent_closes_share_one_attempt() -> None:
    log = Log()
    strategy = Scripted(log, cleanup="slow", slow=0.05)
    proc = ParallelBatchProcessor[str]()
    async with proc:
        await proc.add_work(item(strategy, 0))
        await proc.process_all()
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(proc.aclose)
    assert strategy.cleanups == 1 and proc.state == "closed"


def test_c4_5_cleanup_must_be_idempotent_and_the_docs_say_so() -> None:
    assert "idempotent" in (LLMCallStrategy.cleanup.__doc__ or "")
    docs = (ROOT / "docs" / "cleanup-contract.md").read_text(encoding="utf-8")
    assert "idempotent" in docs


async def test_c4_6_failed_outcomes_not_retained(monkeypatch: pytest.MonkeyPatch) -> None:
    # pytest's log capture would keep the traceback alive; watch the engine alone.
    monkeypatch.setattr(logging.getLogger("trio_batch_llm"), "propagate", False)
    log = Log()
    strategy = Scripted(log, cleanup="raise")
    proc = ParallelBatchProcessor[str]()
    try:
        async with proc:
            await proc.add_work(item(strategy, 0))
            await proc.process_all()
    except RuntimeError:
        pass
    ref = weakref.ref(strategy.errors.pop())
    gc.collect()
    assert ref() is None
    report = proc.host.ledger.last_attempt_report
    assert report is not None and report.outcome == "failed"


async def test_c4_7_lifecycle_is_one_way_and_closing_strategies_refuse_preparation() -> None:
    log = Log()
    strategy = Scripted(log, cleanup="raise")
    proc = ParallelBatchProcessor[str]()
    states = [proc.state]
    with pytest.raises(RuntimeError):
        async with proc:
            await proc.add_work(item(strategy, 0))
            await proc.process_all()
    states.append(proc.state)
    with pytest.raises(AdmissionClosedError):
        await proc.host.ensure_prepared(Scripted(log, "late"))
    strategy.cleanup_mode = "ok"
    await proc.aclose()
    states.append(proc.state)
    assert states == ["open", "closing", "closed"]
    with pytest.raises(AdmissionClosedError):
        await proc.add_work(item(strategy, 1))


# --- C5: shared strategy leases ----------------------------------------------------


async def test_c5_1_overlapping_hosts_share_preparation_and_only_the_last_cleans_up() -> None:
    log = Log()
    strategy = Scripted(log)
    first = ParallelBatchProcessor[str]()
    second = ParallelBatchProcessor[str]()
    async with first:
        await first.add_work(item(strategy, 0))
        await first.process_all()
        async with second:
            await second.add_work(item(strategy, 1))
            await second.process_all()
        assert strategy.prepares == 1 and strategy.cleanups == 0  # a non-last release
    assert strategy.cleanups == 1


async def test_c5_2_failed_last_cleanup_keeps_the_lease_and_a_newcomer_prepares_again() -> None:
    log = Log()
    strategy = Scripted(log, cleanup="raise")
    first = ParallelBatchProcessor[str]()
    with pytest.raises(RuntimeError):
        async with first:
            await first.add_work(item(strategy, 0))
            await first.process_all()
    assert strategy.cleanups == 1
    strategy.cleanup_mode = "ok"
    async with ParallelBatchProcessor[str]() as second:
        await second.add_work(item(strategy, 1))
        await second.process_all()
        # After a failed cleanup the newcomer prepares again (the old state is suspect).
        assert strategy.prepares == 2
        await first.aclose()  # `first` kept its lease, but is no longer the last owner: no cleanup
        assert strategy.cleanups == 1 and first.state == "closed"
    assert strategy.cleanups == 2  # the last owner's release cleaned up
    async with ParallelBatchProcessor[str]() as third:
        await third.add_work(item(strategy, 2))
        await third.process_all()
    assert strategy.prepares == 3


async def test_c5_3_abandoned_leases_are_dropped_without_async_cleanup() -> None:
    log = Log()
    strategy = Scripted(log)
    registry = lease_registry()
    lease = await registry.acquire(strategy)
    assert registry.holders(strategy) == 1
    del lease
    gc.collect()
    await settle()
    assert registry.holders(strategy) == 0
    assert strategy.cleanups == 0  # nothing asynchronous was scheduled


# --- C6: stream finalization ---------------------------------------------------------


async def test_c6_1_no_clean_end_without_successful_finalization() -> None:
    log = Log()
    strategy = Scripted(log, cleanup="raise")
    seen: list[str] = []
    async with ParallelBatchProcessor[str]() as proc:
        proc.start()
        await proc.add_work(item(strategy, 0))
        await proc.finish()
        with pytest.raises(RuntimeError, match="s cleanup failed"):
            async for result in proc.results():
                seen.append(result.item_id)
    assert seen == ["i0"]


async def test_c6_2_first_decision_wins_a_worker_crash_decides_failure() -> None:
    log = Log()
    store = RecordingStore(log, fail_append=True)
    async with ParallelBatchProcessor[str](artifact_store=store) as proc:
        proc.start()
        await proc.add_work(item(Scripted(log), 0))
        await proc.finish()
        for _ in range(2):  # repeated results() calls see the same terminal
            with pytest.raises(OSError, match="disk full") as info:
                async for _ in proc.results():
                    pass
        first_error = info.value
        with pytest.raises(OSError) as again:
            async for _ in proc.results():
                pass
        assert again.value is first_error  # the original instance, every time


async def test_c6_2_shutdown_before_finish_decides_failure() -> None:
    proc = ParallelBatchProcessor[str]()
    async with proc:
        proc.start()
        await proc.add_work(item(FakeStrategy(), 0))
    with pytest.raises(BatchInterruptedError, match="before finish"):
        async for _ in proc.results():
            pass


async def test_c6_3_busy_queue_cannot_postpone_a_failure_for_concurrent_readers() -> None:
    log = Log()

    class FailingStore(RecordingStore):
        async def append(self, result: Any, *, fingerprint: str, prompt: str | None = None) -> None:
            if result.item_id == "i5":
                await anyio.lowlevel.checkpoint()
                raise OSError("disk full at i5")
            await super().append(result, fingerprint=fingerprint, prompt=prompt)

    cfg = ProcessorConfig(concurrency=1, max_result_queue_size=100)
    outcomes: dict[str, list[Any]] = {"a": [], "b": []}
    async with ParallelBatchProcessor[str](cfg, artifact_store=FailingStore(log)) as proc:
        proc.start()
        added = 0
        for n in range(40):  # more keeps coming behind the crash, until it closes the input
            try:
                await proc.add_work(item(FakeStrategy(), n))
            except AdmissionClosedError:
                break
            added += 1
        assert added > 6  # items were queued behind the one that crashes
        # Until the crash has decided the terminal. Not a count of checkpoints: on asyncio the five items
        # took 270 to 22,000 of them (10-250 ms, on this commit and on 793a76d alike), so any count
        # fails now and then; the bound is only there to end a hung test.
        with anyio.fail_after(30):
            while proc.results_statistics().queued < 5:
                await anyio.lowlevel.checkpoint()
        await settle()
        queued = proc.results_statistics().queued
        assert queued == 5  # i0..i4 were published before the crash decided the terminal

        async def reader(name: str) -> None:
            try:
                async for r in proc.results():
                    outcomes[name].append(r.item_id)
                    await settle()  # slow readers: the queue stays busy
            except OSError as exc:
                outcomes[name].append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(reader, "a")
            tg.start_soon(reader, "b")
    delivered = sorted(x for name in "ab" for x in outcomes[name] if isinstance(x, str))
    assert delivered == [f"i{n}" for n in range(5)]  # the shared limit: queued ones, once each
    errors = [outcomes[name][-1] for name in "ab"]
    assert all(isinstance(e, OSError) and str(e) == "disk full at i5" for e in errors)
    assert errors[0] is errors[1]


async def test_c6_4_failures_keep_their_identity() -> None:
    log = Log()
    proc = ParallelBatchProcessor[str]()
    with anyio.CancelScope() as outer:
        async with proc:
            proc.start()
            await proc.add_work(item(Scripted(log, cleanup="slow", slow=0.2), 0))
            await proc.finish()

            async def finalize() -> None:
                async for _ in proc.results():
                    pass

            async with anyio.create_task_group() as tg:
                tg.start_soon(finalize)
                await settle()
                tg.cancel_scope.cancel()  # the finalizing reader is cancelled mid-close
            with pytest.raises(StreamFinalizationError) as info:
                async for _ in proc.results():
                    pass
            assert isinstance(info.value.__cause__, anyio.get_cancelled_exc_class())
            outer.cancel()


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
@pytest.mark.parametrize("kind", ["KeyboardInterrupt", "SystemExit"])
@pytest.mark.parametrize("surface", ["process_prompts", "process_stream"])
def test_c6_4_keyboard_interrupt_and_system_exit_from_a_worker_keep_type_and_code(
    backend: str, kind: str, surface: str
) -> None:
    """Asserted at the event loop's boundary: on asyncio these escape the loop itself, by design."""
    from trio_batch_llm import CallableStrategy

    raised: BaseException = KeyboardInterrupt() if kind == "KeyboardInterrupt" else SystemExit(3)

    async def raises(prompt: str) -> str:
        await anyio.lowlevel.checkpoint()
        raise raised

    async def main() -> None:
        if surface == "process_prompts":
            await process_prompts(CallableStrategy(raises), ["p"])
        else:
            async with process_stream(CallableStrategy(raises), ["p"]) as results:
                async for _ in results:
                    pass

    with pytest.raises(type(raised)) as info:
        anyio.run(main, backend=backend)
    assert info.value is raised
    if isinstance(raised, SystemExit):
        assert info.value.code == 3


@TRIO_VIRTUAL
async def test_c6_5_live_worker_prevents_finalization_and_sync_callbacks_use_threads() -> None:
    import threading

    log = Log()
    loop_thread = threading.get_ident()
    callback_threads: list[int] = []

    def slow_sync_progress(done: int, total: int | None, item_id: str) -> None:
        callback_threads.append(threading.get_ident())

    strategy = Scripted(log, execute="linger", linger=4.0)
    async with ParallelBatchProcessor[str](progress_callback=slow_sync_progress) as proc:
        proc.start()
        await proc.add_work(item(FakeStrategy(), 0))
        await proc.add_work(item(strategy, 1))
        await strategy.started.wait()
        proc.request_stop("test")
        # The in-flight item is still running: the stream may not end cleanly yet.
        t0 = anyio.current_time()
        with anyio.move_on_after(1.0):
            async for _ in proc.results():
                pass
        assert anyio.current_time() - t0 == 1.0
    assert callback_threads and loop_thread not in callback_threads


# --- C7: precedence and error types ---------------------------------------------------


async def test_c7_1_process_all_interrupted_by_a_concurrent_close() -> None:
    log = Log()
    strategy = Scripted(log, execute="hang")
    proc = ParallelBatchProcessor[str]()
    raised: list[BaseException] = []
    async with proc:
        for n in range(5):
            await proc.add_work(item(strategy, n))

        async def run() -> None:
            try:
                await proc.process_all()
            except BatchInterruptedError as exc:
                raised.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await strategy.started.wait()
            await proc.aclose()
    assert len(raised) == 1 and isinstance(raised[0], RuntimeError)

    proc2 = ParallelBatchProcessor[str]()
    async with proc2:
        for n in range(3):
            await proc2.add_work(item(Scripted(log, "h", execute="hang"), n))
        with anyio.CancelScope() as scope:
            scope.deadline = anyio.current_time() + 0.01
            await proc2.process_all()  # the caller's own cancellation stays a cancellation
        assert scope.cancelled_caught


async def test_c7_2_library_errors_are_batch_llm_errors_and_user_errors_are_not_wrapped() -> None:
    log = Log()
    strategy = Scripted(log, cleanup="raise")
    with pytest.raises(CleanupBoom) as info:
        async with ParallelBatchProcessor[str]() as proc:
            await proc.add_work(item(strategy, 0))
            await proc.process_all()
    assert info.value is strategy.errors[-1]
    for error_type in (
        AdmissionClosedError,
        BatchInterruptedError,
        CleanupInterruptedError,
        StreamFinalizationError,
    ):
        assert issubclass(error_type, BatchLLMError)
    original = ValueError("user bug")

    async def buggy(prompt: str) -> str:
        await anyio.lowlevel.checkpoint()
        raise original

    from trio_batch_llm import CallableStrategy

    result = await call_result(CallableStrategy(buggy), "p")
    assert result.exception is original


async def test_c7_3_first_ordinary_failure_raised_after_every_step(caplog: pytest.LogCaptureFixture) -> None:
    log = Log()
    first, second = Scripted(log, "a", cleanup="raise"), Scripted(log, "b", cleanup="raise")
    store = RecordingStore(log, close="raise")
    with pytest.raises(CleanupBoom, match="a cleanup failed"):
        # One worker, so `a` is prepared (and so released) first.
        async with ParallelBatchProcessor[str](ProcessorConfig(concurrency=1), artifact_store=store) as proc:
            await proc.add_work(item(first, 0))
            await proc.add_work(item(second, 1))
            await proc.process_all()
    assert "b:cleanup start" in log.events and "store:close start" in log.events
    logged = [r for r in caplog.records if r.exc_info]
    assert {str(r.exc_info[1]) for r in logged if r.exc_info} >= {"b cleanup failed", "store close failed"}


async def test_c7_4_body_exception_and_cancellation_never_replaced_by_cleanup_errors() -> None:
    log = Log()
    body_error = LookupError("body")
    with pytest.raises(LookupError) as info:
        async with ParallelBatchProcessor[str]() as proc:
            await proc.add_work(item(Scripted(log, cleanup="raise"), 0))
            await proc.process_all()
            raise body_error
    assert info.value is body_error

    with anyio.CancelScope() as caller:
        async with ParallelBatchProcessor[str]() as proc2:
            await proc2.add_work(item(Scripted(log, "c", cleanup="raise"), 0))
            await proc2.process_all()
            caller.cancel()
            await anyio.lowlevel.checkpoint()
    assert caller.cancelled_caught

    with pytest.raises(SystemExit) as exit_info, anyio.CancelScope() as caller2:
        async with ParallelBatchProcessor[str]() as proc3:
            await proc3.add_work(item(Scripted(log, "d", cleanup="system_exit"), 0))
            await proc3.process_all()
            caller2.cancel()
            await anyio.lowlevel.checkpoint()
    assert exit_info.value.code == 3


async def test_c7_5_convenience_apis_keep_results_when_only_strategy_cleanup_failed() -> None:
    log = Log()
    result = await call_result(Scripted(log, cleanup="raise"), "p")
    assert result.success and result.output == "s:p"
    batch = await process_prompts(Scripted(log, "b", cleanup="raise"), ["x", "y"])
    assert batch.succeeded == 2
    with pytest.raises(OSError, match="store close failed"):
        await process_prompts(Scripted(log, "c"), ["x"], artifact_store=RecordingStore(log, close="raise"))


def test_c7_6_breaking_changes_are_marked_in_the_changelog() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "**BREAKING**" in changelog
    assert "Keep a Changelog" in changelog
