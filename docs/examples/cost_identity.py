"""Price a batch from its token usage; let checkpoints infer their identity."""

import tempfile
from pathlib import Path

import anyio.lowlevel
import trio

from trio_batch_llm import (
    DEFAULT_MODEL_RATES,
    ArtifactMismatchError,
    CallableStrategy,
    CallOutcome,
    JsonlArtifactStore,
    ModelRates,
    OpenAICompatibleStrategy,
    ResumePolicy,
    TokenUsage,
    infer_artifact_identity,
    process_prompts,
)
from trio_batch_llm.testing import MockServerConfig, serve_mock


async def answer(prompt: str) -> CallOutcome[str]:
    """A stand-in for a model call: 1,200 input tokens (1,000 cached), 300 output."""
    await anyio.lowlevel.checkpoint()
    usage: TokenUsage = {
        "input_tokens": 1200,
        "cached_input_tokens": 1000,
        "output_tokens": 300,
    }
    return CallOutcome(
        prompt.upper(),
        token_usage=usage,
        metadata={"model": "gpt-4o-mini-2024-07-18"},
    )


async def main() -> None:
    batch = await process_prompts(CallableStrategy(answer), ["a", "b", "c", "d"])
    # Built-in gpt-4o-mini rates: $0.15/M input, $0.075/M cached input, $0.60/M output.
    # Per item: 200 x 0.15 + 1,000 x 0.075 + 300 x 0.60 = 285 millionths of a dollar.
    print(f"built-in rates: ${batch.estimated_cost():.6f}")
    mine = {
        **DEFAULT_MODEL_RATES,
        "gpt-4o-mini": ModelRates(0.10, 0.40, cached_input_per_mtok=0.05),
    }
    print(f"my rates:       ${batch.estimated_cost(mine):.6f}")
    print(f"one rate for all: ${batch.estimated_cost(ModelRates(1.0, 2.0)):.6f}")

    async with serve_mock(MockServerConfig(model="gpt-4o-mini")) as server:

        def strategy(system: str) -> OpenAICompatibleStrategy:
            return OpenAICompatibleStrategy(
                "gpt-4o-mini", base_url=server.base_url, system_prompt=system
            )

        same = infer_artifact_identity(
            strategy("Be brief.")
        ) == infer_artifact_identity(strategy("Be brief."))
        print(f"same settings, same identity: {same}")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "checkpoint.jsonl"
            prompts = ["one", "two", "three"]
            # No identity given: the store takes the strategy's.
            await process_prompts(
                strategy("Be brief."),
                prompts,
                artifact_store=JsonlArtifactStore(path),
            )
            again = await process_prompts(
                strategy("Be brief."),
                prompts,
                artifact_store=JsonlArtifactStore(path),
                resume=ResumePolicy.REUSE_SUCCESSES,
            )
            replayed = sum(r.replayed for r in again)
            print(
                f"resumed: {replayed} replayed, {len(server.requests)} requests in all"
            )
            try:
                await process_prompts(
                    strategy("Be verbose."),
                    prompts,
                    artifact_store=JsonlArtifactStore(path),
                    resume=ResumePolicy.REUSE_SUCCESSES,
                )
            except ArtifactMismatchError:
                print("another system prompt: refused, nothing replayed for it")


if __name__ == "__main__":
    trio.run(main)
