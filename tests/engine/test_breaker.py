"""The circuit breaker's state machine (issue 32, point 4) and what it counts: no event loop here.

:class:`CircuitBreaker` is a pure function of (state, now, outcome); the classification
that feeds it (:func:`endpoint_unusable`) reads an exception chain. The engine's use of
both is tested in ``test_breaker_engine.py``.
"""

from __future__ import annotations

import math
import socket
import ssl
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trio_batch_llm import (
    CircuitBreakerConfig,
    ConfigurationError,
    ErrorCategory,
    ProcessorConfig,
    ProviderError,
)
from trio_batch_llm._engine._breaker import CircuitBreaker
from trio_batch_llm._engine._breaker_gate import scope_label
from trio_batch_llm._engine._classify import classify
from trio_batch_llm._engine._endpoint import endpoint_unusable

CONFIG = CircuitBreakerConfig(threshold=3, pause=5.0, probes=2)


def _fail(breaker: CircuitBreaker, now: float, *, probe: bool = False, item: str = "i") -> bool:
    return breaker.failed(now, f"refused {item}", item, probe=probe, cause="connection refused")


# --- the state machine ------------------------------------------------------------------


def test_threshold_failures_in_a_row_open_it_and_the_pause_holds_every_attempt() -> None:
    breaker = CircuitBreaker(CONFIG)
    for index in range(3):
        assert breaker.gate(0.0).kind == "go"
        changed = _fail(breaker, 1.0 + index, item=f"item-{index}")
        assert changed is (index == 2)
    assert breaker.state == "open"
    assert breaker.trip is not None
    assert (breaker.trip.cause, breaker.trip.first_error, breaker.trip.item_id, breaker.trip.failures) == (
        "connection refused", "refused item-0", "item-2", 3)
    wait = breaker.gate(4.0)
    assert (wait.kind, wait.until) == ("wait", 8.0)  # opened at 3.0, a 5 s pause
    assert breaker.gate(7.999).kind == "wait"
    assert breaker.gate(8.0).kind == "probe"
    assert breaker.state == "half_open"
    assert breaker.gate(8.0).kind == "wait"  # one probe at a time
    assert breaker.gate(8.0).until == math.inf


def test_failed_probes_reopen_it_then_retire_it() -> None:
    breaker = CircuitBreaker(CONFIG)
    for _ in range(3):
        breaker.gate(0.0)
        _fail(breaker, 0.0)
    assert breaker.gate(5.0).kind == "probe"
    assert _fail(breaker, 6.0, probe=True)
    assert breaker.state == "open" and breaker.open_until == 11.0
    assert breaker.gate(11.0).kind == "probe"
    assert _fail(breaker, 11.5, probe=True)
    assert breaker.state == "retired"
    assert breaker.gate(100.0).kind == "retired"
    assert breaker.trip is not None and breaker.trip.first_error == "refused i"
    breaker.answered()  # a straggler's answer does not bring a retired scope back
    assert breaker.state == "retired"


def test_a_probe_that_answers_closes_it_and_admission_resumes() -> None:
    breaker = CircuitBreaker(CONFIG)
    for _ in range(3):
        breaker.gate(0.0)
        _fail(breaker, 0.0)
    assert breaker.gate(5.0).kind == "probe"
    assert breaker.answered(probe=True)
    assert breaker.state == "closed" and breaker.trip is None and breaker.streak == 0
    assert [breaker.gate(5.0).kind for _ in range(10)] == ["go"] * 10  # proven: no bound now


def test_any_other_outcome_ends_the_streak() -> None:
    breaker = CircuitBreaker(CONFIG)
    for _ in range(20):
        for _ in range(2):
            breaker.gate(0.0)
            _fail(breaker, 0.0)
        breaker.gate(0.0)
        breaker.answered()  # a 5xx, a 429, a timeout, an answer: the endpoint may be there
    assert breaker.state == "closed"


def test_until_an_answer_at_most_threshold_attempts_are_in_flight() -> None:
    breaker = CircuitBreaker(CONFIG)
    assert [breaker.gate(0.0).kind for _ in range(4)] == ["go", "go", "go", "wait"]
    breaker.released()  # cut short: its place is free again
    assert breaker.gate(0.0).kind == "go"
    breaker.answered()
    assert [breaker.gate(0.0).kind for _ in range(20)] == ["go"] * 20
    _fail(breaker, 0.0)  # a streak began: attempts counted + in flight <= threshold again
    assert breaker.gate(0.0).kind == "wait"


