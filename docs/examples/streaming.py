"""Stream a lazy source of any size in bounded memory; stop early, nothing is left."""

from collections.abc import AsyncIterator

import anyio.lowlevel
import trio

from trio_batch_llm import FakeStrategy, ProcessorConfig, process_stream

read_so_far = 0


async def rows() -> AsyncIterator[tuple[str, str]]:
    """A lazy source, read only as fast as the batch consumes it (a file, a query)."""
    global read_so_far
    for i in range(1_000_000):
        read_so_far += 1
        await anyio.lowlevel.checkpoint()  # stands in for awaiting the next read
        yield f"row-{i}", f"Classify row {i}."


async def main() -> None:
    strategy = FakeStrategy(latency=0.001)
    config = ProcessorConfig(
        concurrency=8,
        max_queue_size=32,  # items read ahead of the workers, at most
        max_result_queue_size=16,  # results waiting for this loop, at most
    )
    done = 0
    async with process_stream(strategy, rows(), config=config) as results:
        async for result in results:  # completion order
            done += 1
            if done == 200 or not result.success:
                # leaving the block cancels the outstanding work and closes in order
                break
    print(
        f"consumed {done} results; read {read_so_far} of 1,000,000 rows; "
        f"calls still running: {strategy.in_flight}"
    )


if __name__ == "__main__":
    trio.run(main)
