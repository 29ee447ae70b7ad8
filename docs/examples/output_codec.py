"""Keep outputs JSON cannot carry: a replay gives the original back, or is refused."""

import datetime
import tempfile
from pathlib import Path
from typing import Any

import trio

from trio_batch_llm import (
    ArtifactIdentity,
    FakeStrategy,
    JsonlArtifactStore,
    ResumePolicy,
    process_prompts,
)

IDENTITY = ArtifactIdentity(provider="openai", model="gpt-4o-mini")
WHEN = datetime.datetime(2025, 3, 1, 9, 30)
# What a post-processor might hand back: a (label, score) pair and a timestamp.
SCRIPT: dict[str, list[Any]] = {
    "Classify review 1.": [("positive", 0.9)],
    "Date the order.": [WHEN],
}
PROMPTS = [
    ("review-1", "Classify review 1."),
    ("order-7", "Date the order."),
    ("note", "Say hi."),
]


def encode(output: Any) -> Any:
    """Plain JSON for each output type this pipeline produces (checked by the store)."""
    if isinstance(output, tuple):
        return {"pair": list(output)}
    if isinstance(output, datetime.datetime):
        return {"at": output.isoformat()}
    return {"text": output}


def decode(stored: Any) -> Any:
    if "pair" in stored:
        return tuple(stored["pair"])
    if "at" in stored:
        return datetime.datetime.fromisoformat(stored["at"])
    return stored["text"]


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        # Without a codec, outputs that would come back changed are refused, item by
        # item.
        store = JsonlArtifactStore(Path(tmp) / "a.jsonl", identity=IDENTITY)
        plain = await process_prompts(
            FakeStrategy(script=SCRIPT), PROMPTS, artifact_store=store
        )
        for r in sorted(plain, key=lambda r: r.item_id):
            print(f"no codec: {r.item_id}: {'kept' if r.success else r.error_category}")

        # With one, they round-trip: the resume replays a tuple and a datetime, not a
        # list and a str.
        def store_with_codec() -> JsonlArtifactStore:
            return JsonlArtifactStore(
                Path(tmp) / "b.jsonl",
                identity=IDENTITY,
                output_encoder=encode,
                output_decoder=decode,
            )

        await process_prompts(
            FakeStrategy(script=SCRIPT), PROMPTS, artifact_store=store_with_codec()
        )
        again = await process_prompts(
            FakeStrategy(),
            PROMPTS,
            resume=ResumePolicy.REUSE_SUCCESSES,
            artifact_store=store_with_codec(),
        )
        for r in sorted(again, key=lambda r: r.item_id):
            print(f"replayed: {r.item_id}: {r.output!r}")


if __name__ == "__main__":
    trio.run(main)