def test_the_start_bound_ends_after_a_pause_without_a_refusal() -> None:
    """A slow endpoint (no answer yet, no refusal either) runs at ``threshold`` calls for a pause at most."""
    breaker = CircuitBreaker(CONFIG)
    assert [breaker.gate(1.0).kind for _ in range(3)] == ["go"] * 3
    wait = breaker.gate(2.0)
    assert (wait.kind, wait.until) == ("wait", 6.0)  # the first attempt asked at 1.0; a 5 s pause
    assert [breaker.gate(6.0).kind for _ in range(10)] == ["go"] * 10
    _fail(breaker, 7.0)  # but a streak bounds it again
    assert breaker.gate(7.0).kind == "wait"


def test_a_probe_cut_short_lets_another_probe_go() -> None:
    breaker = CircuitBreaker(CONFIG)
    for _ in range(3):
        breaker.gate(0.0)
        _fail(breaker, 0.0)
    assert breaker.gate(5.0).kind == "probe"
    breaker.released(probe=True)
    assert breaker.gate(5.0).kind == "probe"


Op = tuple[str, float]


@settings(max_examples=500, deadline=None)
@example(threshold=3, probes=1, ops=[("start", 0.0)] * 2 + [("fail", 0.0)] + [("start", 0.0)] * 6)
@given(
    threshold=st.integers(1, 6),
    probes=st.integers(1, 3),
    ops=st.lists(st.tuples(st.sampled_from(["start", "start", "start", "fail", "fail", "answer", "release"]),
                           st.floats(0.0, 3.0)), max_size=120),
)
def test_never_more_than_threshold_plus_probes_attempts_after_the_first_failure_of_a_streak(
    threshold: int, probes: int, ops: list[Op]
) -> None:
    """Attempts let go after the first endpoint-unusable failure that follows the last other outcome
    number at most ``threshold + probes`` (plus those cut short without an outcome), whatever the
    interleaving of starts, outcomes and time."""
    breaker = CircuitBreaker(CircuitBreakerConfig(threshold=threshold, pause=1.0, probes=probes))
    now = 0.0
    in_flight: list[bool] = []  # probe flags of the attempts let go, oldest first
    since_streak: int | None = None  # attempts let go since the streak's first failure
    released_since = 0
    for op, step in ops:
        now += step
        if op == "start":
            gate = breaker.gate(now)
            if gate.kind in ("go", "probe"):
                in_flight.append(gate.kind == "probe")
                if since_streak is not None:
                    since_streak += 1
            elif gate.kind == "retired":
                assert breaker.state == "retired"
            if since_streak is not None:
                assert since_streak <= threshold + probes + released_since
            continue
        if not in_flight:
            continue
        probe = in_flight.pop(0)
        if op == "fail":
            _fail(breaker, now, probe=probe)
            if since_streak is None and breaker.state != "retired":
                since_streak = 0
        elif op == "answer":
            breaker.answered(probe=probe)
            if breaker.state != "retired":
                since_streak, released_since = None, 0
        else:
            breaker.released(probe=probe)
            if since_streak is not None:
                released_since += 1
        assert breaker.unresolved == len(in_flight)
        if since_streak is not None:
            assert since_streak <= threshold + probes + released_since
    assert breaker.unresolved == len(in_flight)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["start", "fail", "answer"]), max_size=200), st.integers(2, 10))
def test_failures_that_are_never_threshold_in_a_row_never_open_it(ops: list[str], threshold: int) -> None:
    breaker = CircuitBreaker(CircuitBreakerConfig(threshold=threshold))
    in_flight = 0
    row = 0
    for op in ops:
        if op == "start":
            if breaker.gate(0.0).kind == "go":
                in_flight += 1
        elif in_flight:
            in_flight -= 1
            if op == "fail" and row + 1 < threshold:
                row += 1
                _fail(breaker, 0.0)
            else:
                row = 0
                breaker.answered()
        assert breaker.state == "closed"


# --- configuration ----------------------------------------------------------------------


def test_on_by_default_and_off_with_none() -> None:
    assert ProcessorConfig().circuit_breaker == CircuitBreakerConfig(threshold=10, pause=5.0, probes=1)
    assert ProcessorConfig(circuit_breaker=None).circuit_breaker is None


