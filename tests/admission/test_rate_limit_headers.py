"""Rate-limit headers -> RateLimitObservation: every dialect and duration form; garbage never raises."""

from __future__ import annotations

import email.utils
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_batch_llm._admission._headers import (
    RateLimitObservation,
    parse_duration,
    parse_rate_limit_headers,
    rate_limit_headers,
)

WALL = 1_755_780_000.0  # 2025-08-21T12:40:00Z
NOW = 100.0  # the scope's clock at the same instant


@pytest.mark.parametrize(("text", "seconds"), [
    ("6m0s", 360.0), ("1s", 1.0), ("1.5s", 1.5), ("20ms", 0.02), ("12ms", 0.012), ("0s", 0.0), ("0", 0.0),
    ("1h2m3.5s", 3723.5), ("1h", 3600.0), ("2m", 120.0), ("59.999s", 59.999), ("1m30s", 90.0),
    ("1.5µs", 1.5e-6), ("3us", 3e-6), ("7ns", 7e-9), ("250ms", 0.25), (".5s", 0.5), ("17", 17.0),
    ("2.25", 2.25), (" 1s ", 1.0),
])
def test_durations_in_every_form(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds, abs=1e-12)


@pytest.mark.parametrize("text", [
    "", "s", "m", "-1s", "1x", "1s2", "1 s", "inf", "nan", "1e3", "1..2s", ".", "1m-3s", "s1", "+1s", "٣s",
    "1" * 300,
])
def test_what_is_not_a_duration(text: str) -> None:
    assert parse_duration(text) is None


def test_openai_dialect() -> None:
    headers = {
        "X-RateLimit-Limit-Requests": "60", "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s", "x-ratelimit-limit-tokens": "150000",
        "x-ratelimit-remaining-tokens": "149984", "x-ratelimit-reset-tokens": "6m0s",
        "content-type": "application/json",
    }
    assert parse_rate_limit_headers(headers, NOW, wall_time=WALL) == RateLimitObservation(
        "openai", NOW, requests_limit=60, requests_remaining=59, requests_reset_at=101.0,
        tokens_limit=150000, tokens_remaining=149984, tokens_reset_at=460.0,
    )


def test_retry_after_forms() -> None:
    def retry(**headers: str) -> float | None:
        observation = parse_rate_limit_headers({k.replace("_", "-"): v for k, v in headers.items()}, NOW,
                                               wall_time=WALL)
        return None if observation is None else observation.retry_after

    assert retry(retry_after="20") == 20.0
    assert retry(retry_after="1.5") == 1.5
    assert retry(retry_after_ms="250") == 0.25
    assert retry(retry_after="20", retry_after_ms="19500") == 19.5  # milliseconds win
    assert retry(retry_after="nonsense", retry_after_ms="bad") is None
    assert retry(retry_after=email.utils.formatdate(WALL + 30, usegmt=True)) == 30.0
    assert retry(retry_after=email.utils.formatdate(WALL - 30, usegmt=True)) == 0.0  # a past date: now
    only = parse_rate_limit_headers({"Retry-After": "3"}, NOW)
    assert only == RateLimitObservation("retry-after", NOW, retry_after=3.0)
    assert not only.reports_budget and not only.capacity_remains


def test_anthropic_dialect() -> None:
    headers = {
        "anthropic-ratelimit-requests-limit": "1000", "anthropic-ratelimit-requests-remaining": "999",
        "anthropic-ratelimit-requests-reset": "2025-08-21T12:40:59Z",
        "anthropic-ratelimit-input-tokens-limit": "80000",
        "anthropic-ratelimit-input-tokens-remaining": "80000",
        "anthropic-ratelimit-input-tokens-reset": "2025-08-21T12:40:59Z",
        "anthropic-ratelimit-output-tokens-limit": "16000",
        "anthropic-ratelimit-output-tokens-remaining": "16000",
        "anthropic-ratelimit-output-tokens-reset": "2025-08-21T12:41:00Z",
        "anthropic-ratelimit-tokens-limit": "96000", "anthropic-ratelimit-tokens-remaining": "95000",
        "anthropic-ratelimit-tokens-reset": "2025-08-21T12:40:30+00:00",
        "retry-after": "4",
    }
    assert parse_rate_limit_headers(headers, NOW, wall_time=WALL) == RateLimitObservation(
        "anthropic", NOW, requests_limit=1000, requests_remaining=999, requests_reset_at=NOW + 59,
        tokens_limit=96000, tokens_remaining=95000, tokens_reset_at=NOW + 30, retry_after=4.0,
        input_tokens_limit=80000, input_tokens_remaining=80000, input_tokens_reset_at=NOW + 59,
        output_tokens_limit=16000, output_tokens_remaining=16000, output_tokens_reset_at=NOW + 60,
    )
    # Without the combined family: input and output tokens are budgets of their own (issue 33) ...
    del headers["anthropic-ratelimit-tokens-limit"], headers["anthropic-ratelimit-tokens-remaining"]
    del headers["anthropic-ratelimit-tokens-reset"]
    observation = parse_rate_limit_headers(headers, NOW, wall_time=WALL)
    assert observation is not None
    assert (observation.tokens_limit, observation.tokens_remaining) == (None, None)
    assert (observation.input_tokens_remaining, observation.output_tokens_remaining) == (80000, 16000)
    assert observation.reports_budget and observation.capacity_remains
    # ... and output tokens that ran out: a 429 then is no blip.
    headers["anthropic-ratelimit-output-tokens-remaining"] = "0"
    observation = parse_rate_limit_headers(headers, NOW, wall_time=WALL)
    assert observation is not None and observation.output_tokens_remaining == 0
    assert not observation.capacity_remains


