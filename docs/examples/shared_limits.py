"""One set of limits shared across batches (ExecutorHost) and requests (LLMCallPool)."""

from functools import partial

import anyio
import trio

from trio_batch_llm import (
    ExecutorHost,
    FakeStrategy,
    LLMCallPool,
    ProcessorConfig,
    process_prompts,
)


async def main() -> None:
    strategy = FakeStrategy(latency=0.01)
    config = ProcessorConfig(concurrency=8)

    # Two batches at once, one budget: both processors draw on the host's quota scopes.
    async with ExecutorHost(config) as host, anyio.create_task_group() as tg:
        for name in ("nightly", "backfill"):
            prompts = [f"{name} {i}" for i in range(40)]
            tg.start_soon(
                partial(process_prompts, strategy, prompts, config=config, host=host)
            )
    print(f"two batches, at most {strategy.max_in_flight} calls in flight together")

    # Independent requests (a web service's handlers), one budget, bounded waiting.
    strategy = FakeStrategy(latency=0.01)
    async with (
        LLMCallPool(strategy, config=config, max_pending=100) as pool,
        anyio.create_task_group() as tg,
    ):
        for i in range(50):
            tg.start_soon(pool.submit, f"request {i}")
    print(f"50 requests, at most {strategy.max_in_flight} in flight")


if __name__ == "__main__":
    trio.run(main)
