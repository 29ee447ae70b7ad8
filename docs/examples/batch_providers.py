"""Durable runs through Anthropic's Message Batches and Gemini's batch mode (mock)."""

import tempfile
from pathlib import Path

import trio

from trio_batch_llm import (
    AnthropicStrategy,
    GeminiStrategy,
    ProviderBatchConfig,
    open_run,
)
from trio_batch_llm.mock import MockServerConfig, serve_mock

PROMPTS = [(f"q{i}", f"Summarise note {i}.") for i in range(6)]


async def main() -> None:
    # Each provider's first batch expires with half its requests unrun: those go
    # into a new batch, with no attempt used.
    config = MockServerConfig(batch_outcomes=("expired",), api_key="mock-key")
    async with serve_mock(config) as server:
        urls = server.base_urls
        strategies = {
            "anthropic": AnthropicStrategy(
                "claude-haiku-4-5", base_url=urls["anthropic"], api_key="mock-key"
            ),
            "gemini": GeminiStrategy(
                "gemini-2.5-flash", base_url=urls["gemini"], api_key="mock-key"
            ),
        }
        with tempfile.TemporaryDirectory() as tmp:
            for name, strategy in strategies.items():
                async with await open_run(
                    Path(tmp) / "runs.sqlite",
                    name,
                    strategy,
                    PROMPTS,
                    mode="provider-batch",
                    batch=ProviderBatchConfig(poll_interval=0.1),
                ) as run:
                    final = await run.wait()
                    results = {r.item_id: r.result for r in await run.read_results()}
                batches = len({r.metadata["batch_id"] for r in results.values()})
                q5 = results["q5"]
                print(f"{name}: {final.status}, {final.succeeded} succeeded", end=" ")
                print(f"in {batches} batches; q5: {q5.attempts} attempt, {q5.output}")


if __name__ == "__main__":
    trio.run(main)
