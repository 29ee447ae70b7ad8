"""Bounded throttling, out loud (issue 32, point 3).

An endpoint that answers every call 429 must end every item ``rate_limit`` within
``RetryConfig.max_rate_limit_wait`` on every surface, its error saying how long it
waited and after how many 429s; the scope logs its first cooldown at INFO with the
cause and one WARNING per stall; progress shows the scope throttled with nothing in
flight; a deadline that cut a throttled item says so. Time is virtual throughout:
Trio's ``MockClock`` and, for asyncio, the autojumping loop of :mod:`.test_fault_storm`.
"""

from __future__ import annotations

import logging
import math
from functools import partial
from typing import Any

import anyio
import pytest
import trio.testing

from trio_batch_llm import (
    ConfigurationError,
    ErrorCategory,
    GuardrailConfig,
    LLMCallPool,
    LLMCallStrategy,
    ProcessorConfig,
    ProviderError,
    RateLimitConfig,
    RetryConfig,
    RetryState,
    TokenUsage,
    call_result,
    process_prompts,
)
from trio_batch_llm._admission import QuotaScope
from trio_batch_llm._admission._throttle import ThrottleWatch
from trio_batch_llm._observe._progress import ProgressTracker
from trio_batch_llm._observe._progress_line import fit_progress_line, format_progress_line
from trio_batch_llm._observe._snapshot import Progress, ProgressSnapshot
from trio_batch_llm._strategies.openai._compatible import OpenAICompatibleStrategy
from trio_batch_llm._values._quota_reports import QuotaScopeStatistics
from trio_batch_llm.mock import MockServerConfig, serve_mock

from ..e2e.test_fault_storm import AutojumpEventLoop
from ..e2e.test_surfaces_retry import SURFACES

pytestmark = pytest.mark.anyio


def virtual_backends(threshold: float = 0.0) -> list[Any]:
    """Both backends on virtual time: Trio's MockClock, asyncio's autojumping loop (fresh clocks)."""
    return [
        pytest.param(("asyncio", {"loop_factory": partial(AutojumpEventLoop, max(threshold, 0.0005))}),
                     id="asyncio-virtual"),
        pytest.param(("trio", {"clock": trio.testing.MockClock(autojump_threshold=threshold)}),
                     id="trio-virtual"),
    ]


@pytest.fixture(scope="module", params=virtual_backends())
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


