"""A hundred prompts through an OpenAI-compatible endpoint, under asyncio."""

import asyncio

from trio_batch_llm import llm, process_prompts
from trio_batch_llm.mock import serve_mock


async def main() -> None:
    async with serve_mock() as server:  # a local stand-in for your endpoint
        strategy = llm("openai-compatible:my-model", base_url=server.base_url)
        prompts = [f"Summarise review {i} in five words." for i in range(100)]
        batch = await process_prompts(strategy, prompts, concurrency=16)
    print(batch.summary())


if __name__ == "__main__":
    asyncio.run(main())
