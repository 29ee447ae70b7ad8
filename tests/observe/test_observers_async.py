"""Issue 34 point 3: async observers, awaited in a task the owner runs, behind a bounded queue.

The hooks are driven directly where a count or a log record is asserted; the
surfaces (processor, pool, process_prompts, process_stream) are driven end to
end. Everything about time runs on Trio's virtual clock, where times are exact.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from trio_batch_llm import (
    BaseObserver,
    CleanupInterruptedError,
    ConfigurationError,
    ExecutorHost,
    FakeStrategy,
    LLMCallPool,
    LLMWorkItem,
    ParallelBatchProcessor,
    ProcessingEvent,
    ProcessorConfig,
    RetryConfig,
    process_prompts,
    process_stream,
)
from trio_batch_llm._observe import _observer_feed
from trio_batch_llm._observe._events import (
    BatchFinished,
    BatchStarted,
    ItemCompleted,
    ItemFailed,
    ItemStarted,
)
from trio_batch_llm._observe._hooks import Hooks
from trio_batch_llm._values._categories import ErrorCategory

from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio

VIRTUAL = pytest.mark.parametrize("anyio_backend", [trio_virtual_clock()])
FAST = ProcessorConfig(concurrency=20)
QUICK_RETRY = RetryConfig(initial_wait=0.001, jitter=False)


class AsyncRecorder:
    """A duck-typed observer with an ``async def on_event``; a few checkpoints per event."""

    def __init__(self, *, shuffle: bool = False) -> None:
        self.events: list[Any] = []
        self._random = random.Random(7) if shuffle else None

    async def on_event(self, event: Any) -> None:
        if self._random is not None:
            for _ in range(self._random.randrange(4)):
                await anyio.lowlevel.checkpoint()
        self.events.append(event)


class SyncRecorder:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def on_event(self, event: Any) -> None:
        self.events.append(event)


class PerEvent(BaseObserver):
    """async-batch-llm's habit: ``async def`` per-event methods on a ``BaseObserver``."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def on_batch_started(self, event: BatchStarted) -> None:
        await anyio.lowlevel.checkpoint()
        self.seen.append("batch")

    async def on_item_completed(self, event: ItemCompleted) -> None:
        await anyio.lowlevel.checkpoint()
        self.seen.append(f"ok:{event.result.item_id}")

    def on_item_failed(self, event: ItemFailed) -> None:  # a plain def beside async ones is fine
        self.seen.append(f"failed:{event.result.item_id}")

    async def on_batch_finished(self, event: BatchFinished) -> None:
        await anyio.lowlevel.checkpoint()
        self.seen.append("done")


def kinds(events: list[Any]) -> list[str]:
    return [type(event).__name__ for event in events]


# --- accepted shapes ---------------------------------------------------------------------------


async def test_base_observer_accepts_async_per_event_methods() -> None:
    observer = PerEvent()
    fake = FakeStrategy(script={"b": [ValueError("no")] * 3})
    config = ProcessorConfig(concurrency=2, retry=QUICK_RETRY)
    await process_prompts(fake, ["a", "b"], config=config, observers=[observer], preserve_order=True)
    assert observer.seen[0] == "batch" and observer.seen[-1] == "done"
    assert sorted(observer.seen[1:-1]) == ["failed:item-1", "ok:item-0"]


async def test_a_plain_object_with_an_async_on_event_gets_every_event_in_order() -> None:
    observer = AsyncRecorder()
    batch = await process_prompts(FakeStrategy(), ["a", "b", "c"], config=FAST, observers=[observer])
    assert batch.succeeded == 3
    names = kinds(observer.events)
    assert names[0] == "BatchStarted" and names[-1] == "BatchFinished"
    assert names.count("ItemStarted") == 3 and names.count("ItemCompleted") == 3


async def test_an_async_callable_is_an_observer_too() -> None:
    seen: list[Any] = []

    async def observe(event: Any) -> None:
        await anyio.lowlevel.checkpoint()
        seen.append(event)

    await process_prompts(FakeStrategy(), ["a"], config=FAST, observers=[observe])
    assert kinds(seen) == ["BatchStarted", "ItemStarted", "ItemCompleted", "BatchFinished"]


