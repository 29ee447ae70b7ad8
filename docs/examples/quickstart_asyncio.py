"""A hundred prompts through an OpenAI-compatible endpoint, under asyncio.

The home page shows the lines between the two markers: all of it but this
docstring.
"""

# --8<-- [start:shown]
import asyncio

from trio_batch_llm import llm, mock, process_prompts


async def main() -> None:
    async with mock.serve_mock() as server:  # a local stand-in for your endpoint
        strategy = llm("openai-compatible:my-model", base_url=server.base_url)
        prompts = [f"Summarise review {i} in five words." for i in range(100)]
        batch = await process_prompts(strategy, prompts, concurrency=16)
    print(batch.summary())


if __name__ == "__main__":
    asyncio.run(main())
# --8<-- [end:shown]
