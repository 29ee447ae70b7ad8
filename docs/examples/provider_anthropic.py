"""AnthropicStrategy: Claude through the official anthropic SDK (Messages API)."""

import trio
from pydantic import BaseModel

from trio_batch_llm import AnthropicStrategy, process_prompts
from trio_batch_llm.mock import MockServerConfig, serve_mock


class City(BaseModel):
    name: str
    country: str


async def main() -> None:
    async with serve_mock(MockServerConfig(api_key="sk-ant-test")) as server:
        # In production: AnthropicStrategy("claude-haiku-4-5"), with ANTHROPIC_API_KEY
        # in the environment. Here base_url and api_key point the SDK at the local mock
        # (ANTHROPIC_API_KEY is only ever sent to Anthropic's own API).
        claude = AnthropicStrategy(
            "claude-haiku-4-5",
            base_url=server.url,
            api_key="sk-ant-test",
            system_prompt="You answer in one short sentence.",
            cache_system_prompt=True,  # the shared system prompt is cached
            max_output_tokens=200,  # Anthropic requires one; the default is 4096
        )
        batch = await process_prompts(
            claude, ["Name a colour.", "Name a river."], concurrency=1
        )
        for result in batch.results:
            usage = result.token_usage
            print(
                f"{result.output!r} input={usage['input_tokens']}"
                f" cache_write={usage['cache_write_input_tokens']}"
                f" cache_read={usage['cached_input_tokens']}"
            )

        # Structured output: sent as Anthropic's JSON outputs, then validated by
        # the parse stage (an answer that does not match is retried).
        cities = AnthropicStrategy(
            "claude-haiku-4-5",
            base_url=server.url,
            api_key="sk-ant-test",
            response_model=City,
        )
        batch = await process_prompts(cities, ["A port city in Norway, please."])
        print(type(batch.results[0].output).__name__)
        print("requests the server saw:", server.stats.requests)


if __name__ == "__main__":
    trio.run(main)
