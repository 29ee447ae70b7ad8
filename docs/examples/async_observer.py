"""An async observer runs in a task of its own: a slow sink never slows the workers.

Run on Trio's virtual clock (the times printed are exact); drop the ``clock=``
argument to watch it take real time.
"""

import anyio
import trio
import trio.testing

from trio_batch_llm import (
    BaseObserver,
    BatchFinished,
    FakeStrategy,
    ItemCompleted,
    ItemFailed,
    ProcessorConfig,
    process_prompts,
)


class Shipper(BaseObserver):
    """Ships each finished item to a slow sink (a 20 ms sleep stands in for a POST)."""

    def __init__(self) -> None:
        self.shipped: list[str] = []
        self.summary = ""

    async def on_item_completed(self, event: ItemCompleted) -> None:
        await anyio.sleep(0.02)
        self.shipped.append(event.result.item_id)

    async def on_item_failed(self, event: ItemFailed) -> None:
        await anyio.sleep(0.02)
        self.shipped.append(event.result.item_id)

    async def on_batch_finished(self, event: BatchFinished) -> None:
        counts = event.counts
        self.summary = f"{counts.succeeded} succeeded, {counts.failed} failed"


async def main() -> None:
    shipper = Shipper()
    config = ProcessorConfig(concurrency=20, observer_timeout=5.0)  # the default
    prompts = [f"note {i}" for i in range(20)]
    started = anyio.current_time()
    batch = await process_prompts(
        FakeStrategy(latency=0.01), prompts, config=config, observers=[shipper]
    )
    # The workers never waited for the sink; the close waited (observer_timeout
    # at most) for it to catch up.
    caught_up = anyio.current_time() - started
    print(f"batch: {batch.wall_time:.2f} s; sink caught up after {caught_up:.2f} s")
    print(f"shipped {len(shipper.shipped)} items; it saw: {shipper.summary}")


if __name__ == "__main__":
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
