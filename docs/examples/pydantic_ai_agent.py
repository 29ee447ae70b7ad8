"""PydanticAIStrategy: a PydanticAI agent, one agent run per attempt (asyncio only)."""

import asyncio

from openai import AsyncOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.providers.openai import OpenAIProvider

from trio_batch_llm import (
    ProcessorConfig,
    PydanticAIStrategy,
    RetryConfig,
    process_prompts,
)
from trio_batch_llm.mock import MockServerConfig, serve_mock


class City(BaseModel):
    name: str
    country: str


async def main() -> None:
    async with serve_mock(MockServerConfig(api_key="sk-test")) as server:
        # In production: Agent("openai:gpt-4o-mini", ...). Here the agent's
        # OpenAI model talks to the local mock; max_retries=0 leaves every
        # retry to the engine.
        client = AsyncOpenAI(
            base_url=server.base_url, api_key="sk-test", max_retries=0
        )
        provider = OpenAIProvider(openai_client=client)
        model = OpenAIChatModel("gpt-4o-mini", provider=provider)
        agent = Agent(model, system_prompt="You answer in one short sentence.")
        # params become the run's model_settings
        strategy = PydanticAIStrategy(agent, params={"temperature": 0.2})
        config = ProcessorConfig(concurrency=8, retry=RetryConfig(max_attempts=3))
        prompts = ["Name a colour.", "Name a river."]
        async with client:
            batch = await process_prompts(strategy, prompts, config=config)
        for result in batch.results:
            usage = result.token_usage
            print(
                f"{result.item_id}: {result.output!r}"
                f" requests={result.metadata['requests']}"
                f" tokens={usage['input_tokens']}+{usage['output_tokens']}"
            )

    # Structured output: the agent's output_type is the result's output (and
    # what checkpoints and the response cache give back). TestModel answers
    # without a network.
    cities = PydanticAIStrategy(Agent(TestModel(), output_type=City))
    batch = await process_prompts(cities, ["A port city in Norway, please."])
    print(type(batch.results[0].output).__name__, batch.succeeded, "succeeded")


if __name__ == "__main__":
    # not trio.run: pydantic-ai's agent loop is asyncio-only
    asyncio.run(main())
