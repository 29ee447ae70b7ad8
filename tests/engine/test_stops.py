"""The stop rules of a batch, without an event loop (``_engine/_stops.StopPolicy``).

The policy never awaits and reads no clock, so these are plain functions: the
first decision wins, budgets stop at the first item that reaches them (never more
than one item's charge past a cap) and fail closed on an unknown cost, a replayed
failure never aborts, and unfinished items are told what the stop was.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_batch_llm import AbortMode, ErrorCategory, GuardrailConfig, StopReason, WorkItemResult
from trio_batch_llm._engine._stops import Stop, StopPolicy


def _ok(item_id: str = "a", tokens: int = 0) -> WorkItemResult[Any]:
    usage = {"input_tokens": tokens, "output_tokens": 0, "total_tokens": tokens}
    return WorkItemResult(item_id=item_id, success=True, output="x", token_usage=usage)


def _failed(category: ErrorCategory, item_id: str = "a", *, replayed: bool = False) -> WorkItemResult[Any]:
    return WorkItemResult(
        item_id=item_id, success=False, error="boom", error_category=category, replayed=replayed
    )


def test_nothing_decided_is_a_completed_batch() -> None:
    policy = StopPolicy(GuardrailConfig())
    assert not policy.stopped
    assert policy.termination.kind == "completed" and policy.termination.reason is None
    assert policy.judge(_failed(ErrorCategory.RATE_LIMIT)) is None
    assert policy.charge(_ok(tokens=10**9)) is None
    assert policy.counters.total_tokens == 10**9
    assert policy.deadline(5.0) == math.inf
    assert not policy.cuts_calls


def test_the_first_decision_wins_and_later_ones_return_none() -> None:
    policy = StopPolicy(GuardrailConfig(abort_on_error_categories=AUTH))
    first = policy.request("interrupted", "operator", cancel_active=False)
    assert first == Stop("interrupted", "operator", cancel_active=False)
    assert policy.deadline_reached() is None
    assert policy.judge(_failed(ErrorCategory.AUTHENTICATION)) is None
    assert policy.request("aborted", "later") is None
    assert (policy.termination.kind, policy.termination.reason) == ("interrupted", "operator")


AUTH = frozenset({ErrorCategory.AUTHENTICATION})


@pytest.mark.parametrize(
    ("mode", "cancels"), [(AbortMode.DRAIN_ACTIVE, False), (AbortMode.CANCEL_ACTIVE, True)]
)
def test_abort_on_a_category_names_the_item_and_follows_the_abort_mode(
    mode: AbortMode, cancels: bool
) -> None:
    guard = GuardrailConfig(abort_on_error_categories=AUTH, abort_mode=mode)
    policy = StopPolicy(guard)
    assert policy.cuts_calls is cancels
    assert policy.judge(_failed(ErrorCategory.RATE_LIMIT, "x")) is None  # not an abort category
    assert policy.judge(_ok("y")) is None
    stop = policy.judge(_failed(ErrorCategory.AUTHENTICATION, "z"))
    assert stop == Stop("aborted", "authentication failure of item 'z'", cancel_active=cancels,
                        stop_reason=StopReason.ABORT_CATEGORY, item_id="z")
    assert policy.termination.item_id == "z"
    assert policy.unfinished_reason is StopReason.ABORT_CATEGORY


def test_a_replayed_failure_is_history_and_never_aborts() -> None:
    policy = StopPolicy(GuardrailConfig(abort_on_error_categories=AUTH))
    assert policy.judge(_failed(ErrorCategory.AUTHENTICATION, replayed=True)) is None
    assert not policy.stopped


def test_the_batch_deadline_cuts_calls_in_flight_as_deadline() -> None:
    policy = StopPolicy(GuardrailConfig(batch_timeout=2.5))
    assert policy.cuts_calls
    assert policy.deadline(10.0) == 12.5
    # An item cut by the deadline before the stop was recorded is DEADLINE already.
    assert policy.cut_short() == (ErrorCategory.DEADLINE, "cut short: batch deadline")
    stop = policy.deadline_reached()
    assert stop == Stop("batch_deadline", "batch deadline (2.5 s) reached", cancel_active=True,
                        stop_reason=StopReason.BATCH_DEADLINE)
    assert policy.unfinished_reason is StopReason.BATCH_DEADLINE and policy.termination.item_id is None
    assert policy.cut_short() == (ErrorCategory.DEADLINE, "cut short: batch deadline (2.5 s) reached")
    assert policy.not_executed() == ("not executed: batch deadline (2.5 s) reached",
                                     ErrorCategory.NOT_EXECUTED)


def test_other_stops_cut_calls_short_as_aborted() -> None:
    policy = StopPolicy(GuardrailConfig())
    policy.request("interrupted", "stop requested")
    assert policy.cut_short() == (ErrorCategory.ABORTED, "cut short: stop requested")
    assert policy.not_executed() == ("not executed: stop requested", ErrorCategory.NOT_EXECUTED)


def test_a_spent_token_budget_stops_at_the_item_that_reaches_it_and_queued_are_budget() -> None:
    policy = StopPolicy(GuardrailConfig(max_total_tokens=100))
    assert policy.charge(_ok("a", 60)) is None
    stop = policy.charge(_ok("b", 40))  # reaches the cap exactly: spent
    assert stop == Stop("budget_exhausted", "max_total_tokens=100 reached", cancel_active=False,
                        stop_reason=StopReason.BUDGET, item_id="b")
    assert policy.termination.item_id == "b"
    assert policy.not_executed() == ("not executed: max_total_tokens=100 reached", ErrorCategory.BUDGET)
    assert policy.charge(_ok("c", 5)) is None  # counted, but the first stop stands
    assert policy.counters.total_tokens == 105


def test_a_cost_budget_stops_when_the_spend_reaches_it() -> None:
    guard = GuardrailConfig(max_total_cost=0.03, cost_function=lambda usage: 0.01)
    policy = StopPolicy(guard)
    assert policy.charge(_ok("a")) is None
    assert policy.charge(_ok("b")) is None
    stop = policy.charge(_ok("c"))
    assert stop is not None and stop.kind == "budget_exhausted"
    assert stop.reason == "max_total_cost=0.03 reached"
    assert (stop.stop_reason, stop.item_id) == (StopReason.BUDGET, "c")
    assert policy.counters.cost == pytest.approx(0.03)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, "0.1", None, True])
def test_an_unknown_cost_fails_closed(bad: Any, caplog: pytest.LogCaptureFixture) -> None:
    policy = StopPolicy(GuardrailConfig(cost_function=lambda usage: bad))
    stop = policy.charge(_ok("item-7"))
    assert stop is not None and stop.kind == "budget_exhausted"
    assert stop.reason is not None and "item 'item-7'" in stop.reason
    assert "the spend is unknown" in stop.reason
    assert any("stopping the batch" in r.getMessage() for r in caplog.records)


def test_a_cost_function_that_raises_fails_closed() -> None:
    def cost(usage: Any) -> float:
        raise RuntimeError("price list unavailable")

    policy = StopPolicy(GuardrailConfig(cost_function=cost))
    stop = policy.charge(_ok("a"))
    assert stop is not None and stop.kind == "budget_exhausted"
    assert stop.reason is not None and "RuntimeError: price list unavailable" in stop.reason


@given(
    cap=st.integers(min_value=1, max_value=10_000),
    charges=st.lists(st.integers(min_value=0, max_value=500), min_size=1, max_size=60),
)
def test_a_token_budget_never_overshoots_by_more_than_the_item_that_spent_it(
    cap: int, charges: list[int]
) -> None:
    policy = StopPolicy(GuardrailConfig(max_total_tokens=cap))
    total_when_stopped = None
    for n, tokens in enumerate(charges):
        before = policy.counters.total_tokens
        stop = policy.charge(_ok(f"i{n}", tokens))
        if stop is not None:
            assert total_when_stopped is None  # decided once
            total_when_stopped = policy.counters.total_tokens
            assert before < cap <= total_when_stopped <= before + tokens
            break  # the engine admits nothing more once stopped
    if total_when_stopped is None:
        assert policy.counters.total_tokens == sum(charges) < cap
        assert not policy.stopped


@given(st.lists(st.sampled_from(["request", "deadline", "abort", "budget"]), min_size=1, max_size=8))
def test_whatever_the_order_only_the_first_decision_is_kept(events: list[str]) -> None:
    guard = GuardrailConfig(
        batch_timeout=1.0, abort_on_error_categories=AUTH, max_total_tokens=1
    )
    policy = StopPolicy(guard)
    decided: list[Stop] = []
    decide: dict[str, Callable[[], Stop | None]] = {
        "request": lambda: policy.request("interrupted", "asked"),
        "deadline": policy.deadline_reached,
        "abort": lambda: policy.judge(_failed(ErrorCategory.AUTHENTICATION)),
        "budget": lambda: policy.charge(_ok(tokens=1)),
    }
    for event in events:
        stop = decide[event]()
        if stop is not None:
            decided.append(stop)
    assert len(decided) == 1
    assert policy.termination.kind == decided[0].kind
    expected = {
        "request": "interrupted",
        "deadline": "batch_deadline",
        "abort": "aborted",
        "budget": "budget_exhausted",
    }
    assert decided[0].kind == expected[events[0]]
