"""Getting started: a batch, its results, a stream, and one call (run with Trio)."""

import trio

from trio_batch_llm import (
    OpenAICompatibleStrategy,
    call,
    process_prompts,
    process_stream,
)
from trio_batch_llm.mock import serve_mock

REVIEWS = {
    "r1": "Great battery life, terrible screen.",
    # a marker: the mock server refuses this one
    "r2": "Arrived broken. [[content_policy]]",
    "r3": "Does exactly what it says.",
}


async def main() -> None:
    async with serve_mock() as server:
        strategy = OpenAICompatibleStrategy("my-model", base_url=server.base_url)
        prompts = list(REVIEWS.items())  # (item_id, prompt) pairs

        # 1. A whole batch: one result per item, whatever happened to it.
        batch = await process_prompts(
            strategy, prompts, concurrency=8, preserve_order=True
        )
        for result in batch:
            if result.success:
                print(f"{result.item_id}: {result.output}")
            else:
                print(
                    f"{result.item_id} failed ({result.error_category}): {result.error}"
                )
        print(batch.summary())

        # 2. The same work as a stream: results in completion order, as they finish.
        async with process_stream(strategy, prompts, concurrency=8) as results:
            async for result in results:
                print("streamed", result.item_id, result.success)

        # 3. One request through the same retry and admission path.
        answer = await call(strategy, "Say hello.")
        print(answer)


if __name__ == "__main__":
    trio.run(main)
