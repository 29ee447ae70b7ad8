"""Structured output: a pydantic model in, model instances out (validated, resumed)."""

import tempfile
from pathlib import Path
from typing import Literal

import trio
from pydantic import BaseModel

from trio_batch_llm import (
    ArtifactIdentity,
    JsonlArtifactStore,
    OpenAICompatibleStrategy,
    ResumePolicy,
    process_prompts,
)
from trio_batch_llm.mock import MockServerConfig, serve_mock


class Review(BaseModel):
    sentiment: Literal["positive", "negative", "mixed"]
    summary: str
    stars: int


REVIEWS = [
    {"id": "r1", "prompt": "Great battery life, terrible screen."},
    # The mock breaks its first answer to this one: the engine validates, fails
    # (PARSE) and asks again at once, with no backoff.
    {"id": "r2", "prompt": "Does what it says. [[schema_violationx1]]"},
    # Per-item messages and params: a system prompt and a temperature for this item.
    {
        "id": "r3",
        "messages": [{"role": "user", "content": "Arrived broken, refund was quick."}],
        "params": {"system": "You are a strict reviewer.", "temperature": 0.0},
    },
]


async def main() -> None:
    async with serve_mock(MockServerConfig()) as server:
        strategy = OpenAICompatibleStrategy(
            "mock-model",
            base_url=server.base_url,
            response_model=Review,  # sent as a json_schema, checked locally
            system_prompt="Classify the review.",
        )
        with tempfile.TemporaryDirectory() as tmp:
            identity = ArtifactIdentity(provider="openai-compatible", model="mock")
            path = Path(tmp) / "reviews.jsonl"
            store = JsonlArtifactStore(path, identity=identity)
            batch = await process_prompts(strategy, REVIEWS, artifact_store=store)
            for r in batch.in_input_order():
                review: object = r.output  # a Review (typed as text)
                assert isinstance(review, Review)
                print(f"{r.item_id}: {type(review).__name__} attempts={r.attempts}")

            # A resume replays the stored model_dump(mode="json") as Review instances.
            again = await process_prompts(
                strategy,
                REVIEWS,
                resume=ResumePolicy.REUSE_SUCCESSES,
                artifact_store=JsonlArtifactStore(path, identity=identity),
            )
            same = all(r.replayed and isinstance(r.output, Review) for r in again)
            print(f"resumed: {len(again)} replayed as Review: {same}")
            print(f"requests the server saw: {len(server.requests)}")


if __name__ == "__main__":
    trio.run(main)
