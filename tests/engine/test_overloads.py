"""A provider-wide overload (issue 33, point 2): Anthropic's 529 ``overloaded_error``, Gemini's 503
``UNAVAILABLE``.

It is a SERVER failure: retried with backoff (its Retry-After honoured by that item), never a
cooldown of our quota scope, never evidence for discovery's rate learning (neither a 429 nor an
answer that ends a storm), never counted by the circuit breaker. Checked on the classifier (SDK
class names, duck-typed), the quota core (pure) and the engine, on Trio's virtual clock.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from trio_batch_llm import (
    CircuitBreakerConfig,
    ErrorCategory,
    LLMCallPool,
    LLMCallStrategy,
    ProcessorConfig,
    ProviderError,
    RateLimitConfig,
    RetryConfig,
    RetryState,
    TokenUsage,
    process_prompts,
)
from trio_batch_llm._admission._core import QuotaCore
from trio_batch_llm._engine._classify import classify

from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio

NO_RAMP = RateLimitConfig(slow_start_seconds=0.0)


@pytest.fixture(scope="module", params=[pytest.param(trio_virtual_clock(), id="trio"),
                                        pytest.param("asyncio", id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


def _virtual(anyio_backend: Any) -> None:
    if anyio_backend == "asyncio":
        pytest.skip("its waits are seconds long: Trio's virtual clock only")


# -- the classifier: SDK exceptions by class name, duck-typed ----------------------------------------


def _sdk_error(name: str, **attrs: Any) -> Exception:
    klass = type(name, (Exception,), {})
    exc = klass(attrs.pop("message", "Overloaded"))
    for key, value in attrs.items():
        setattr(exc, key, value)
    return exc


@pytest.mark.parametrize("exc", [
    _sdk_error("OverloadedError", status_code=529),  # anthropic
    _sdk_error("OverloadedError"),  # the same class name, no status kept
    _sdk_error("ServiceUnavailableError"),  # anthropic's 503, litellm's
    _sdk_error("ServerError", code=503, status="UNAVAILABLE",  # google-genai, without its response
               message="503 UNAVAILABLE. {'error': {'code': 503, 'message': 'The model is overloaded.'}}"),
    _sdk_error("APIStatusError", status_code=529),
], ids=["anthropic-529", "anthropic-no-status", "service-unavailable", "genai-server-error", "529"])
def test_an_overload_is_a_server_failure(exc: Exception) -> None:
    verdict = classify(exc)
    assert verdict.category is ErrorCategory.SERVER
    assert verdict.retryable and verdict.unusable_because is None and verdict.stops_batch is None


def test_a_genai_client_error_keeps_its_status_from_code() -> None:
    exc = _sdk_error("ClientError", code=429, status="RESOURCE_EXHAUSTED", message="429 RESOURCE_EXHAUSTED.")
    assert classify(exc).category is ErrorCategory.RATE_LIMIT
    assert classify(exc).status_code == 429
    odd = _sdk_error("SomethingElse", code="insufficient_quota", message="no")  # a word, not a status
    assert classify(odd).status_code is None


# -- the quota core: an overload ends no storm --------------------------------------------------------


def _storm() -> tuple[QuotaCore, float]:
    """A scope whose calls were refused with no hint: the 429 at 0, then storm probes at 0, 1, 3, 7."""
    core = QuotaCore(concurrency=10, rate_limit=NO_RAMP)
    now = 0.0
    for _ in range(4):
        now = max(now, core.ready_at(0, now))
        core.release_rate_limited(core.try_admit_nowait(0, now), None, None, now)
    return core, max(now, core.ready_at(0, now))


def test_an_answer_ends_a_storm_and_an_overload_does_not() -> None:
    answered, probe = _storm()
    assert probe == 7.0
    answered.release(answered.try_admit_nowait(0, probe), None, probe + 0.2)
    assert answered.ready_at(0, probe + 0.2) <= probe + 0.2  # flowing again

    overloaded, probe = _storm()
    overloaded.release(overloaded.try_admit_nowait(0, probe), None, probe + 0.2, evidence=False)
    # Still probing, a storm gap on (7 + 4: the probe was spent and learnt nothing): no flow.
    assert overloaded.ready_at(0, probe + 0.2) == 11.0
    assert overloaded.refusals.evidence.run == 4  # the run of refusals goes on


def test_an_overload_neither_ends_a_run_of_refusals_nor_counts_as_noise() -> None:
    core = QuotaCore(concurrency=10, rate_limit=NO_RAMP)
    core.release_rate_limited(core.try_admit_nowait(0, 0.0), None, None, 0.0)
    assert core.refusals.evidence.run == 1
    now = max(0.0, core.ready_at(0, 0.0))
    core.release(core.try_admit_nowait(0, now), None, now + 0.1, evidence=False)
    assert (core.refusals.evidence.run, core.refusals.evidence.lone) == (1, 0)
    now = max(now + 0.1, core.ready_at(0, now + 0.1))
    core.release(core.try_admit_nowait(0, now), None, now + 0.1)  # an answer ends the run
    assert core.refusals.evidence.run == 0


# -- the engine --------------------------------------------------------------------------------------


class Overloaded(LLMCallStrategy[str]):
    """Its first ``overloads`` calls answer 529 overloaded_error (Retry-After 20 s); then it answers."""

    def __init__(self, overloads: int, retry_after: float | None = 20.0) -> None:
        self.overloads = overloads
        self.retry_after = retry_after
        self.calls: list[tuple[str, float]] = []

    async def execute(self, prompt: str, attempt: int, timeout: float | None,
                      state: RetryState | None = None) -> tuple[str, TokenUsage | None, Any]:
        self.calls.append((prompt, anyio.current_time()))
        await anyio.sleep(0.01)
        if len(self.calls) <= self.overloads:
            headers = {} if self.retry_after is None else {"retry-after": f"{self.retry_after:g}"}
            raise ProviderError("HTTP 529 (overloaded_error): Overloaded", category=ErrorCategory.SERVER,
                                status_code=529, retry_after=self.retry_after,
                                metadata={"rate_limit": headers})
        return f"answer {prompt}", {"input_tokens": 3, "output_tokens": 3, "total_tokens": 6}, None


async def test_an_overload_is_retried_after_its_retry_after_and_the_scope_never_cools_down(
    anyio_backend: Any,
) -> None:
    _virtual(anyio_backend)
    strategy = Overloaded(overloads=2)
    config = ProcessorConfig(concurrency=2,
                             retry=RetryConfig(initial_wait=1.0, max_attempts=5, jitter_seed=1))
    async with LLMCallPool(strategy, config=config) as pool:
        async with anyio.create_task_group() as tg:
            results: list[Any] = []

            async def one(prompt: str) -> None:
                results.append(await pool.submit_result(prompt))

            tg.start_soon(one, "a")
            await anyio.sleep(0.001)
            tg.start_soon(one, "b")
            await anyio.sleep(0.005)
            # "a" and "b" are both in calls that are overloaded; a third request goes at once.
            stats = pool.statistics().admission
            assert stats.cooldown_remaining == 0
        stats = pool.statistics().admission
    assert all(r.success for r in results)
    assert stats.cooldown_remaining == 0 and stats.rate_limits_reported == 0 and stats.pacing != "discovery"
    times = {p: [t for q, t in strategy.calls if q == p] for p in ("a", "b")}
    assert [len(t) for t in times.values()] == [2, 2]
    for first, second in times.values():
        assert second - first >= 20.0  # the overload's Retry-After, the item's own wait


async def test_overloads_do_not_trip_the_circuit_breaker(anyio_backend: Any) -> None:
    _virtual(anyio_backend)
    strategy = Overloaded(overloads=12, retry_after=None)
    config = ProcessorConfig(
        concurrency=4, circuit_breaker=CircuitBreakerConfig(threshold=2, probes=1),
        retry=RetryConfig(initial_wait=0.1, max_wait=0.5, max_attempts=10, jitter_seed=2))
    batch = await process_prompts(strategy, [f"p{i}" for i in range(4)], config=config)
    assert batch.termination.kind == "completed"
    assert all(r.success for r in batch.results)
    assert len(strategy.calls) == 16


async def test_an_overload_during_a_storm_does_not_end_it(anyio_backend: Any) -> None:
    """Refused with no hint (a storm: probes at 0, 1, 3, 7 s), then overloaded at a probe: the next
    call waits for the next probe (an answer would have ended the storm: it would go at once)."""
    _virtual(anyio_backend)

    class RefusedThenOverloaded(LLMCallStrategy[str]):
        def __init__(self) -> None:
            self.times: list[float] = []

        async def execute(self, prompt: str, attempt: int, timeout: float | None,
                          state: RetryState | None = None) -> tuple[str, TokenUsage | None, Any]:
            self.times.append(anyio.current_time())
            await anyio.lowlevel.checkpoint()
            if len(self.times) <= 4:
                raise ProviderError("HTTP 429", category=ErrorCategory.RATE_LIMIT, status_code=429)
            if len(self.times) == 5:
                raise ProviderError("HTTP 529 overloaded", category=ErrorCategory.SERVER, status_code=529)
            return "ok", None, None

    strategy = RefusedThenOverloaded()
    config = ProcessorConfig(concurrency=1, rate_limit=NO_RAMP,
                             retry=RetryConfig(initial_wait=0.1, max_wait=0.1, max_attempts=5, jitter_seed=1))
    async with LLMCallPool(strategy, config=config) as pool:
        result = await pool.submit_result("p")
    assert result.success
    start = strategy.times[0]
    gaps = [round(t - start, 3) for t in strategy.times]
    assert gaps[:5] == [0.0, 0.0, 1.0, 3.0, 7.0]
    assert gaps[5] == 11.0, gaps  # the next probe, not the overload's 0.1 s backoff
