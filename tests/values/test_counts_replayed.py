"""Issue 35, point 2: a resume shows what it replayed apart from what it ran, so nobody adding up
runs counts a replayed result's spend twice.

``BatchResult`` splits items, tokens and cost into *new* (this run's calls) and *replayed* (answered
from the checkpoint: an earlier run paid for them); its summary and the command line's show the new
spend on the tokens and cost lines and the replayed one on a line of its own, and compute items/s
over new items only. Hand-built batches, and batches the engine made and resumed (both backends).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trio_batch_llm import (
    ArtifactIdentity,
    BatchResult,
    BatchTermination,
    ErrorCategory,
    FakeStrategy,
    JsonlArtifactStore,
    ModelRates,
    ResumePolicy,
    WorkItemResult,
    process_prompts,
)
from trio_batch_llm._cli._summary import RunSummary

RATES = ModelRates(input_per_mtok=1_000.0, output_per_mtok=2_000.0)
"""$0.001 an input token, $0.002 an output token: easy sums."""


def _ok(item_id: str, *, replayed: bool = False, execution: float = 0.0, **usage: int) -> WorkItemResult[str]:
    from trio_batch_llm._values._timing import ItemTiming

    return WorkItemResult(item_id, True, "x", token_usage=dict(usage), metadata={"model": "gpt-4o-mini"},
                          replayed=replayed, attempts=0 if replayed else 1,
                          timing=ItemTiming(execution=execution))


def _not_run(item_id: str) -> WorkItemResult[str]:
    return WorkItemResult(item_id, False, error="not executed: interrupted",
                          error_category=ErrorCategory.NOT_EXECUTED)


MIXED = [
    _ok("a", input_tokens=100, output_tokens=10, total_tokens=110, execution=0.01),
    _ok("b", input_tokens=200, output_tokens=20, total_tokens=220, execution=0.02),
    _ok("c", replayed=True, input_tokens=1_000, output_tokens=100, total_tokens=1_100),
    _ok("d", replayed=True, input_tokens=2_000, output_tokens=200, total_tokens=2_200),
    _ok("e", replayed=True, input_tokens=3_000, output_tokens=300, total_tokens=3_300),
    _not_run("f"),
]


def test_batch_result_splits_items_tokens_and_cost_into_new_and_replayed() -> None:
    batch = BatchResult.from_results(MIXED, wall_time=1.0)
    assert (batch.replayed, batch.new_items, batch.not_run) == (3, 2, 1)
    assert batch.replayed + batch.new_items + batch.not_run == batch.total_items
    assert batch.new_tokens() == {"input_tokens": 300, "output_tokens": 30, "total_tokens": 330}
    assert batch.replayed_tokens() == {"input_tokens": 6_000, "output_tokens": 600, "total_tokens": 6_600}
    assert batch.total_tokens()["total_tokens"] == 330 + 6_600  # unchanged: every result
    assert batch.new_cost(RATES) == pytest.approx(0.3 + 0.06)
    assert batch.replayed_cost(RATES) == pytest.approx(6.0 + 1.2)
    assert batch.estimated_cost(RATES) == pytest.approx(0.36 + 7.2)
    nothing_new = BatchResult.from_results(MIXED[2:5])
    assert nothing_new.new_tokens() == {} and nothing_new.new_cost(RATES) == 0.0  # spent nothing
    assert BatchResult.from_results([]).replayed_cost(RATES) is None  # nothing replayed: no figure


def test_the_summary_shows_the_new_spend_and_the_replayed_one_apart() -> None:
    lines = BatchResult.from_results(MIXED, wall_time=1.0).summary(rates=RATES).splitlines()
    assert lines[1] == "  items                6   succeeded 5   failed 0   not run 1   replayed 3   new 2"
    assert lines[3] == "  tokens             330   in 300   out 30"  # this run's calls only
    assert lines[4] == "  cost           $0.3600   estimated, given rates"
    assert lines[5] == ("  replayed         6,600   tokens (in 6,000   out 600)   $7.2000   from the "
                        "checkpoint: spent by an earlier run, not counted above")
    assert lines[6] == "  wall time        1.000 s   2 items/s (new items only)"


def test_a_resume_that_replays_everything_spent_nothing() -> None:
    text = BatchResult.from_results(MIXED[2:5], wall_time=0.5).summary(rates=RATES)
    assert "  tokens               0   in 0   out 0" in text.splitlines()
    assert "  cost           $0.0000   estimated, given rates" in text.splitlines()
    assert "   $7.2000   from the checkpoint" in text and "0 items/s (new items only)" in text


def test_without_replays_the_summary_is_as_before() -> None:
    text = BatchResult.from_results(MIXED[:2], wall_time=1.0).summary()
    assert "replayed 0" in text and "new " not in text and "  replayed  " not in text
    assert "2 items/s\n" in text + "\n" and "(new items only)" not in text


@pytest.mark.parametrize("results", [MIXED, MIXED[2:5], MIXED[:2]], ids=["mixed", "all-replayed", "none"])
def test_the_run_summary_reads_like_batch_summary_with_replays(results: list[WorkItemResult[Any]]) -> None:
    termination = BatchTermination()
    summary = RunSummary(len(results), model="gpt-4o-mini")
    for result in results:
        summary.add(result)
    expected = BatchResult.from_results(results, termination=termination, wall_time=1.0).summary()
    assert summary.text(termination, 1.0) == expected


@pytest.mark.anyio
async def test_a_resumed_batch_splits_what_it_ran_from_what_it_replayed(anyio_backend: str,
                                                                       tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    identity = ArtifactIdentity(provider="fake", model="fake-model")
    prompts = [(f"i{n}", f"p{n}") for n in range(6)]
    first = await process_prompts(FakeStrategy(), prompts[:4],
                                  artifact_store=JsonlArtifactStore(path, identity=identity))
    again = await process_prompts(FakeStrategy(), prompts, resume=ResumePolicy.REUSE_SUCCESSES,
                                  artifact_store=JsonlArtifactStore(path, identity=identity))
    assert (again.replayed, again.new_items, again.not_run) == (4, 2, 0)
    assert again.replayed_tokens() == first.total_tokens()
    assert again.new_tokens()["total_tokens"] == first.total_tokens()["total_tokens"] // 2
    assert "replayed 4   new 2" in again.summary()
