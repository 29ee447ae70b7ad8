"""async-batch-llm's processor shapes: batch mode without ``async with``, its close names.

``add_work()`` then ``process_all()`` with no block: the call opens and closes the
processor itself, so nothing it started outlives it and its close report is the one
an ``async with`` block would give. Streaming mode keeps needing a block.
"""

from __future__ import annotations

import anyio
import pytest

from trio_batch_llm import (
    AdmissionClosedError,
    FakeStrategy,
    LLMCallStrategy,
    LLMWorkItem,
    ParallelBatchProcessor,
    ProcessorConfig,
    QueueFullError,
    TokenUsage,
    process_stream,
)

pytestmark = pytest.mark.anyio


def _items(strategy: object, n: int) -> list[LLMWorkItem[str]]:
    return [LLMWorkItem(item_id=f"i{k}", strategy=strategy, prompt=f"p{k}") for k in range(n)]  # type: ignore[arg-type]


class _CleanupFails(LLMCallStrategy[str]):
    def __init__(self, times: int = 1_000) -> None:
        self.cleanups = 0
        self.times = times

    async def execute(self, prompt: str, attempt: int, timeout: float | None, state: object = None
                      ) -> tuple[str, TokenUsage, dict[str, object]]:
        await anyio.lowlevel.checkpoint()
        return prompt.upper(), {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}, {}

    async def cleanup(self) -> None:
        self.cleanups += 1
        await anyio.lowlevel.checkpoint()
        if self.cleanups <= self.times:
            raise OSError("cleanup broke")


async def test_process_all_without_a_block_opens_runs_and_closes() -> None:
    fake = FakeStrategy()
    proc = ParallelBatchProcessor[str](ProcessorConfig(max_workers=3))
    for item in _items(fake, 7):
        await proc.add_work(item)
    assert proc.state == "open"
    batch = await proc.process_all()
    assert (batch.total_items, batch.succeeded) == (7, 7)
    assert sorted(r.output or "" for r in batch.results) == sorted(f"echo: p{k}" for k in range(7))
    assert batch.input_order == [f"i{k}" for k in range(7)]
    assert proc.state == "closed"  # closed before process_all() returned
    assert proc.host.statistics().state == "closed"
    stats = await proc.statistics()  # the anchor's awaited form gives the same record
    assert stats == proc.statistics()
    assert (stats.counters.accepted, stats.counters.succeeded, stats.workers) == (7, 7, 0)
    with pytest.raises(AdmissionClosedError, match="closed"):
        await proc.add_work(_items(fake, 1)[0])
    with pytest.raises(AdmissionClosedError):
        await proc.process_all()


async def test_items_added_before_the_block_run_inside_it() -> None:
    fake = FakeStrategy()
    proc = ParallelBatchProcessor[str]()
    await proc.add_work(_items(fake, 1)[0])
    async with proc:
        await proc.add_work(LLMWorkItem(item_id="late", strategy=fake, prompt="q"))
        batch = await proc.process_all()
    assert sorted(batch.by_id()) == ["i0", "late"]


async def test_a_failed_close_is_reported_by_process_all() -> None:
    strategy = _CleanupFails(times=1)
    proc = ParallelBatchProcessor[str]()
    for item in _items(strategy, 2):
        await proc.add_work(item)
    with pytest.raises(OSError, match="cleanup broke"):
        await proc.process_all()
    assert strategy.cleanups == 1
    assert proc.only_strategy_cleanup_failed()
    assert proc.state == "closing"  # the failed step is owed
    await proc.aclose()  # and retried
    assert (proc.state, strategy.cleanups) == ("closed", 2)


async def test_bad_input_fails_at_its_add_work() -> None:
    proc = ParallelBatchProcessor[str](ProcessorConfig(max_queue_size=2))
    with pytest.raises(TypeError, match="must be an LLMWorkItem"):
        await proc.add_work("not an item")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="item_id=''"):
        await proc.add_work(LLMWorkItem(item_id="", strategy=FakeStrategy(), prompt="x"))
    for item in _items(FakeStrategy(), 2):
        await proc.add_work(item)
    with pytest.raises(QueueFullError, match="max_queue_size=2"):
        await proc.add_work(LLMWorkItem(item_id="third", strategy=FakeStrategy(), prompt="x"))
    assert (await proc.process_all()).succeeded == 2


async def test_streaming_still_needs_a_block_and_says_why() -> None:
    proc = ParallelBatchProcessor[str]()
    with pytest.raises(RuntimeError, match="only a block can own tasks that outlive a call"):
        proc.start()
    await proc.aclose()
    assert proc.state == "closed"


async def test_cancelling_process_all_without_a_block_leaves_nothing_running() -> None:
    hang = FakeStrategy(hang=True)
    proc = ParallelBatchProcessor[str](ProcessorConfig(max_workers=2))
    for item in _items(hang, 3):
        await proc.add_work(item)
    with anyio.move_on_after(0.05) as scope:
        await proc.process_all()
    assert scope.cancelled_caught
    assert proc.state == "closed"
    assert proc.statistics().workers == 0


@pytest.mark.parametrize("name", ["cleanup", "shutdown", "aclose"])
async def test_the_anchors_close_names_are_the_ordered_close(name: str) -> None:
    strategy = _CleanupFails(times=1)
    async with ParallelBatchProcessor[str]() as proc:
        await proc.add_work(_items(strategy, 1)[0])
        await proc.process_all()
        with pytest.raises(OSError, match="cleanup broke"):
            await getattr(proc, name)()
        assert proc.state == "closing"  # the failed step is owed, not forgotten
        await getattr(proc, name)()  # retries it
        assert proc.state == "closed"
        await getattr(proc, name)()  # idempotent once closed
    assert strategy.cleanups == 2


async def test_async_for_over_process_stream_says_to_use_async_with() -> None:
    fake = FakeStrategy()
    with pytest.raises(TypeError, match=r"async with process_stream\(\.\.\.\) as results"):
        async for _ in process_stream(fake, ["a"]):  # type: ignore[attr-defined]
            pass
    assert fake.calls == []  # nothing started
    async with process_stream(fake, ["a", "b"]) as results:
        assert sorted([r.item_id async for r in results]) == ["item-0", "item-1"]
