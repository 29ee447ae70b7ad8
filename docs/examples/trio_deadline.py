"""Trio: your cancel scope stops a batch; a batch_timeout gives every item a result."""

import trio

from trio_batch_llm import (
    FakeStrategy,
    GuardrailConfig,
    ProcessorConfig,
    WorkItemResult,
    process_prompts,
    process_stream,
)


async def main() -> None:
    strategy = FakeStrategy(latency=0.05)  # a provider that answers in 50 ms
    prompts = [f"prompt {i}" for i in range(100)]

    # Your deadline is an ordinary cancel scope. Everything the stream started is
    # cancelled and closed before the scope exits; you keep what you consumed.
    received: list[WorkItemResult[str]] = []
    with trio.move_on_after(0.12) as scope:
        async with process_stream(strategy, prompts, concurrency=10) as results:
            async for result in results:
                received.append(result)
    print(
        f"cancelled: {scope.cancelled_caught}; received {len(received)} results; "
        f"calls still running: {strategy.in_flight}"
    )

    # The library's deadline is a controlled stop: the batch returns normally and
    # every item has exactly one result (the unfinished ones say why).
    config = ProcessorConfig(
        concurrency=10, guardrails=GuardrailConfig(batch_timeout=0.12)
    )
    batch = await process_prompts(strategy, prompts, config=config)
    print(
        f"{batch.termination.kind}: {batch.succeeded} "
        f"succeeded, {batch.failed} stopped, "
        f"{len(batch)} results in all"
    )


if __name__ == "__main__":
    trio.run(main)
