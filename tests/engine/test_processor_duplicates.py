"""``ParallelBatchProcessor.add_work()`` refuses an id it has accepted already (issue 31).

As ``process_prompts()`` and ``process_stream()`` do: ``ValueError("duplicate
item_id=...")`` at the call that repeats it, before any call of the strategy, in
batch and streaming mode, before and inside the block, and through ``feed()``.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from trio_batch_llm import (
    FakeStrategy,
    LLMWorkItem,
    ParallelBatchProcessor,
    ProcessorConfig,
    QueueFullError,
    process_stream,
)

pytestmark = pytest.mark.anyio

DUPLICATE = "duplicate item_id='a': every item needs a unique id"


def item(fake: FakeStrategy, item_id: str, prompt: str = "p") -> LLMWorkItem[str]:
    return LLMWorkItem(item_id=item_id, strategy=fake, prompt=prompt)


async def test_batch_mode_refuses_a_repeated_id_before_any_call() -> None:
    fake = FakeStrategy()
    async with ParallelBatchProcessor[str](ProcessorConfig(concurrency=2)) as proc:
        await proc.add_work(item(fake, "a", "first"))
        await proc.add_work(item(fake, "b"))
        with pytest.raises(ValueError, match=DUPLICATE):
            await proc.add_work(item(fake, "a", "second"))
        batch = await proc.process_all()
    assert sorted(fake.calls) == [("first", 1), ("p", 1)]
    assert [r.item_id for r in batch.in_input_order()] == ["a", "b"]
    assert batch.in_input_order()[0].output == "echo: first"
    assert list(proc.input_order) == ["a", "b"]
    assert proc.counters.accepted == 2


async def test_without_a_block_too() -> None:
    fake = FakeStrategy()
    proc = ParallelBatchProcessor[str]()
    await proc.add_work(item(fake, "a", "first"))
    with pytest.raises(ValueError, match=DUPLICATE):
        await proc.add_work(item(fake, "a", "second"))
    batch = await proc.process_all()
    assert fake.calls == [("first", 1)]
    assert [(r.item_id, r.output) for r in batch.in_input_order()] == [("a", "echo: first")]


async def test_streaming_mode_refuses_a_repeated_id() -> None:
    fake = FakeStrategy()
    async with ParallelBatchProcessor[str](ProcessorConfig(concurrency=2)) as proc:
        proc.start()
        await proc.add_work(item(fake, "a", "first"))
        results = proc.results()
        first = await results.__anext__()
        assert first.item_id == "a"
        # After its result, too: the id was used.
        with pytest.raises(ValueError, match=DUPLICATE):
            await proc.add_work(item(fake, "a", "second"))
        await proc.finish()
        rest = [r async for r in results]
    assert rest == []
    assert fake.calls == [("first", 1)]


async def test_feed_ends_the_stream_at_a_repeated_id() -> None:
    fake = FakeStrategy()
    async with ParallelBatchProcessor[str]() as proc:
        proc.start()
        proc.feed([item(fake, "a", "first"), item(fake, "a", "second")])
        with pytest.raises(ValueError, match=DUPLICATE):
            async for _ in proc.results():
                pass
    assert fake.calls in ([], [("first", 1)])
    assert ("second", 1) not in fake.calls


async def test_an_id_refused_for_a_full_queue_can_be_added_again() -> None:
    fake = FakeStrategy()
    async with ParallelBatchProcessor[str](ProcessorConfig(max_queue_size=1)) as proc:
        await proc.add_work(item(fake, "a"))
        with pytest.raises(QueueFullError):
            await proc.add_work(item(fake, "b"))
        batch = await proc.process_all()
    assert [r.item_id for r in batch.results] == ["a"]
    async with ParallelBatchProcessor[str](ProcessorConfig(max_queue_size=1)) as proc:
        proc.start()
        await proc.add_work(item(fake, "b"))
        await proc.finish()
        assert [r.item_id async for r in proc.results()] == ["b"]


async def test_a_refused_full_queue_add_does_not_keep_its_id() -> None:
    fake = FakeStrategy()
    async with ParallelBatchProcessor[str](ProcessorConfig(max_queue_size=1)) as proc:
        await proc.add_work(item(fake, "a"))
        with pytest.raises(QueueFullError):
            await proc.add_work(item(fake, "b"))
        with pytest.raises(QueueFullError):  # full still, but not "duplicate": b was never accepted
            await proc.add_work(item(fake, "b"))
        await proc.process_all()


async def test_process_stream_of_a_lazy_source_still_keeps_generated_ids_cheap() -> None:
    """process_stream's own duplicate check is the processor's: no id is refused twice or missed."""
    fake = FakeStrategy()

    async def source() -> Any:
        yield "x"
        yield ("item-0", "y")  # spells the id generated for "x"
        await anyio.lowlevel.checkpoint()

    with pytest.raises(ValueError, match="duplicate item_id='item-0'"):
        async with process_stream(fake, source()) as results:
            async for _ in results:
                pass
    fake = FakeStrategy()
    async with process_stream(fake, ["x", ("b", "y"), "z"]) as results:
        assert sorted([r.item_id async for r in results]) == ["b", "item-0", "item-2"]
