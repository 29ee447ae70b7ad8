"""Durable runs through Anthropic's Message Batches and Gemini's batch mode, on the mock."""

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
    # The first batch of each provider expires with half its requests unrun: those go into
    # a new batch, with no attempt used.
    config = MockServerConfig(batch_outcomes=("expired",), api_key="mock-key")
    async with serve_mock(config) as server:
        strategies = {
            "anthropic": AnthropicStrategy(
                "claude-haiku-4-5", base_url=server.base_urls["anthropic"], api_key="mock-key"
            ),
            "gemini": GeminiStrategy(
                "gemini-2.5-flash", base_url=server.base_urls["gemini"], api_key="mock-key"
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
                print(
                    f"{name}: {final.status}, {final.succeeded} succeeded in {batches} batches, "
                    f"q5 took {results['q5'].attempts} attempt: {results['q5'].output}"
                )


if __name__ == "__main__":
    trio.run(main)