@pytest.mark.parametrize(("knobs", "field"), [
    ({"threshold": 0}, "threshold"), ({"threshold": 1.5}, "threshold"), ({"pause": 0}, "pause"),
    ({"pause": math.inf}, "pause"), ({"probes": 0}, "probes"), ({"probes": True}, "probes"),
])
def test_bad_settings_name_the_field(knobs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        CircuitBreakerConfig(**knobs)
    assert info.value.field == field


def test_a_config_that_is_not_a_breaker_config_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="circuit_breaker"):
        ProcessorConfig(circuit_breaker=10)  # type: ignore[arg-type]


def test_scope_labels_drop_the_key_fingerprint() -> None:
    assert scope_label("('openai-endpoint', 'http://h/v1', '9df37f5e7cbc3c39')") == (
        "('openai-endpoint', 'http://h/v1')")
    assert scope_label(None) == "default"


# --- what counts: the endpoint itself is unusable -----------------------------------------


def _chained(outer: Exception, inner: BaseException) -> Exception:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except Exception as caught:
        return caught


class ConnectError(Exception):  # httpx's name, as the classifier sees it (duck typing)
    pass


@pytest.mark.parametrize(("exc", "cause"), [
    (ConnectionRefusedError(111, "Connection refused"), "connection refused"),
    (_chained(ProviderError("ConnectError: all attempts failed", category=ErrorCategory.TRANSIENT),
              ConnectionRefusedError(111, "refused")), "connection refused"),
    (_chained(ConnectError("x"),
              ExceptionGroup("all attempts", [ConnectionRefusedError(), ConnectionRefusedError()])),
     "connection refused"),
    (_chained(ConnectError("x"), socket.gaierror(-2, "Name or service not known")), "host name not resolved"),
    (ConnectError("[Errno -2] Name or service not known"), "host name not resolved"),
    (_chained(ConnectError("x"), ssl.SSLCertVerificationError("certificate verify failed")), "TLS failed"),
    (ProviderError("HTTP 401: bad key", category=ErrorCategory.AUTHENTICATION, status_code=401), "HTTP 401"),
    (ProviderError("HTTP 403", category=ErrorCategory.AUTHENTICATION, status_code=403), "HTTP 403"),
    (ProviderError("HTTP 404 (model_not_found): The model `gpt-9` does not exist",
                   category=ErrorCategory.INVALID_REQUEST, status_code=404),
     "HTTP 404 (model or URL not found)"),
    (ProviderError("HTTP 404: 404 page not found", category=ErrorCategory.INVALID_REQUEST, status_code=404),
     "HTTP 404 (model or URL not found)"),
])
def test_endpoint_unusable_failures(exc: Exception, cause: str) -> None:
    verdict = classify(exc)
    assert verdict.endpoint_unusable
    assert verdict.unusable_because == cause


@pytest.mark.parametrize("exc", [
    ConnectionResetError(104, "reset"),
    TimeoutError("slow"),
    _chained(ConnectError("x"), ExceptionGroup("all", [ConnectionRefusedError(), TimeoutError()])),
    ProviderError("HTTP 500", category=ErrorCategory.SERVER, status_code=500),
    ProviderError("HTTP 429", category=ErrorCategory.RATE_LIMIT, status_code=429),
    ProviderError("HTTP 404: file 'f-1' not found", category=ErrorCategory.INVALID_REQUEST, status_code=404),
    ProviderError("HTTP 400: bad", category=ErrorCategory.INVALID_REQUEST, status_code=400),
    ValueError("a bug"),
])
def test_other_failures_say_nothing_about_the_endpoint(exc: Exception) -> None:
    assert not classify(exc).endpoint_unusable
    assert endpoint_unusable(exc, None) is None or isinstance(exc, ProviderError)


def test_a_user_classifier_that_knows_nothing_of_it_keeps_working() -> None:
    refused = _chained(ConnectError("x"), ConnectionRefusedError())
    verdict = classify(refused, user_classifier=lambda exc: ErrorCategory.SERVER)
    assert verdict.category is ErrorCategory.SERVER
    assert verdict.unusable_because == "connection refused"  # a fact of the exception, not of the category
    assert not classify(ValueError("x"), user_classifier=lambda exc: ErrorCategory.SERVER).endpoint_unusable