def test_a_past_or_naive_rfc3339_reset() -> None:
    headers = {"anthropic-ratelimit-requests-remaining": "5",
               "anthropic-ratelimit-requests-reset": "2025-08-21T12:39:00"}  # no zone: UTC; in the past
    observation = parse_rate_limit_headers(headers, NOW, wall_time=WALL)
    assert observation is not None and observation.requests_reset_at == NOW


def test_openai_wins_over_anthropic_and_fields_stand_alone() -> None:
    headers = {"x-ratelimit-remaining-tokens": "7", "anthropic-ratelimit-requests-remaining": "3"}
    assert parse_rate_limit_headers(headers, NOW) == RateLimitObservation("openai", NOW, tokens_remaining=7)


def test_a_unix_time_where_a_duration_belongs() -> None:
    seconds = parse_rate_limit_headers({"x-ratelimit-reset-requests": str(int(WALL + 12))}, NOW,
                                       wall_time=WALL)
    millis = parse_rate_limit_headers({"x-ratelimit-reset-requests": str(int((WALL + 12) * 1000))}, NOW,
                                      wall_time=WALL)
    assert seconds is not None and seconds.requests_reset_at == NOW + 12
    assert millis is not None and millis.requests_reset_at == NOW + 12


def test_capacity_remains_needs_both_budgets_with_something_left() -> None:
    def observation(requests: int | None, tokens: int | None) -> RateLimitObservation:
        return RateLimitObservation("openai", NOW, requests_remaining=requests, tokens_remaining=tokens)

    assert observation(5, 100).capacity_remains
    assert not observation(0, 100).capacity_remains
    assert not observation(5, 0).capacity_remains
    assert not observation(5, None).capacity_remains  # an unreported budget may be the one that ran out
    assert observation(5, None).reports_budget


def test_no_rate_limit_headers_is_none() -> None:
    assert parse_rate_limit_headers({}, NOW) is None
    assert parse_rate_limit_headers({"content-type": "text/plain", "x-request-id": "abc"}, NOW) is None
    assert parse_rate_limit_headers({"x-ratelimit-remaining-requests": "many"}, NOW) is None


def test_rate_limit_headers_selects_lowercases_and_decodes() -> None:
    class Headers:  # httpx's Headers: items() of str pairs, any case
        def items(self) -> list[tuple[Any, Any]]:
            return [("X-RateLimit-Remaining-Requests", "5"), ("Retry-After", "2"), ("Date", "today"),
                    (b"retry-after-ms", b"2000"), ("anthropic-ratelimit-tokens-limit", "9"), ("x", 1), "junk"]

    assert rate_limit_headers(Headers()) == {
        "x-ratelimit-remaining-requests": "5", "retry-after": "2", "retry-after-ms": "2000",
        "anthropic-ratelimit-tokens-limit": "9",
    }
    assert rate_limit_headers(None) == {}
    assert rate_limit_headers({"a": "b"}) == {}

    class Broken:
        def items(self) -> Any:
            raise RuntimeError("no")

    assert rate_limit_headers(Broken()) == {}


NAMES = st.sampled_from([
    "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-requests-limit", "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset", "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-output-tokens-remaining", "retry-after", "retry-after-ms",
    "X-RATELIMIT-RESET-TOKENS",
])
VALUES = st.one_of(
    st.text(max_size=40),
    st.from_regex(r"\A[0-9.]{0,12}(h|m|s|ms|us|ns)?\Z"),
    st.from_regex(r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]{0,12}(Z|[+-][0-9]{2}:[0-9]{2})?\Z"),
    st.sampled_from(["Wed, 21 Oct 2015 07:28:00 GMT", "Mon, 99 Foo 99999 99:99:99 GMT", "9" * 400, "1e309"]),
)


@given(headers=st.dictionaries(NAMES, VALUES, max_size=8), now=st.floats(-1e9, 1e9),
       wall=st.one_of(st.none(), st.floats(-1e12, 1e12)))
def test_garbage_never_raises_and_what_is_read_is_sane(headers: dict[str, str], now: float,
                                                      wall: float | None) -> None:
    observation = parse_rate_limit_headers(headers, now, wall_time=wall)
    if observation is None:
        return
    assert observation.at == now
    for count in (observation.requests_limit, observation.requests_remaining, observation.tokens_limit,
                  observation.tokens_remaining):
        assert count is None or count >= 0
    for reset_at in (observation.requests_reset_at, observation.tokens_reset_at):
        assert reset_at is None or reset_at >= now
    assert observation.retry_after is None or observation.retry_after >= 0
