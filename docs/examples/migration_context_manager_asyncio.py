"""async-batch-llm's example_context_manager.py, changed only as the guide lists.

Its MockAgent and PydanticAIStrategy become a CallableStrategy.
"""

import asyncio
from dataclasses import dataclass

import anyio

from trio_batch_llm import (
    CallableStrategy,
    LLMWorkItem,
    ParallelBatchProcessor,
    ProcessorConfig,
)


@dataclass
class SummaryOutput:
    summary: str


async def summarize(prompt: str) -> SummaryOutput:
    await anyio.sleep(0.01)  # stands in for the model's latency
    return SummaryOutput(summary=f"Summary: {prompt}")


async def main() -> None:
    strategy = CallableStrategy(summarize)
    config = ProcessorConfig(max_workers=3, attempt_timeout=10.0)

    # The block closes everything, in order, even if an error occurs.
    async with ParallelBatchProcessor[SummaryOutput](config=config) as processor:
        for i in range(5):
            await processor.add_work(
                LLMWorkItem(
                    item_id=f"item_{i}",
                    strategy=strategy,
                    prompt=f"Summarize document {i}",
                    context=None,
                )
            )
        result = await processor.process_all()
        print(f"Processed: {result.total_items} items")
        print(f"Succeeded: {result.succeeded}")
        print(f"Failed: {result.failed}")
    print("Processor cleaned up automatically!")

    # async-batch-llm's other shape, with no block: process_all() opens the
    # processor and closes it before it returns.
    processor = ParallelBatchProcessor[SummaryOutput](config=config)
    for i in range(3):
        await processor.add_work(
            LLMWorkItem(item_id=f"doc_{i}", strategy=strategy, prompt=f"Doc {i}")
        )
    result = await processor.process_all()
    print(f"Without a block: {result.succeeded} succeeded; {processor.state}")


if __name__ == "__main__":
    asyncio.run(main())
