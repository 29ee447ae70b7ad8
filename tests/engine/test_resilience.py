"""Retries, deadlines, guardrails. Exact times run on Trio's virtual clock; behaviour on both backends."""

from __future__ import annotations

import random
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_batch_llm import (
    AbortMode,
    CallableStrategy,
    ErrorCategory,
    FakeStrategy,
    GuardrailConfig,
    ItemDeadlineExceeded,
    LLMCallStrategy,
    ProcessorConfig,
    ProviderError,
    RetryConfig,
    RetryState,
    TokenUsage,
    process_prompts,
)

from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio

virtual = pytest.mark.parametrize("anyio_backend", [pytest.param(trio_virtual_clock(), id="trio-virtual")])


class Timed(LLMCallStrategy[str]):
    """Scripted per attempt: (seconds to take, outcome); records each attempt's start time."""

    def __init__(self, plan: list[tuple[float, Any]], default: tuple[float, Any] = (0.0, "ok")) -> None:
        self.plan = plan
        self.default = default
        self.starts: list[float] = []
        self.on_error_calls: list[tuple[int, str | None]] = []

    async def execute(
        self, prompt: str, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[str, TokenUsage | None, Any]:
        self.starts.append(anyio.current_time())
        took, outcome = self.plan[attempt - 1] if attempt <= len(self.plan) else self.default
        await anyio.sleep(took)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome, {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}, None

    async def on_error(self, exception: Exception, attempt: int, state: RetryState | None) -> None:
        assert state is not None
        state.set("model", f"bigger-{attempt}")
        self.on_error_calls.append((attempt, state.get("model")))
        await anyio.lowlevel.checkpoint()


def server_error(retry_after: float | None = None) -> ProviderError:
    return ProviderError("boom", category=ErrorCategory.SERVER, retry_after=retry_after)


def rate_limited(retry_after: float | None = 1.0) -> ProviderError:
    return ProviderError("429", category=ErrorCategory.RATE_LIMIT, retry_after=retry_after, status_code=429)


def since(strategy: Timed) -> list[float]:
    t0 = strategy.starts[0]
    return [t - t0 for t in strategy.starts]


@virtual
async def test_backoff_sequence_for_seeded_rng() -> None:
    strategy = Timed([(0.0, server_error())] * 3)
    retry = RetryConfig(max_attempts=4, initial_wait=1.0, max_wait=60.0, jitter_seed=5)
    batch = await process_prompts(strategy, ["p"], config=ProcessorConfig(retry=retry))
    assert batch.results[0].success and batch.results[0].attempts == 4
    rng = random.Random("5\x00item-0")
    expected = [rng.uniform(0, 1), rng.uniform(0, 2), rng.uniform(0, 4)]
    gaps = [b - a for a, b in zip(since(strategy), since(strategy)[1:], strict=False)]
    assert gaps == pytest.approx(expected, abs=1e-9)
    assert batch.results[0].timing.backoff == pytest.approx(sum(expected), abs=1e-9)


@virtual
async def test_retry_after_wins_over_smaller_backoff() -> None:
    strategy = Timed([(0.0, server_error(retry_after=7.0))])
    retry = RetryConfig(initial_wait=1.0, jitter=False)
    await process_prompts(strategy, ["p"], config=ProcessorConfig(retry=retry))
    assert since(strategy) == [0.0, 7.0]


@virtual
async def test_25_rate_limits_do_not_exhaust_max_attempts() -> None:
    strategy = Timed([(0.0, rate_limited(1.0))] * 25)
    cfg = ProcessorConfig(retry=RetryConfig(max_attempts=3, max_rate_limit_retries=30))
    batch = await process_prompts(strategy, ["p"], config=cfg)
    (result,) = batch.results
    assert result.success and result.attempts == 26
    # Each 429's Retry-After of 1 s became the scope's cooldown before the next attempt.
    assert since(strategy)[-1] == pytest.approx(25.0)
    assert result.timing.cooldown == pytest.approx(25.0)


@virtual
async def test_rate_limit_budget_is_separate_and_finite() -> None:
    strategy = Timed([(0.0, rate_limited(0.5))] * 10)
    cfg = ProcessorConfig(retry=RetryConfig(max_attempts=3, max_rate_limit_retries=4))
    batch = await process_prompts(strategy, ["p"], config=cfg)
    (result,) = batch.results
    assert not result.success and result.attempts == 5
    assert result.error_category is ErrorCategory.RATE_LIMIT


async def test_auth_error_not_retried() -> None:
    fake = FakeStrategy(script={"p": [ProviderError("no key", category=ErrorCategory.AUTHENTICATION)]})
    batch = await process_prompts(fake, ["p"])
    (result,) = batch.results
    assert (result.success, result.attempts, result.error_category) == (
        False,
        1,
        ErrorCategory.AUTHENTICATION,
    )
    assert fake.calls == [("p", 1)]


@pytest.mark.parametrize(
    "category",
    [
        ErrorCategory.INVALID_REQUEST,
        ErrorCategory.CONTEXT_LENGTH,
        ErrorCategory.CONTENT_POLICY,
        ErrorCategory.INSUFFICIENT_BALANCE,
    ],
)
async def test_terminal_categories_fail_at_once(category: ErrorCategory) -> None:
    fake = FakeStrategy(script={"p": [ProviderError("x", category=category)]})
    (result,) = (await process_prompts(fake, ["p"])).results
    assert (result.attempts, result.error_category) == (1, category)


@virtual
async def test_attempt_timeout_fires_exactly_and_is_retried() -> None:
    strategy = Timed([(100.0, "never")], default=(0.5, "second"))
    cfg = ProcessorConfig(attempt_timeout=3.0, retry=RetryConfig(initial_wait=1.0, jitter=False))
    batch = await process_prompts(strategy, ["p"], config=cfg)
    (result,) = batch.results
    assert (result.success, result.output, result.attempts) == (True, "second", 2)
    assert since(strategy) == [0.0, 4.0]
    assert result.timing.execution == pytest.approx(3.5)


@virtual
async def test_item_deadline_cuts_at_exactly_the_deadline() -> None:
    strategy = Timed([(4.0, server_error())] * 10)
    cfg = ProcessorConfig(
        retry=RetryConfig(max_attempts=10, initial_wait=0.0, max_wait=0.0),
        guardrails=GuardrailConfig(total_timeout_per_item=10.0),
    )
    t0 = anyio.current_time()
    batch = await process_prompts(strategy, ["p"], config=cfg)
    assert anyio.current_time() - t0 == pytest.approx(10.0)
    (result,) = batch.results
    assert result.error_category is ErrorCategory.DEADLINE
    assert isinstance(result.exception, ItemDeadlineExceeded)
    assert isinstance(result.exception, TimeoutError)
    assert result.attempts == 3
    assert result.timing.total == pytest.approx(10.0)


@virtual
async def test_retry_that_cannot_fit_fails_early() -> None:
    strategy = Timed([(1.0, server_error())] * 10)
    cfg = ProcessorConfig(
        retry=RetryConfig(max_attempts=10, initial_wait=6.0, max_wait=6.0, jitter=False),
        guardrails=GuardrailConfig(total_timeout_per_item=10.0),
    )
    t0 = anyio.current_time()
    batch = await process_prompts(strategy, ["p"], config=cfg)
    # attempt 1: 0–1, wait 6, attempt 2: 7–8; a further wait of 6 would pass 10 s.
    assert anyio.current_time() - t0 == pytest.approx(8.0)
    (result,) = batch.results
    assert result.error_category is ErrorCategory.DEADLINE and result.attempts == 2


@virtual
async def test_batch_deadline_returns_a_result_for_every_item() -> None:
    fake = FakeStrategy(latency=3.0)
    cfg = ProcessorConfig(concurrency=4, guardrails=GuardrailConfig(batch_timeout=5.0))
    t0 = anyio.current_time()
    batch = await process_prompts(fake, [f"p{i}" for i in range(20)], config=cfg)
    assert anyio.current_time() - t0 == pytest.approx(5.0)
    assert batch.termination.kind == "batch_deadline"
    assert batch.total_items == 20
    by_category: dict[Any, int] = {}
    for r in batch.results:
        key = "ok" if r.success else r.error_category
        by_category[key] = by_category.get(key, 0) + 1
    assert by_category == {"ok": 4, ErrorCategory.DEADLINE: 4, ErrorCategory.NOT_EXECUTED: 12}


@pytest.mark.parametrize(
    ("mode", "in_flight_category"),
    [(AbortMode.DRAIN_ACTIVE, None), (AbortMode.CANCEL_ACTIVE, ErrorCategory.ABORTED)],
)
@virtual
async def test_abort_modes(mode: AbortMode, in_flight_category: ErrorCategory | None) -> None:
    async def fn(prompt: str) -> str:
        # p1 fails at 1 s, while p0 (started with it) is still in flight until 2 s.
        await anyio.sleep(1.0 if prompt == "p1" else 2.0)
        if prompt == "p1":
            raise ProviderError("401", category=ErrorCategory.AUTHENTICATION)
        return prompt

    cfg = ProcessorConfig(
        concurrency=2,
        guardrails=GuardrailConfig(
            abort_on_error_categories=frozenset({ErrorCategory.AUTHENTICATION}), abort_mode=mode
        ),
    )
    batch = await process_prompts(CallableStrategy(fn), [f"p{i}" for i in range(10)], config=cfg)
    assert batch.termination.kind == "aborted"
    assert "authentication" in (batch.termination.reason or "")
    by_id = batch.by_id()
    assert by_id["item-1"].error_category is ErrorCategory.AUTHENTICATION
    first = by_id["item-0"]  # in flight when the abort came (both took 2 s)
    if in_flight_category is None:
        assert first.success
    else:
        assert first.error_category is in_flight_category
    rest = [by_id[f"item-{i}"] for i in range(2, 10)]
    assert all(r.error_category is ErrorCategory.NOT_EXECUTED for r in rest)
    assert batch.total_items == 10


async def test_token_budget_soft_cap() -> None:
    fake = FakeStrategy(tokens=(10, 5))
    cfg = ProcessorConfig(concurrency=1, guardrails=GuardrailConfig(max_total_tokens=45))
    batch = await process_prompts(fake, [f"p{i}" for i in range(10)], config=cfg)
    assert batch.termination.kind == "budget_exhausted"
    assert batch.succeeded == 3
    assert sum(1 for r in batch.results if r.error_category is ErrorCategory.BUDGET) == 7


async def test_cost_budget() -> None:
    fake = FakeStrategy(tokens=(10, 5))
    guard = GuardrailConfig(max_total_cost=0.3, cost_function=lambda u: u.get("total_tokens", 0) * 0.01)
    batch = await process_prompts(
        fake, [f"p{i}" for i in range(10)], config=ProcessorConfig(concurrency=1, guardrails=guard)
    )
    assert batch.termination.kind == "budget_exhausted" and batch.succeeded == 2


async def test_on_error_runs_before_each_retry_with_state() -> None:
    strategy = Timed([(0.0, server_error()), (0.0, server_error())])
    cfg = ProcessorConfig(retry=RetryConfig(initial_wait=0.0, max_wait=0.0))
    batch = await process_prompts(strategy, ["p"], config=cfg)
    assert batch.results[0].success
    assert strategy.on_error_calls == [(1, "bigger-1"), (2, "bigger-2")]


async def test_failed_billed_attempts_count_tokens() -> None:
    billed = ProviderError(
        "bad json",
        category=ErrorCategory.PARSE,
        token_usage={"input_tokens": 7, "output_tokens": 3, "total_tokens": 10},
    )
    fake = FakeStrategy(script={"p": [billed, "fixed"]}, tokens=(1, 1))
    cfg = ProcessorConfig(retry=RetryConfig(initial_wait=0.0, max_wait=0.0))
    (result,) = (await process_prompts(fake, ["p"], config=cfg)).results
    assert result.success and result.token_usage == {
        "input_tokens": 8,
        "output_tokens": 4,
        "total_tokens": 12,
    }


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    scripts=st.lists(
        st.lists(st.sampled_from(["ok", "server", "rate", "auth", "timeout"]), min_size=1, max_size=8),
        min_size=1,
        max_size=12,
    ),
    max_attempts=st.integers(min_value=1, max_value=4),
    max_rl=st.integers(min_value=0, max_value=3),
)
async def test_attempts_never_exceed_budgets(
    scripts: list[list[str]], max_attempts: int, max_rl: int
) -> None:
    def outcome(kind: str) -> Any:
        return {
            "ok": "fine",
            "server": ProviderError("5xx", category=ErrorCategory.SERVER),
            "rate": ProviderError("429", category=ErrorCategory.RATE_LIMIT, retry_after=0.0),
            "auth": ProviderError("401", category=ErrorCategory.AUTHENTICATION),
            "timeout": ProviderError("slow", category=ErrorCategory.TIMEOUT),
        }[kind]

    script = {f"p{i}": [outcome(k) for k in kinds] for i, kinds in enumerate(scripts)}
    fake = FakeStrategy(script=script)
    cfg = ProcessorConfig(
        concurrency=3,
        retry=RetryConfig(
            max_attempts=max_attempts, max_rate_limit_retries=max_rl, initial_wait=0.0, max_wait=0.0
        ),
    )
    batch = await process_prompts(fake, list(script), config=cfg)
    assert sorted(r.item_id for r in batch.results) == sorted(f"item-{i}" for i in range(len(scripts)))
    for i, kinds in enumerate(scripts):
        result = batch.by_id()[f"item-{i}"]
        made = [k for p, k in fake.calls if p == f"p{i}"]
        assert len(made) == result.attempts
        used = [kinds[a - 1] if a <= len(kinds) else "ok" for a in made]
        assert sum(1 for k in used if k == "rate") <= max_rl + 1
        assert sum(1 for k in used if k in ("server", "timeout", "auth")) <= max_attempts
