"""Configuration records validate at construction, naming field and value; backoff math is exact."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_batch_llm import (
    ConfigurationError,
    ErrorCategory,
    GuardrailConfig,
    ProcessorConfig,
    RateLimitConfig,
    RetryConfig,
)


@pytest.mark.parametrize(
    ("factory", "field", "value"),
    [
        (lambda: ProcessorConfig(concurrency=0), "concurrency", 0),
        (lambda: ProcessorConfig(max_workers=-1), "max_workers", -1),
        (lambda: ProcessorConfig(concurrency=2, max_workers=3), "max_workers", 3),
        (lambda: ProcessorConfig(attempt_timeout=0), "attempt_timeout", 0),
        (lambda: ProcessorConfig(attempt_timeout=float("nan")), "attempt_timeout", None),
        (lambda: ProcessorConfig(max_requests_per_minute=-5), "max_requests_per_minute", -5),
        (lambda: ProcessorConfig(max_tokens_per_minute=0), "max_tokens_per_minute", 0),
        (lambda: ProcessorConfig(max_queue_size=-1), "max_queue_size", -1),
        (lambda: ProcessorConfig(concurrency=True), "concurrency", True),  # type: ignore[arg-type]
        (lambda: RetryConfig(max_attempts=0), "max_attempts", 0),
        (lambda: RetryConfig(initial_wait=5, max_wait=1), "max_wait", 1),
        (lambda: RetryConfig(exponential_base=0.5), "exponential_base", 0.5),
        (lambda: RateLimitConfig(slow_start_initial_fraction=0), "slow_start_initial_fraction", 0),
        (lambda: GuardrailConfig(batch_timeout=-1), "batch_timeout", -1),
        (lambda: GuardrailConfig(max_total_cost=1.0), "cost_function", None),
        (lambda: GuardrailConfig(abort_on_error_categories="rate_limit"),  # type: ignore[arg-type]
         "abort_on_error_categories", "rate_limit"),
    ],
)
def test_invalid_values_name_field_and_value(factory, field, value) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigurationError) as info:
        factory()
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}=")
    if value is not None:
        assert info.value.value == value
    assert isinstance(info.value, ValueError)


def test_defaults_and_workers() -> None:
    assert ProcessorConfig().workers == 5
    assert ProcessorConfig(concurrency=7).workers == 7
    assert ProcessorConfig(max_workers=3).workers == 3
    assert ProcessorConfig(concurrency=8, max_provider_concurrency=2).provider_concurrency == 2


def test_guardrail_categories_normalized() -> None:
    g = GuardrailConfig(abort_on_error_categories=["authentication"])  # type: ignore[list-item]
    assert g.abort_on_error_categories == frozenset({ErrorCategory.AUTHENTICATION})


def test_backoff_sequence_without_jitter() -> None:
    cfg = RetryConfig(initial_wait=1, max_wait=10, exponential_base=2, jitter=False)
    assert [cfg.backoff(n) for n in range(6)] == [1, 2, 4, 8, 10, 10]


def test_backoff_full_jitter_seeded() -> None:
    cfg = RetryConfig(initial_wait=1, max_wait=60)
    rng, expected_rng = random.Random(42), random.Random(42)
    got = [cfg.backoff(n, rng) for n in range(5)]
    assert got == [expected_rng.uniform(0, min(60, 2**n)) for n in range(5)]


def test_retry_after_wins_when_larger() -> None:
    cfg = RetryConfig(initial_wait=1, jitter=False)
    assert cfg.wait_before_retry(0, 7.5) == 7.5
    assert cfg.wait_before_retry(3, 2.0) == 8.0
    assert RetryConfig(jitter=False, respect_retry_after=False).wait_before_retry(0, 30) == 1.0


@given(st.integers(min_value=0, max_value=10_000), st.integers(min_value=0, max_value=2**32))
def test_backoff_within_bounds(n: int, seed: int) -> None:
    cfg = RetryConfig(initial_wait=0.5, max_wait=30)
    wait = cfg.backoff(n, random.Random(seed))
    assert 0 <= wait <= min(30, 0.5 * 2**min(n, 64))
