"""Cost for every provider: cache writes, the Claude and Gemini rows, provider-batch runs at batch prices."""

from __future__ import annotations

import re
from typing import Any

import pytest

from trio_batch_llm import (
    DEFAULT_MODEL_RATES,
    ArtifactIdentity,
    BatchResult,
    ConfigurationError,
    ModelRates,
    WorkItemResult,
)
from trio_batch_llm._cli._render import describe
from trio_batch_llm._runs._schema import RunSnapshot, SourceCheckpoint
from trio_batch_llm._values._cost import BATCH_PRICE_FACTORS, RATE_SOURCES

# Anthropic's convention (issue 33): input_tokens counts every input token; of them 200,000 were cache
# reads and 100,000 cache writes.
USAGE = {"input_tokens": 1_000_000, "cached_input_tokens": 200_000, "cache_write_input_tokens": 100_000,
         "output_tokens": 10_000}


def test_cache_writes_are_priced_at_their_own_rate() -> None:
    rates = ModelRates(3.0, 15.0, cached_input_per_mtok=0.30, cache_write_per_mtok=3.75)
    # 700,000 plain x $3 = 2.10; 200,000 read x $0.30 = 0.06; 100,000 written x $3.75 = 0.375;
    # 10,000 out x $15 = 0.15 -> $2.685
    assert rates.cost(USAGE) == pytest.approx(2.685)
    # None: a cache write costs plain input. 800,000 x $3 = 2.40 + 0.06 + 0.15 -> $2.61
    assert ModelRates(3.0, 15.0, 0.30).cost(USAGE) == pytest.approx(2.61)
    # Counts beyond the input are clamped: reads first, then writes, never more than the input.
    assert rates.cost({"input_tokens": 100, "cached_input_tokens": 80, "cache_write_input_tokens": 50}) \
        == pytest.approx((80 * 0.30 + 20 * 3.75) / 1e6)


def test_cache_write_rate_is_validated() -> None:
    for bad in (-1, float("nan"), True, "1"):
        with pytest.raises(ConfigurationError, match="cache_write_per_mtok"):
            ModelRates(1, 1, cache_write_per_mtok=bad)  # type: ignore[arg-type]


def test_batch_result_prices_cache_writes_by_model() -> None:
    result = WorkItemResult(item_id="a", success=True, output="x", token_usage=dict(USAGE),
                            metadata={"model": "claude-sonnet-4-5-20250929"})
    # claude-sonnet-4-5: $3 in, $15 out, $0.30 cache read, $3.75 5-minute cache write -> as above
    assert BatchResult.from_results([result]).estimated_cost() == pytest.approx(2.685)


@pytest.mark.parametrize(
    ("model", "figures"),
    [
        ("claude-opus-4-6", (5.0, 25.0, 0.50, 6.25)),
        ("claude-sonnet-4-5", (3.0, 15.0, 0.30, 3.75)),
        ("claude-sonnet-4-20250514", (3.0, 15.0, 0.30, 3.75)),
        ("claude-haiku-4-5-20251001", (1.0, 5.0, 0.10, 1.25)),
        ("claude-sonnet-5", (2.0, 10.0, 0.20, 2.50)),
        ("gemini-2.5-flash", (0.30, 2.50, None, None)),
        ("gemini-2.5-pro", (1.25, 10.0, None, None)),
    ],
)
def test_the_built_in_table_has_claude_and_gemini(model: str, figures: tuple[Any, ...]) -> None:
    from trio_batch_llm._values._cost import rates_for

    rates = rates_for(model, DEFAULT_MODEL_RATES)
    assert rates is not None, model
    assert (rates.input_per_mtok, rates.output_per_mtok, rates.cached_input_per_mtok,
            getattr(rates, "cache_write_per_mtok", None)) == figures


def test_every_built_in_row_says_when_and_where_its_price_was_read() -> None:
    assert set(RATE_SOURCES) == set(DEFAULT_MODEL_RATES)
    for model, (read_on, where) in RATE_SOURCES.items():
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", read_on), model
        assert where.startswith("https://"), model


def _snapshot(mode: str, provider: str, model: str) -> RunSnapshot:
    return RunSnapshot(
        run_id="r1", status="completed", mode=mode,  # type: ignore[arg-type]
        identity=ArtifactIdentity(provider, model), config={}, termination=None,
        checkpoint=SourceCheckpoint(position=2, exhausted=True), items=2, done=2, succeeded=2, failed=0,
        input_tokens=1_000_000, output_tokens=100_000, total_tokens=1_100_000, last_sequence=2,
        created_at="t", updated_at="t",
    )


@pytest.mark.parametrize(
    ("provider", "model", "standard"),
    [
        ("openai", "gpt-4o-mini", 1_000_000 * 0.15 / 1e6 + 100_000 * 0.60 / 1e6),
        ("anthropic", "claude-haiku-4-5", 1_000_000 * 1.0 / 1e6 + 100_000 * 5.0 / 1e6),
        ("gemini", "gemini-2.5-flash", 1_000_000 * 0.30 / 1e6 + 100_000 * 2.50 / 1e6),
    ],
)
def test_a_provider_batch_run_shows_its_cost_at_the_batch_discount(
    provider: str, model: str, standard: float
) -> None:
    live = "\n".join(describe(_snapshot("live", provider, model)))
    assert f"${standard:.4f}" in live
    lines = describe(_snapshot("provider-batch", provider, model))
    cost = [line for line in lines if "cost" in line]
    assert cost, lines
    assert f"${standard * 0.5:.4f}" in cost[0] and "batch" in cost[0], cost
    assert BATCH_PRICE_FACTORS[provider] == 0.5


def test_a_provider_batch_run_of_an_unknown_discount_shows_no_cost() -> None:
    lines = describe(_snapshot("provider-batch", "openai-compatible", "gpt-4o-mini"))
    assert not [line for line in lines if "cost" in line]
