"""A durable run gives back the output an item produced, or refuses it (issue 31, as point 5 for stores).

A run keeps each result as JSON. An output that JSON would bring back changed
(a tuple as a list, a dataclass or a pydantic model as a dict) is refused for
that item alone, by the stores' own rule: a ``PARSE`` failure naming the type
and ``response_model=`` (``open_run`` takes no output codec, so none is named);
the run goes on and every item still has exactly one result. With the
strategy's ``response_model=`` a model output is kept, and ``read_results()``
gives back model instances. Live runs alone and under leases, both backends.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import pydantic
import pytest

from trio_batch_llm import (
    ConfigurationError,
    ErrorCategory,
    FakeStrategy,
    ProcessorConfig,
    SqliteArtifactStore,
    WorkItemResult,
)
from trio_batch_llm._runs import iter_run_results, open_run

from .._runs_child import IDENTITY
from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio


@pytest.fixture(
    scope="module",
    params=[pytest.param("asyncio", id="asyncio"), pytest.param(trio_virtual_clock(threads=True), id="trio")],
)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


class Label(pydantic.BaseModel):
    label: str
    score: float = 0.5


class Finer(Label):
    """A subclass: rebuilt from JSON by ``response_model=Label``, it would come back as a Label."""

    reason: str = "none"


@dataclasses.dataclass
class Pair:
    left: int
    right: int


PROMPTS = [f"p{i}" for i in range(6)]
LEASES = pytest.mark.parametrize("lease_seconds", [None, 30.0], ids=["alone", "leased"])


async def _run(
    db: Path, strategy: FakeStrategy, lease_seconds: float | None
) -> dict[str, WorkItemResult[Any]]:
    """Drive PROMPTS to the end; the results as ``read_results()`` gives them, after checking them."""
    async with await open_run(db, "run", strategy, PROMPTS, identity=IDENTITY, lease_seconds=lease_seconds,
                              config=ProcessorConfig(concurrency=3)) as run:
        snap = await run.wait()
        page = await run.read_results()
    assert snap.status == "completed", snap
    # Exactly once: one call per prompt, one result per item, gapless sequences.
    assert Counter(p for p, _ in strategy.calls) == Counter(PROMPTS)
    assert [r.sequence for r in page] == list(range(1, len(PROMPTS) + 1))
    assert sorted(r.item_id for r in page) == sorted(f"item-{i}" for i in range(len(PROMPTS)))
    return {r.item_id: r.result for r in page}


@LEASES
@pytest.mark.parametrize(
    ("output", "type_name"),
    [((1, "a"), "tuple"), (Pair(1, 2), "Pair"), (Label(label="x"), "Label")],
    ids=["tuple", "dataclass", "model-without-response-model"],
)
async def test_an_output_a_run_would_give_back_changed_is_that_items_failure(
    tmp_path: Path, output: Any, type_name: str, lease_seconds: float | None
) -> None:
    db = tmp_path / "runs.sqlite"
    fake = FakeStrategy(script={"p2": [output]})
    results = await _run(db, fake, lease_seconds)
    refused = results.pop("item-2")
    assert not refused.success and refused.output is None
    assert refused.error_category is ErrorCategory.PARSE
    assert refused.error is not None
    assert type_name in refused.error and "response_model=" in refused.error, refused.error
    assert "output_encoder" not in refused.error, "open_run takes no codec: naming one would mislead"
    assert refused.token_usage.get("total_tokens") == 15, "what the call cost is kept"
    assert all(r.success and r.output == f"echo: {r.item_id.replace('item-', 'p')}" for r in results.values())
    offline = {r.item_id: r.result for r in iter_run_results(db, "run")}
    assert not offline["item-2"].success and offline["item-2"].error == refused.error


@LEASES
async def test_with_response_model_read_results_gives_back_the_models(
    tmp_path: Path, lease_seconds: float | None
) -> None:
    db = tmp_path / "runs.sqlite"
    fake = FakeStrategy(script={p: [Label(label=p, score=0.25)] for p in PROMPTS})
    fake.response_model = Label
    results = await _run(db, fake, lease_seconds)
    for item_id, r in results.items():
        assert r.success, r.error
        assert type(r.output) is Label
        assert r.output == Label(label=item_id.replace("item-", "p"), score=0.25)
    # Reattached by another handle (as another process would), the models come back too.
    async with await open_run(db, "run", fake, None, identity=IDENTITY) as run:
        again = await run.read_results(after_sequence=2, limit=2)
    assert [r.sequence for r in again] == [3, 4]
    assert all(type(r.result.output) is Label for r in again)


@LEASES
async def test_a_subclass_of_the_response_model_is_refused(
    tmp_path: Path, lease_seconds: float | None
) -> None:
    db = tmp_path / "runs.sqlite"
    fake = FakeStrategy(script={"p0": [Finer(label="x", reason="because")], "p1": [Label(label="y")]})
    fake.response_model = Label
    results = await _run(db, fake, lease_seconds)
    refused = results["item-0"]
    assert not refused.success and refused.error_category is ErrorCategory.PARSE
    assert refused.error is not None and "Finer" in refused.error and "response_model=" in refused.error
    assert type(results["item-1"].output) is Label
    assert [r.success for r in results.values()].count(False) == 1


async def test_a_store_with_an_output_codec_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    store = SqliteArtifactStore(path, identity=IDENTITY, output_encoder=list, output_decoder=tuple)
    fake = FakeStrategy(script={"p0": [(1, 2)]})
    with pytest.raises(ConfigurationError) as caught:
        await open_run(store, "run", fake, PROMPTS)
    message = str(caught.value)
    assert "output_encoder" in message and "open_run" in message and "response_model=" in message, message
    assert fake.calls == [] and not path.exists()