async def test_the_two_argument_on_event_of_async_batch_llm_gets_a_name_and_a_dict() -> None:
    received: list[tuple[str, dict[str, Any]]] = []
    events: list[Any] = []

    class Tracking(BaseObserver):
        async def on_event(self, event: Any, data: dict[str, Any]) -> None:
            events.append(event)
            received.append((event.name, data.copy()))

    await process_prompts(FakeStrategy(), ["a"], config=FAST, observers=[Tracking()])
    names = [name for name, _ in received]
    assert names == ["BATCH_STARTED", "ITEM_STARTED", "ITEM_COMPLETED", "BATCH_COMPLETED"]
    assert events[2] is ProcessingEvent.ITEM_COMPLETED and events[2] == "item_completed"
    started, item, completed, finished = (data for _, data in received)
    assert started["total"] == 1 and item["item_id"] == "item-0"
    assert completed["item_id"] == "item-0" and completed["result"].success
    assert finished["succeeded"] == 1 and finished["termination"].kind == "completed"


def test_a_plain_two_argument_on_event_is_still_refused_with_the_way_out() -> None:
    with pytest.raises(TypeError, match=r"async def on_event\(self, event, data\)"):
        class _TwoArgs(BaseObserver):
            def on_event(self, event: Any, data: Any) -> None:
                pass


def test_observer_timeout_is_checked_naming_the_field() -> None:
    assert ProcessorConfig().observer_timeout == 5.0
    assert ProcessorConfig(observer_timeout=None).observer_timeout is None
    for bad in (0, -1.0, float("inf"), "5", True):
        with pytest.raises(ConfigurationError, match="observer_timeout"):
            ProcessorConfig(observer_timeout=bad)  # type: ignore[arg-type]


# --- order, delivery before close --------------------------------------------------------------


async def test_each_async_observer_sees_the_events_in_the_order_they_were_emitted() -> None:
    # The sync recorder sees the emission order itself; each async one must see exactly it,
    # however its own awaits interleave with 20 workers and with the other async observer.
    sync, first, second = SyncRecorder(), AsyncRecorder(shuffle=True), AsyncRecorder(shuffle=True)
    fake = FakeStrategy(latency=(0.0, 0.002), failure_rate=0.2, seed=3)
    config = ProcessorConfig(concurrency=20, retry=QUICK_RETRY)
    await process_prompts(fake, [f"p{i}" for i in range(200)], config=config,
                          observers=[first, sync, second])
    assert len(sync.events) > 400
    assert "AttemptFailed" in kinds(sync.events)
    for observer in (first, second):
        assert len(observer.events) == len(sync.events)
        assert all(a is b for a, b in zip(observer.events, sync.events, strict=True))


async def test_terminal_events_reach_an_observer_that_keeps_up_before_close_returns() -> None:
    observer = AsyncRecorder(shuffle=True)
    async with ParallelBatchProcessor[str](FAST, observers=[observer]) as proc:
        for i in range(50):
            await proc.add_work(LLMWorkItem(item_id=f"i{i}", strategy=FakeStrategy(), prompt="x"))
        await proc.process_all()
    names = kinds(observer.events)
    assert names.count("ItemCompleted") == 50 and names[-1] == "BatchFinished"


async def test_a_stream_delivers_its_terminal_events_before_its_block_ends() -> None:
    observer = AsyncRecorder(shuffle=True)
    async with process_stream(FakeStrategy(), [f"p{i}" for i in range(30)], config=FAST,
                              observers=[observer]) as results:
        count = len([r async for r in results])
    assert count == 30
    names = kinds(observer.events)
    assert names.count("ItemCompleted") == 30 and names[-1] == "BatchFinished"


async def test_a_pool_reports_each_request_to_its_observers() -> None:
    sync, late = SyncRecorder(), AsyncRecorder(shuffle=True)
    fake = FakeStrategy(script={"bad": [ValueError("no")] * 3})
    config = ProcessorConfig(concurrency=4, retry=QUICK_RETRY)
    pool = LLMCallPool(fake, config=config, observers=[sync, late])
    async with pool, anyio.create_task_group() as tg:
        for prompt in ("a", "b", "bad"):
            tg.start_soon(pool.submit_result, prompt)
    assert all(a is b for a, b in zip(late.events, sync.events, strict=True))
    names = kinds(late.events)
    assert names.count("ItemStarted") == 3 and names.count("ItemCompleted") == 2
    assert names.count("ItemFailed") == 1 and names.count("AttemptFailed") == 1  # a logic error: no retry
    assert "BatchStarted" not in names  # a pool has requests, not a batch


