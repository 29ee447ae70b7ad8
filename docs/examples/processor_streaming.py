"""The processor underneath: feed it from your own task while you read results."""

import anyio
import trio

from trio_batch_llm import (
    FakeStrategy,
    LLMWorkItem,
    ParallelBatchProcessor,
    ProcessorConfig,
)


async def main() -> None:
    strategy = FakeStrategy(latency=0.01)
    config = ProcessorConfig(concurrency=4, max_queue_size=8)
    async with ParallelBatchProcessor[str](config) as processor:
        processor.start()  # streaming mode: the workers start now

        async def produce() -> None:
            for i in range(20):
                # Each item names its own strategy: one batch may mix models.
                await processor.add_work(
                    LLMWorkItem(
                        item_id=f"q{i}", strategy=strategy, prompt=f"question {i}"
                    )
                )
            await processor.finish()  # no more input

        async with anyio.create_task_group() as tg:
            tg.start_soon(produce)
            received = [result.item_id async for result in processor.results()]
    print(f"{len(received)} results; first few in completion order: {received[:4]}")


if __name__ == "__main__":
    trio.run(main)