class Always429(LLMCallStrategy[str]):
    """Every call takes ``latency`` seconds and is refused: a 429, with ``retry_after`` or without."""

    def __init__(self, retry_after: float | None = None, latency: float = 0.1) -> None:
        self.retry_after = retry_after
        self.latency = latency
        self.calls = 0
        self.seen: list[tuple[int, ErrorCategory | None]] = []
        self.refuse = True  # False: the provider is back and answers

    async def execute(
        self, prompt: str, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[str, TokenUsage | None, Any]:
        self.calls += 1
        self.seen.append((attempt, state.last_category if state is not None else None))
        await anyio.sleep(self.latency)
        if not self.refuse:
            return f"ok: {prompt}", None, None
        raise ProviderError("429 Too Many Requests", category=ErrorCategory.RATE_LIMIT,
                            retry_after=self.retry_after)


# --- the knob ----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1.0, math.nan, math.inf, "600", True])
def test_max_rate_limit_wait_is_checked(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="max_rate_limit_wait") as caught:
        RetryConfig(max_rate_limit_wait=value)
    assert repr(value) in str(caught.value) or str(value) in str(caught.value)


def test_max_rate_limit_wait_defaults_to_ten_minutes_and_none_is_unbounded() -> None:
    assert RetryConfig().max_rate_limit_wait == 600.0
    assert RetryConfig(max_rate_limit_wait=None).max_rate_limit_wait is None
    assert RetryConfig(max_rate_limit_wait=0.5).max_rate_limit_wait == 0.5


# --- an always-429 endpoint ends every item rate_limit within the bound -------------------------


async def test_call_result_against_an_always_429_endpoint_ends_rate_limit_within_the_default_bound() -> None:
    """The issue's case: no Retry-After, default config. It used to run past 800 s of virtual time."""
    strategy = Always429()
    began = anyio.current_time()
    result = await call_result(strategy, "p")
    took = anyio.current_time() - began
    assert result.error_category is ErrorCategory.RATE_LIMIT
    assert result.timing.execution == pytest.approx(result.attempts * strategy.latency)
    assert result.error is not None
    assert isinstance(result.exception, ProviderError)  # the last 429, as the provider said it
    assert result.attempts == strategy.calls <= 21
    # Whichever budget runs out first ends it. Discovery's storm probes meet the wall clock's next
    # minute (issue 32, point 2), so how many fit in 600 s depends on when in the minute the test
    # runs: the bound (600 s, then the calls), or the 20 rate-limit retries a little before it.
    if result.attempts < 21:
        assert took == pytest.approx(600.0 + result.attempts * strategy.latency)  # the bound + the calls
        assert "waited 600.0 s on 429s" in result.error and f"({result.attempts} 429s)" in result.error
        assert "max_rate_limit_wait=600 s" in result.error
    else:
        assert took <= 600.0 + result.attempts * strategy.latency + 1e-6


@pytest.mark.parametrize("retry_after", [None, 1.0])
async def test_every_surface_ends_rate_limit_within_the_bound(retry_after: float | None) -> None:
    bound = 45.0
    cfg = ProcessorConfig(retry=RetryConfig(max_rate_limit_retries=10_000, max_rate_limit_wait=bound))
    strategies = [Always429(retry_after) for _ in SURFACES]
    outcomes: dict[str, tuple[Any, ...]] = {}

    async def run(surface: Any, strategy: Always429) -> None:
        began = anyio.current_time()
        result = await surface(strategy, cfg)
        waited = anyio.current_time() - began - strategy.calls * strategy.latency  # time not in a call
        outcomes[surface.__name__] = (result.error_category, waited, result.error)

    async with anyio.create_task_group() as tg:
        for surface, strategy in zip(SURFACES, strategies, strict=True):
            tg.start_soon(run, surface, strategy)
    for name, (category, took, error) in outcomes.items():
        assert category is ErrorCategory.RATE_LIMIT, (name, error)
        assert took <= bound + 1e-6, (name, took)
        assert "max_rate_limit_wait=45 s" in error and "429s" in error, (name, error)
    assert all(strategy.calls >= 2 for strategy in strategies)  # retried, not failed at the first 429


async def test_max_rate_limit_retries_still_ends_an_item_first_when_it_comes_first() -> None:
    strategy = Always429(retry_after=1.0)
    cfg = ProcessorConfig(retry=RetryConfig(max_rate_limit_retries=2, max_rate_limit_wait=600.0))
    result = await call_result(strategy, "p", config=cfg)
    assert (result.error_category, result.attempts) == (ErrorCategory.RATE_LIMIT, 3)
    assert result.error == "ProviderError: 429 Too Many Requests"  # the retry budget's verdict, as before


async def test_none_leaves_the_wait_unbounded() -> None:
    strategy = Always429(retry_after=100.0)
    cfg = ProcessorConfig(retry=RetryConfig(max_rate_limit_retries=12, max_rate_limit_wait=None),
                          rate_limit=RateLimitConfig(slow_start_seconds=0.0))
    began = anyio.current_time()
    result = await call_result(strategy, "p", config=cfg)
    assert result.error_category is ErrorCategory.RATE_LIMIT
    assert anyio.current_time() - began > 1000.0  # 12 cooldowns of 100 s: no bound cut them
    assert result.attempts == 13


async def test_a_cooldown_that_would_outlast_the_bound_fails_the_item_at_once() -> None:
    strategy = Always429(retry_after=3600.0)
    cfg = ProcessorConfig(retry=RetryConfig(max_rate_limit_wait=600.0))
    began = anyio.current_time()
    result = await call_result(strategy, "p", config=cfg)
    assert anyio.current_time() - began == pytest.approx(strategy.latency)
    assert (result.error_category, result.attempts) == (ErrorCategory.RATE_LIMIT, 1)
    assert result.error is not None and "the scope's cooldown has 3.6e+03 s to run" in result.error


async def test_items_queued_behind_a_refusing_scope_give_up_within_the_bound() -> None:
    """Items that never got a call in (queued while the scope refused) end rate_limit too, each within
    the bound of when it began to wait throttled; none waits longer than the bound."""
    bound = 120.0
    strategy = Always429(retry_after=None)
    cfg = ProcessorConfig(concurrency=4, retry=RetryConfig(max_rate_limit_retries=10_000,
                                                           max_rate_limit_wait=bound))
    began = anyio.current_time()
    batch = await process_prompts(strategy, [f"p{n}" for n in range(12)], config=cfg)
    took = anyio.current_time() - began
    assert {r.error_category for r in batch.results} == {ErrorCategory.RATE_LIMIT}
    not_tried = 0
    for result in batch.results:
        assert result.error is not None and "max_rate_limit_wait=120 s" in result.error
        assert result.timing.total - result.timing.execution <= bound + 1e-6, result
        if "not tried" in result.error:
            # Behind a streak already longer than the bound, and not first in line: at once.
            not_tried += 1
            assert "its scope has refused every call for" in result.error
            assert result.timing.total == pytest.approx(0.0, abs=1e-6) and result.attempts == 0
            continue
        waited = float(result.error.split("waited ")[1].split(" s")[0])
        assert waited <= bound + 1e-6, result.error
    # Three waves of four would take three bounds; the first wave's bound, then one probe's, at most.
    assert not_tried >= 6, [r.error for r in batch.results]
    assert took <= 2 * bound + 1.0, took


async def test_a_long_lived_pool_still_probes_a_scope_that_refused_for_longer_than_the_bound() -> None:
    """The first in line behind a long streak is the probe: when the provider comes back, it gets in."""
    bound = 30.0
    strategy = Always429(retry_after=None)
    cfg = ProcessorConfig(concurrency=4, retry=RetryConfig(max_rate_limit_retries=10_000,
                                                           max_rate_limit_wait=bound))
    async with LLMCallPool(strategy, config=cfg) as pool:
        first = await pool.submit_result("a")
        assert first.error_category is ErrorCategory.RATE_LIMIT
        strategy.refuse = False  # the provider comes back
        later = await pool.submit_result("b")
    assert later.success, later.error


@pytest.mark.parametrize("anyio_backend", virtual_backends(threshold=0.01))
async def test_an_always_429_mock_endpoint_ends_every_item_rate_limit_within_the_bound() -> None:
    """Over HTTP: the bundled mock refuses every call (429, no Retry-After, no rate-limit headers)."""
    bound = 90.0
    cfg = ProcessorConfig(concurrency=4, retry=RetryConfig(max_rate_limit_retries=10_000,
                                                           max_rate_limit_wait=bound))
    async with serve_mock(MockServerConfig(rate_limit_rate=1.0, retry_after=None, seed=3)) as server:
        strategy = OpenAICompatibleStrategy("m", base_url=server.base_url, api_key=None)
        began = anyio.current_time()
        batch = await process_prompts(strategy, [f"p{n}" for n in range(8)], config=cfg)
        took = anyio.current_time() - began
        refused = server.stats.rate_limited
    assert {r.error_category for r in batch.results} == {ErrorCategory.RATE_LIMIT}
    assert refused >= 8
    assert took <= 2 * bound + 1.0, took  # two waves of four: each item within its bound
    for result in batch.results:
        assert result.timing.total - result.timing.execution <= bound + 1e-6, result
        assert result.error is not None and ("waited" in result.error or "not tried" in result.error)
        assert "max_rate_limit_wait=90 s" in result.error


# --- the logs ----------------------------------------------------------------------------------


class Seen:
    """The records of one logger at DEBUG and up, kept for the test (caplog would do; this keeps levels)."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.DEBUG, logger="trio_batch_llm")
        self._caplog = caplog

    def of(self, level: int) -> list[logging.LogRecord]:
        records = self._caplog.records
        return [r for r in records if r.name == "trio_batch_llm.admission" and r.levelno == level]


@pytest.fixture
def seen(caplog: pytest.LogCaptureFixture) -> Seen:
    return Seen(caplog)


def cooling_scope(name: str = "'demo'", cooldown: float = 30.0) -> QuotaScope:
    return QuotaScope(concurrency=2, name=name, rate_limit=RateLimitConfig(
        learn_limits=False, cooldown_seconds=cooldown, max_cooldown_seconds=cooldown, slow_start_seconds=0.0))


async def refuse(scope: QuotaScope, retry_after: float | None = None) -> None:
    admission = await scope.admit()
    await anyio.sleep(0.1)
    admission.release_rate_limited(retry_after, 0)


async def test_the_first_cooldown_is_info_with_its_cause_and_later_ones_debug(seen: Seen) -> None:
    scope = cooling_scope()
    await refuse(scope)  # no Retry-After: the backoff chosen, 30 s
    await refuse(scope, retry_after=12.0)
    await refuse(scope)
    (info,) = seen.of(logging.INFO)
    assert info.getMessage() == (
        "quota scope 'demo': rate limited (429 without Retry-After: backoff of 30 s chosen); no call starts"
        " there for 30 s (cooldown); its later cooldowns are logged at DEBUG")
    assert (info.scope, info.status, info.retry_after, info.wait) == ("'demo'", 429, None, 30.0)  # type: ignore[attr-defined]
    later = [r for r in seen.of(logging.DEBUG) if "cooldown" in r.getMessage()]
    assert [r.retry_after for r in later] == [12.0, None]  # type: ignore[attr-defined]
    assert "Retry-After 12 s" in later[0].getMessage()


async def test_a_first_429_that_starts_no_cooldown_is_info_too(seen: Seen) -> None:
    scope = QuotaScope(concurrency=2, name="'learning'", rate_limit=RateLimitConfig())
    admission = await scope.admit()
    admission.release_rate_limited(None, 0)  # learning on, no Retry-After: no scope-wide cooldown
    admission = await scope.admit()
    admission.release_rate_limited(None, 0)
    info = [r for r in seen.of(logging.INFO)
            if any(word in r.getMessage() for word in ("first rate limit", "cooldown", "lowered"))]
    assert len(info) == 1, [r.getMessage() for r in seen.of(logging.INFO)]
    assert "'learning'" in info[0].getMessage() and "429" in info[0].getMessage()


async def test_one_stall_warning_per_stall_and_again_after_calls_flowed(seen: Seen) -> None:
    scope = cooling_scope(cooldown=25.0)
    began = anyio.current_time()
    while anyio.current_time() - began < 200.0:  # 200 s of nothing but 429s: one stall
        await refuse(scope)
    (warning,) = seen.of(logging.WARNING)
    assert warning.getMessage().startswith("quota scope 'demo': the provider has refused every call for ")
    assert 60.0 <= warning.stalled < 60.0 + 25.0 + 1.0  # type: ignore[attr-defined]
    assert warning.refusals >= 3  # type: ignore[attr-defined]
    ok = await scope.admit()
    ok.release(0)  # calls flow again: the streak is over
    assert scope.statistics().refusing_for == 0.0
    await refuse(scope)
    assert len(seen.of(logging.WARNING)) == 1  # a new streak, not yet a stall
    began = anyio.current_time()
    while anyio.current_time() - began < 100.0:
        await refuse(scope)
    assert len(seen.of(logging.WARNING)) == 2


async def test_a_cut_short_call_does_not_end_the_streak() -> None:
    scope = cooling_scope(cooldown=1.0)
    await refuse(scope)
    await anyio.sleep(5.0)
    admission = await scope.admit()
    admission.release(None, answered=False)  # cut short: it says nothing about the provider
    assert scope.statistics().refusing_for == pytest.approx(5.0)  # from the 429's answer on
    answered = await scope.admit()
    answered.release(0)
    assert scope.statistics().refusing_for == 0.0


async def test_the_stall_warning_comes_while_a_waiter_waits_on_a_long_cooldown(seen: Seen) -> None:
    """Nothing is admitted for an hour (Retry-After 3600 s); the waiter at the head of the queue is the
    one that notices the minute, so the warning comes at 60 s, not when the cooldown ends."""
    scope = cooling_scope()
    await refuse(scope, retry_after=3600.0)
    warned_at: list[float] = []

    class Stamp(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno == logging.WARNING:
                warned_at.append(anyio.current_time())

    stamp = Stamp()
    logging.getLogger("trio_batch_llm.admission").addHandler(stamp)
    began = anyio.current_time()
    try:
        with anyio.move_on_after(120.0):
            await scope.admit()
    finally:
        logging.getLogger("trio_batch_llm.admission").removeHandler(stamp)
    assert len(warned_at) == 1
    assert warned_at[0] - began == pytest.approx(60.0)  # a minute after the 429 answered
    stats = scope.statistics()
    assert stats.throttled and stats.in_flight == 0


async def test_a_call_result_against_an_always_429_endpoint_logs_info_then_one_warning(seen: Seen) -> None:
    await call_result(Always429(), "p")
    infos = [r.getMessage() for r in seen.of(logging.INFO)]
    assert any("first rate limit (429 without Retry-After)" in m for m in infos), infos
    assert len(seen.of(logging.WARNING)) == 1


# --- progress ----------------------------------------------------------------------------------


def stats(*, in_flight: int, waiting: int, cooldown: float = 0.0, refusing: float = 0.0
          ) -> QuotaScopeStatistics:
    return QuotaScopeStatistics(
        in_flight=in_flight, waiting=waiting, concurrency_bound=16, concurrency_limit=0,
        requests_per_minute=None, requests_in_window=None, tokens_per_minute=None,
        tokens_reserved_in_window=None, tokens_available=None, cooldown_remaining=cooldown,
        admitted_total=40, rate_limits_reported=40, closed=False, refusing_for=refusing)


def test_progress_counts_calls_not_items_and_says_throttled() -> None:
    scopes = [stats(in_flight=0, waiting=16, cooldown=42.0, refusing=75.0)]
    tracker = ProgressTracker(start=0.0, total=100, scopes=lambda: scopes)
    for _ in range(16):
        tracker.item_started()
    snap = tracker.snapshot(90.0)
    assert (snap.in_flight, snap.waiting, snap.throttled) == (0, 16, "cooling down 0:42")
    line = format_progress_line(snap, bar_width=0)
    assert line == ("0/100 (0%) | 0 failed | 0 in flight | 16 waiting | throttled: cooling down 0:42"
                    " | 0.0 items/s | ETA --:-- | 0 tokens")
    scopes[0] = stats(in_flight=0, waiting=16, refusing=75.0)
    assert tracker.snapshot(91.0).throttled == "every call refused for 1:15"
    scopes[0] = stats(in_flight=3, waiting=13, refusing=2.0)  # a lone 429 a moment ago: no news
    snap = tracker.snapshot(92.0)
    assert (snap.in_flight, snap.waiting, snap.throttled) == (3, 13, "")
    assert "throttled" not in format_progress_line(snap)


def test_progress_without_scopes_counts_started_items_as_before() -> None:
    tracker = ProgressTracker(start=0.0, total=10)
    tracker.item_started()
    snap = tracker.snapshot(1.0)
    assert (snap.in_flight, snap.waiting, snap.throttled) == (1, 0, "")
    assert format_progress_line(snap, bar_width=0) == (
        "0/10 (0%) | 0 failed | 1 in flight | 0.0 items/s | ETA --:-- | 0 tokens")


class Snapshots(Progress):
    def __init__(self) -> None:
        self.seen: list[ProgressSnapshot] = []

    def update(self, snapshot: ProgressSnapshot) -> None:
        self.seen.append(snapshot)


async def test_a_batch_held_by_a_cooldown_shows_nothing_in_flight_and_throttled() -> None:
    progress = Snapshots()
    strategy = Always429(retry_after=100.0)
    cfg = ProcessorConfig(concurrency=4, progress_interval=5.0,
                          retry=RetryConfig(max_rate_limit_retries=1, max_rate_limit_wait=None),
                          rate_limit=RateLimitConfig(slow_start_seconds=0.0))
    batch = await process_prompts(strategy, [f"p{n}" for n in range(4)], config=cfg, progress=progress)
    assert batch.failed == 4
    during = [s for s in progress.seen if s.throttled.startswith("cooling down")]
    assert during, progress.seen
    assert all(s.in_flight == 0 and s.waiting == 4 - s.completed for s in during)  # nobody in a call
    assert "| 0 in flight | 4 waiting | throttled: cooling down 1:36 |" in format_progress_line(during[0])


# --- a deadline that cut a throttled item says so -------------------------------------------------


async def test_a_batch_deadline_that_cut_throttled_items_says_so() -> None:
    strategy = Always429(retry_after=None)
    cfg = ProcessorConfig(concurrency=4, guardrails=GuardrailConfig(batch_timeout=30.0),
                          retry=RetryConfig(max_rate_limit_retries=10_000))
    batch = await process_prompts(strategy, [f"p{n}" for n in range(4)], config=cfg)
    assert {r.error_category for r in batch.results} == {ErrorCategory.DEADLINE}
    for result in batch.results:
        assert result.error is not None and "throttled by 429s" in result.error, result.error
        throttled = float(result.error.split("after ")[-1].split(" s throttled")[0])
        assert 25.0 < throttled <= 30.0, result.error


async def test_an_item_deadline_that_cut_a_throttled_item_says_so() -> None:
    strategy = Always429(retry_after=None)
    cfg = ProcessorConfig(retry=RetryConfig(max_rate_limit_retries=10_000),
                          guardrails=GuardrailConfig(total_timeout_per_item=20.0))
    result = await call_result(strategy, "p", config=cfg)
    assert result.error_category is ErrorCategory.DEADLINE
    assert result.error is not None and "s throttled by 429s" in result.error, result.error


async def test_a_deadline_that_cut_an_unthrottled_item_says_nothing_of_429s() -> None:
    async def slow(prompt: str) -> str:
        await anyio.sleep(100.0)
        return prompt

    from trio_batch_llm import CallableStrategy

    cfg = ProcessorConfig(guardrails=GuardrailConfig(batch_timeout=30.0))
    batch = await process_prompts(CallableStrategy(slow), ["a"], config=cfg)
    (result,) = batch.results
    assert result.error_category is ErrorCategory.DEADLINE
    assert result.error is not None and "429" not in result.error


def test_a_narrow_line_keeps_the_throttled_note_longest() -> None:
    snap = ProgressSnapshot(completed=10, failed=1, in_flight=0, total=100, waiting=16, tokens_total=12_345,
                            throttled="every call refused for 1:15")
    line = fit_progress_line(snap, 80)
    assert "throttled: every call refused for 1:15" in line and len(line) <= 79
    assert "tokens" not in line  # the least useful parts went first


def test_the_watch_warns_and_wakes_once_per_streak() -> None:
    watch = ThrottleWatch()
    assert watch.check_at() == math.inf and watch.due(5.0) == (False, False)
    assert watch.refused(10.0) is True
    assert watch.refused(11.0) is False  # the scope's first 429 is logged once, ever
    watch.shortest_budget = 30.0
    assert watch.check_at() == 40.0
    assert watch.due(39.0) == (False, False)
    assert watch.due(40.0) == (False, True)
    assert watch.check_at() == 70.0
    assert watch.due(70.0) == (True, False)
    assert watch.due(500.0) == (False, False) and watch.check_at() == math.inf
    assert watch.refusing_for(100.0) == 90.0
    watch.refused(200.0)  # still the same streak: nothing new
    assert watch.due(300.0) == (False, False)
    watch.answered()
    assert watch.refusing_for(300.0) == 0.0
    watch.refused(400.0)
    assert watch.due(460.0) == (True, True)  # a new streak warns (and wakes) again
    watch.answered()
    watch.joined(500.0)  # a cooldown joined from another process: throttled, not a 429 of ours
    assert (watch.refusing_since, watch.rate_limits) == (500.0, 4)
