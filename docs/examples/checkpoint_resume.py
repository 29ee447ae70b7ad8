"""Checkpoint every result; resume without repeating (or paying for) one success."""

import tempfile
from pathlib import Path

import trio

from trio_batch_llm import (
    ArtifactIdentity,
    ArtifactMismatchError,
    FakeStrategy,
    JsonlArtifactStore,
    ProcessorConfig,
    ResumePolicy,
    RetryConfig,
    SqliteArtifactStore,
    process_prompts,
)

PROMPTS = [(f"doc-{i}", f"Summarise document {i}.") for i in range(20)]


async def main() -> None:
    # What produced the results: a resume refuses a checkpoint written by anything else.
    identity = ArtifactIdentity(
        provider="openai", model="gpt-4o-mini", prompt_version="v3"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for filename, store_class in (
            ("run.jsonl", JsonlArtifactStore),
            ("run.db", SqliteArtifactStore),
        ):
            path = Path(tmp) / filename

            # Run 1: a provider having a bad day; some items fail for good.
            unlucky = FakeStrategy(failure_rate=0.3, seed=4)
            config = ProcessorConfig(concurrency=4, retry=RetryConfig(max_attempts=1))
            first = await process_prompts(
                unlucky,
                PROMPTS,
                config=config,
                artifact_store=store_class(path, identity=identity),
            )

            # Run 2: the same items; stored successes are replayed, the rest run again.
            healthy = FakeStrategy()
            second = await process_prompts(
                healthy,
                PROMPTS,
                concurrency=4,
                artifact_store=store_class(path, identity=identity),
                resume=ResumePolicy.REUSE_SUCCESSES,
            )
            replayed = sum(1 for r in second if r.replayed)
            name = store_class.__name__
            print(f"{name}: run 1 {first.succeeded} succeeded, {first.failed} failed")
            print(
                f"{name}: run 2 replayed {replayed}, called the provider "
                f"{len(healthy.calls)} times, {second.succeeded} succeeded"
            )

            # A new prompt version is a different run: its checkpoint is not reused.
            try:
                await process_prompts(
                    healthy,
                    PROMPTS,
                    resume=ResumePolicy.REUSE_SUCCESSES,
                    artifact_store=store_class(
                        path,
                        identity=ArtifactIdentity(
                            provider="openai", model="gpt-4o-mini", prompt_version="v4"
                        ),
                    ),
                )
            except ArtifactMismatchError:
                print(
                    f"{store_class.__name__}: refused to resume under prompt_version v4"
                )


if __name__ == "__main__":
    trio.run(main)
