"""After: the same program on trio-batch-llm, under Trio or asyncio."""

import trio

from trio_batch_llm import (
    FakeStrategy,
    ProcessorConfig,
    call,
    process_prompts,
    process_stream,
)


async def main() -> None:
    strategy = FakeStrategy(output=lambda prompt: f"echo: {prompt}")
    config = ProcessorConfig(max_workers=4)  # or concurrency=4: the same knob

    batch = await process_prompts(strategy, ["a", "b"], config=config)
    print(batch.succeeded, batch.wall_time >= 0)

    # An async context manager owns the tasks; leaving the block early is always
    # deterministic.
    async with process_stream(strategy, ["a", "b", "c"], config=config) as results:
        async for result in results:
            print("streamed", result.item_id)
            break

    answer = await call(strategy, "hello")
    print(answer)


if __name__ == "__main__":
    trio.run(main)
