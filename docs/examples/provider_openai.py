"""OpenAIStrategy: the official openai SDK, on the Responses API or Chat Completions."""

import openai
import trio

from trio_batch_llm import OpenAIStrategy, process_prompts
from trio_batch_llm.mock import serve_mock


async def main() -> None:
    async with serve_mock() as server:
        # In production: OpenAIStrategy("gpt-4o-mini"), with OPENAI_API_KEY in the
        # environment.
        # Here base_url and api_key point the SDK at the local mock server instead.
        responses = OpenAIStrategy(
            "gpt-4o-mini", base_url=server.base_url, api_key="sk-test"
        )
        chat = OpenAIStrategy(
            "gpt-4o-mini",
            api="chat",
            base_url=server.base_url,
            api_key="sk-test",
            max_output_tokens=100,
        )
        for strategy in (responses, chat):
            batch = await process_prompts(strategy, ["Name a colour."], concurrency=4)
            result = batch.results[0]
            print(f"{strategy.api}: {result.output!r} {result.token_usage}")

        # Or bring your own configured client. It is used with max_retries=0 (retries
        # belong to the engine) and is never closed by the library: you close it.
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="sk-test")
        try:
            batch = await process_prompts(
                OpenAIStrategy("gpt-4o-mini", client=client), ["Hi."]
            )
            print("own client:", batch.results[0].output)
        finally:
            await client.close()
        print("requests the server saw:", server.stats.requests)


if __name__ == "__main__":
    trio.run(main)
