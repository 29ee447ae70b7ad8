"""Cost: ModelRates, the built-in table and BatchResult.estimated_cost, checked against hand arithmetic."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_batch_llm import (
    DEFAULT_MODEL_RATES,
    DEFAULT_MODEL_RATES_AS_OF,
    BatchResult,
    ConfigurationError,
    ModelRates,
    WorkItemResult,
)


def _result(item_id: str, model: str | None, **usage: int) -> WorkItemResult[str]:
    metadata: dict[str, Any] = {"model": model} if model is not None else {}
    return WorkItemResult(item_id=item_id, success=True, output="x", token_usage=dict(usage),
                          metadata=metadata)


def test_model_rates_validate_each_field() -> None:
    for bad in (-1, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ConfigurationError, match="input_per_mtok"):
            ModelRates(bad, 1)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="output_per_mtok"):
            ModelRates(1, bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="cached_input_per_mtok"):
            ModelRates(1, 1, bad)  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        ModelRates(1, 2).input_per_mtok = 3  # type: ignore[misc]


def test_cached_input_tokens_are_priced_at_their_rate() -> None:
    rates = ModelRates(input_per_mtok=2.0, output_per_mtok=8.0, cached_input_per_mtok=0.5)
    # 1,000,000 input of which 400,000 cached, 250,000 output (reasoning tokens are inside output):
    # 600,000 x $2/M = $1.20; 400,000 x $0.50/M = $0.20; 250,000 x $8/M = $2.00 -> $3.40
    usage = {"input_tokens": 1_000_000, "cached_input_tokens": 400_000, "output_tokens": 250_000,
             "reasoning_tokens": 100_000, "total_tokens": 1_250_000}
    assert rates.cost(usage) == pytest.approx(3.40)
    # No cached rate: cached tokens cost the input rate. 1,000,000 x $2/M + 250,000 x $8/M = $4.00
    assert ModelRates(2.0, 8.0).cost(usage) == pytest.approx(4.00)
    assert rates.cost({}) is None
    assert rates.cost({"total_tokens": 10}) is None  # a total alone cannot be priced


def test_estimated_cost_by_model_from_the_built_in_table() -> None:
    batch = BatchResult.from_results([
        # gpt-4o: 10,000 in (2,000 cached), 1,000 out:
        # 8,000 x 2.50 + 2,000 x 1.25 + 1,000 x 10.00 = 20,000 + 2,500 + 10,000 = 32,500 -> $0.0325
        _result("a", "gpt-4o-2024-08-06", input_tokens=10_000, cached_input_tokens=2_000,
                output_tokens=1_000),
        # gpt-4o-mini: 20,000 in, 5,000 out: 20,000 x 0.15 + 5,000 x 0.60 = 3,000 + 3,000 -> $0.006
        _result("b", "gpt-4o-mini", input_tokens=20_000, output_tokens=5_000),
        _result("c", None),  # never called: no usage, costs nothing
    ])
    assert batch.estimated_cost() == pytest.approx(0.0385)
    assert "$0.0385" in batch.summary() and DEFAULT_MODEL_RATES_AS_OF in batch.summary()


def test_one_rates_for_every_result_and_a_custom_table() -> None:
    batch = BatchResult.from_results([
        _result("a", None, input_tokens=3_000, output_tokens=500),
        _result("b", "my-model", input_tokens=1_000, output_tokens=100),
    ])
    # 4,000 x $1/M + 600 x $4/M = 0.004 + 0.0024
    assert batch.estimated_cost(ModelRates(1.0, 4.0)) == pytest.approx(0.0064)
    # A result without a model cannot be priced by name: no partial sum.
    table = {**DEFAULT_MODEL_RATES, "my-model": ModelRates(3.0, 6.0)}
    assert batch.estimated_cost(table) is None
    assert batch.estimated_cost() is None and "cost" not in batch.summary()
    priced = BatchResult.from_results([batch.results[1]])
    # 1,000 x $3/M + 100 x $6/M = 0.003 + 0.0006
    assert priced.estimated_cost(table) == pytest.approx(0.0036)
    assert "$0.0036   estimated, given rates" in priced.summary(rates=table)
    with pytest.raises(TypeError, match="rates="):
        batch.estimated_cost(2.5)  # type: ignore[arg-type]


def test_no_usage_at_all_is_unknown_not_free() -> None:
    batch = BatchResult.from_results([_result("a", "gpt-4o")])
    assert batch.estimated_cost() is None
    assert "cost" not in batch.summary()


def test_built_in_table_is_read_only_and_dated() -> None:
    with pytest.raises(TypeError):
        DEFAULT_MODEL_RATES["gpt-4o"] = ModelRates(0, 0)  # type: ignore[index]
    assert {"gpt-4o", "gpt-4o-mini", "gpt-4.1", "o3", "gpt-5"} <= set(DEFAULT_MODEL_RATES)
    assert len(DEFAULT_MODEL_RATES_AS_OF) == 10 and DEFAULT_MODEL_RATES_AS_OF.startswith("20")


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 10**9), st.integers(0, 10**9), st.integers(0, 10**9),
    st.floats(0, 100), st.floats(0, 100), st.one_of(st.none(), st.floats(0, 100)),
)
def test_cost_is_the_hand_formula(
    input_tokens: int, cached: int, output_tokens: int,
    rate_in: float, rate_out: float, rate_cached: float | None,
) -> None:
    rates = ModelRates(rate_in, rate_out, rate_cached)
    usage = {"input_tokens": input_tokens, "cached_input_tokens": cached, "output_tokens": output_tokens}
    # Cached tokens are a part of the input: never more of them than the input holds.
    part = min(cached, input_tokens)
    cached_rate = rate_in if rate_cached is None else rate_cached
    expected = ((input_tokens - part) * rate_in + part * cached_rate + output_tokens * rate_out) / 1e6
    assert rates.cost(usage) == pytest.approx(expected, rel=1e-9, abs=1e-12)
    batch = BatchResult.from_results([_result("a", "m", **usage), _result("b", "m", **usage)])
    assert batch.estimated_cost({"m": rates}) == pytest.approx(2 * expected, rel=1e-9, abs=1e-12)