# --- failures: logged once, counted, never fatal ----------------------------------------------


async def test_a_raising_async_observer_is_logged_once_and_never_breaks_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        async def on_event(self, event: Any) -> None:
            await anyio.lowlevel.checkpoint()
            raise RuntimeError("observer bug")

    after = AsyncRecorder()
    with caplog.at_level(logging.WARNING, logger="trio_batch_llm.observers"):
        batch = await process_prompts(FakeStrategy(), ["a", "b", "c"], config=FAST,
                                      observers=[Broken(), after])
    assert batch.succeeded == 3
    assert kinds(after.events).count("ItemCompleted") == 3
    raised = [r for r in caplog.records if "raised" in r.getMessage()]
    assert len(raised) == 1 and "Broken" in raised[0].getMessage()
    assert raised[0].exc_info is not None and raised[0].exc_info[0] is RuntimeError


@VIRTUAL
async def test_a_timeout_is_logged_once_then_counted(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[float] = []

    async def stuck(event: Any) -> None:
        calls.append(anyio.current_time())
        await anyio.sleep(10)

    hooks = Hooks.build(observers=[stuck], observer_timeout=5.0)
    start = anyio.current_time()
    with caplog.at_level(logging.WARNING, logger="trio_batch_llm.observers"):
        async with anyio.create_task_group() as tg:
            hooks.start_observers(tg.start_soon)
            for i in range(3):
                hooks.emit(ItemStarted(f"i{i}"))
            await anyio.sleep(16)
            await hooks.close_observers()
    assert [t - start for t in calls] == [0, 5, 10]  # each call cut at observer_timeout, in order
    stats = hooks.statistics()
    assert stats.observer_timeouts == 3 and stats.observer_dropped == 0
    timed_out = [r for r in caplog.records if "timed out" in r.getMessage()]
    assert len(timed_out) == 1 and "5 s" in timed_out[0].getMessage()


async def test_a_full_queue_drops_the_oldest_counts_them_and_logs_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_observer_feed, "OBSERVER_QUEUE_SIZE", 10)
    gate = anyio.Event()
    seen: list[str] = []

    async def held(event: Any) -> None:
        await gate.wait()
        seen.append(event.item_id)

    hooks = Hooks.build(observers=[held])
    with caplog.at_level(logging.WARNING, logger="trio_batch_llm.observers"):
        async with anyio.create_task_group() as tg:
            hooks.start_observers(tg.start_soon)
            hooks.emit(ItemStarted("first"))
            await anyio.wait_all_tasks_blocked()  # the observer holds "first"
            for i in range(25):
                hooks.emit(ItemStarted(f"i{i}"))
            gate.set()
            await hooks.close_observers()
    assert seen == ["first"] + [f"i{i}" for i in range(15, 25)]  # the newest ten, in order
    assert hooks.statistics().observer_dropped == 15
    dropped = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert len(dropped) == 1


# --- a slow observer never slows the batch; cancellation leaves no task -----------------------


@VIRTUAL
async def test_a_slow_observer_does_not_slow_a_thousand_item_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[str] = []

    class Slow(BaseObserver):
        async def on_item_completed(self, event: ItemCompleted) -> None:
            seen.append(event.result.item_id)
            await anyio.sleep(10)

    prompts, config = [f"p{i}" for i in range(1000)], ProcessorConfig(concurrency=100)
    bare = await process_prompts(FakeStrategy(latency=0.1), prompts, config=config)
    start = anyio.current_time()
    with caplog.at_level(logging.WARNING, logger="trio_batch_llm.observers"):
        batch = await process_prompts(FakeStrategy(latency=0.1), prompts, config=config, observers=[Slow()])
    elapsed = anyio.current_time() - start
    assert batch.succeeded == 1000
    assert bare.wall_time < 1.5
    assert batch.wall_time == pytest.approx(bare.wall_time, abs=1e-6)  # to the virtual microsecond
    # The close gave the observer observer_timeout (5 s) in all to drain its queue, then cancelled it.
    assert elapsed == pytest.approx(batch.wall_time + 5.0, abs=0.05)
    assert 1 <= len(seen) <= 2
    messages = [r.getMessage() for r in caplog.records]
    assert sum("timed out" in m for m in messages) <= 1
    assert sum("undelivered" in m for m in messages) == 1


