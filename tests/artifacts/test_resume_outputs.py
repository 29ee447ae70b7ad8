"""A resume gives back the output the item produced: pydantic models (issue 31, point 5).

A store keeps a pydantic model as ``model_dump(mode="json")``; only the item's
strategy can make the model again (``decode_output``, which by default rebuilds
its ``response_model``). A model that the strategy would not give back is
refused item-locally, as a tuple or a dataclass is. Every test runs on both
stores and both backends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pydantic
import pytest

from trio_batch_llm import (
    ArtifactIdentity,
    CallableStrategy,
    ErrorCategory,
    FakeStrategy,
    ProcessorConfig,
    ResumePolicy,
    RetryConfig,
    WorkItemResult,
    process_prompts,
    process_stream,
)

from .test_reliability_stores import Stores

pytestmark = pytest.mark.anyio

IDENTITY = ArtifactIdentity(provider="fake", model="fake-model")
CONFIG = ProcessorConfig(concurrency=4, retry=RetryConfig(max_attempts=3, initial_wait=0.0, max_wait=0.0))
SUCCESSES, ALL = ResumePolicy.REUSE_SUCCESSES, ResumePolicy.REUSE_ALL


class Label(pydantic.BaseModel):
    label: str
    score: float = 0.5


class Finer(Label):
    """A subclass: rebuilt as its base, it would come back changed."""

    reason: str = "none"


@pytest.fixture(params=["jsonl", "sqlite"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Stores:
    return Stores(request.param, tmp_path / ("run.jsonl" if request.param == "jsonl" else "run.sqlite"))



PROMPTS = [("id-model", "model"), ("id-ok", "ok")]


def _check_refused(r: WorkItemResult[Any], type_name: str) -> None:
    assert not r.success and r.output is None
    assert r.error_category is ErrorCategory.PARSE
    assert r.error is not None
    for words in (type_name, "response_model=", "output_encoder=", "output_decoder="):
        assert words in r.error, (words, r.error)
    assert r.token_usage.get("total_tokens"), "what the call cost is kept"


async def test_a_model_output_without_response_model_is_refused_item_locally(stores: Stores) -> None:
    fake = FakeStrategy(script={"model": [Label(label="x")]})
    async with process_stream(fake, PROMPTS, config=CONFIG, artifact_store=stores()) as results:
        published = {r.item_id: r async for r in results}
    assert published["id-ok"].success and published["id-ok"].output == "echo: ok"
    _check_refused(published["id-model"], "Label")
    # What was stored is the refusal, not a dict standing in for the model.
    stored = {r.item_id: r for r in await stores.history()}
    assert stored["id-ok"].success
    assert not stored["id-model"].success and stored["id-model"].output is None
    # A resume runs the refused item again, whatever the policy.
    rerun = FakeStrategy()
    again = await process_prompts(rerun, PROMPTS, config=CONFIG, artifact_store=stores(), resume=ALL)
    assert [p for p, _ in rerun.calls] == ["model"]
    assert again.by_id()["id-ok"].replayed


async def test_a_callable_returning_a_model_is_refused_the_same_way(stores: Stores) -> None:
    async def answer(prompt: str) -> Any:
        await anyio.lowlevel.checkpoint()
        return Label(label=prompt) if prompt == "model" else prompt

    batch = await process_prompts(CallableStrategy(answer), PROMPTS, config=CONFIG, artifact_store=stores())
    by_id = batch.by_id()
    assert by_id["id-ok"].success and by_id["id-ok"].output == "ok"
    r = by_id["id-model"]
    assert not r.success and r.error_category is ErrorCategory.PARSE
    assert r.error is not None and "Label" in r.error and "response_model=" in r.error


async def test_with_response_model_a_model_round_trips_as_the_model(stores: Stores) -> None:
    fake = FakeStrategy(script={"model": [Label(label="x", score=0.25)]})
    fake.response_model = Label
    first = await process_prompts(fake, PROMPTS, config=CONFIG, artifact_store=stores())
    assert first.failed == 0
    idle = FakeStrategy()
    idle.response_model = Label
    second = await process_prompts(idle, PROMPTS, config=CONFIG, artifact_store=stores(), resume=SUCCESSES)
    assert idle.calls == []
    replayed = second.by_id()["id-model"]
    assert replayed.replayed and type(replayed.output) is Label
    assert replayed.output == Label(label="x", score=0.25)


async def test_a_model_the_response_model_would_rebuild_as_another_class_is_refused(stores: Stores) -> None:
    fake = FakeStrategy(script={"model": [Finer(label="x", reason="because")]})
    fake.response_model = Label
    batch = await process_prompts(fake, PROMPTS, config=CONFIG, artifact_store=stores())
    by_id = batch.by_id()
    assert by_id["id-ok"].success
    _check_refused(by_id["id-model"], "Finer")


async def test_an_explicit_codec_still_wins(stores: Stores) -> None:
    codec: dict[str, Any] = {
        "output_encoder": lambda value: {"label": value.label, "score": value.score} if isinstance(
            value, Label) else value,
        "output_decoder": lambda value: Label(**value) if isinstance(value, dict) else value,
    }
    fake = FakeStrategy(script={"model": [Label(label="x")]})
    first = await process_prompts(fake, PROMPTS, config=CONFIG, artifact_store=stores(**codec))
    assert first.failed == 0
    idle = FakeStrategy()
    second = await process_prompts(idle, PROMPTS, config=CONFIG, artifact_store=stores(**codec),
                                   resume=SUCCESSES)
    assert idle.calls == []
    assert type(second.by_id()["id-model"].output) is Label
