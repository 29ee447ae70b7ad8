# mypy: disable-error-code="import-not-found,unused-ignore"
"""Before: the async-batch-llm 0.28 shapes this guide maps (asyncio only).

Needs async-batch-llm itself, which trio-batch-llm does not install:
pip install async-batch-llm==0.28.0
"""

import asyncio
from contextlib import aclosing

from async_batch_llm import (
    ProcessorConfig,
    call,
    process_prompts,
    process_stream,
)
from async_batch_llm.testing import FakeStrategy


def echo(prompt: str) -> str:
    return f"echo: {prompt}"


async def main() -> None:
    strategy = FakeStrategy[str](echo)
    config = ProcessorConfig(max_workers=4)

    batch = await process_prompts(strategy, ["a", "b"], config=config)
    print(batch.succeeded, batch.wall_time_seconds is not None)

    # An async generator that owns tasks: early exit is only deterministic inside
    # aclosing().
    # (0.28 annotates process_stream as an AsyncIterator, hence the ignore.)
    async with aclosing(
        process_stream(strategy, ["a", "b", "c"], config=config)
    ) as results:  # type: ignore[type-var]
        async for result in results:
            print("streamed", result.item_id)
            break

    answer = await call(strategy, "hello")
    print(answer)


if __name__ == "__main__":
    asyncio.run(main())