async def test_cancelling_the_batch_cancels_the_observer_task(anyio_backend: Any) -> None:
    entered, left = anyio.Event(), anyio.Event()

    async def forever(event: Any) -> None:
        if isinstance(event, ItemStarted) and not entered.is_set():
            entered.set()
            try:
                await anyio.sleep_forever()
            finally:
                left.set()

    before = len(anyio.get_running_tasks())
    config = ProcessorConfig(concurrency=4, observer_timeout=0.05)
    fake = FakeStrategy(latency=3600)
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: process_prompts(fake, ["a", "b"], config=config, observers=[forever]))
            await entered.wait()
            scope.cancel()
    assert scope.cancelled_caught
    assert left.is_set()
    assert len(anyio.get_running_tasks()) == before


def test_only_async_observers_get_a_task() -> None:
    def plain(event: Any) -> None:
        pass

    assert Hooks.build(observers=[plain, SyncRecorder()]).async_observers == 0
    assert Hooks.build(observers=[plain, AsyncRecorder(), PerEvent()]).async_observers == 2


async def test_attempt_failed_keeps_its_category_through_the_two_argument_form() -> None:
    received: list[tuple[str, dict[str, Any]]] = []

    async def on_event(event: Any, data: dict[str, Any]) -> None:
        received.append((event.name, data))

    class Holder:
        pass

    holder = Holder()
    holder.on_event = on_event  # type: ignore[attr-defined]
    fake = FakeStrategy(script={"a": [ValueError("no")]})
    config = ProcessorConfig(concurrency=1, retry=QUICK_RETRY)
    await process_prompts(fake, ["a"], config=config, observers=[holder])
    failed = [data for name, data in received if name == "ATTEMPT_FAILED"]
    assert len(failed) == 1 and failed[0]["attempt"] == 1
    assert isinstance(failed[0]["category"], ErrorCategory)


async def test_on_a_shared_host_the_observer_task_ends_with_its_processor() -> None:
    observer = AsyncRecorder(shuffle=True)
    async with ExecutorHost(FAST) as host:
        before = len(anyio.get_running_tasks())
        async with ParallelBatchProcessor[str](FAST, host=host, observers=[observer]) as proc:
            await proc.add_work(LLMWorkItem(item_id="a", strategy=FakeStrategy(), prompt="x"))
            await proc.process_all()
        assert kinds(observer.events)[-1] == "BatchFinished"
        assert len(anyio.get_running_tasks()) == before  # the host lives on; the observer's task does not
        assert host.state == "open"


async def test_a_forced_close_ends_an_observer_that_never_returns() -> None:
    # observer_timeout=None: neither the call nor the close's drain is bounded; force_close() is the
    # operator's way out (CONTRACT C3.3), and the processor's own host takes the task down with it.
    stuck = anyio.Event()

    async def never(event: Any) -> None:
        stuck.set()
        await anyio.sleep_forever()

    before = len(anyio.get_running_tasks())
    unbounded = ProcessorConfig(concurrency=2, observer_timeout=None)
    proc = ParallelBatchProcessor[str](unbounded, observers=[never])

    async def force_later() -> None:
        await anyio.wait_all_tasks_blocked()
        proc.force_close()

    async with anyio.create_task_group() as tg:
        await proc.__aenter__()
        await proc.add_work(LLMWorkItem(item_id="a", strategy=FakeStrategy(), prompt="x"))
        await proc.process_all()
        await stuck.wait()
        tg.start_soon(force_later)
        with pytest.raises(CleanupInterruptedError, match="abandoned step 'async observers'"):
            await proc.__aexit__(None, None, None)
    assert len(anyio.get_running_tasks()) == before
    await proc.aclose()  # a later close resumes the steps the force skipped
    assert proc.state == "closed"
