"""A stop keeps items that have not started their call from starting it.

``request_stop()`` (Ctrl+C), a spent budget, an abort that drains: "nothing new starts, the calls in
flight finish". An item a worker has taken but that still waits for an RPM unit (its quota scope's
admission wait), at the circuit breaker's gate, or in its retry backoff has no call in flight: the stop
ends it at once (``NOT_EXECUTED`` if it never called, ``ABORTED`` before a retry), with the stop's
``stop_reason``, and the batch ends when the calls in flight have finished, not a rate window later.
On Trio the clock is virtual; on asyncio the times are small and real.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import sniffio

from trio_batch_llm import (
    ErrorCategory,
    GuardrailConfig,
    LLMCallStrategy,
    LLMWorkItem,
    ParallelBatchProcessor,
    ProcessorConfig,
    ProviderError,
    RetryConfig,
    RetryState,
    StopReason,
    TokenUsage,
    WorkItemResult,
    process_prompts,
)

from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio

CALL = 0.2
"""How long a call takes: the stop comes while the first calls are in flight."""
STOP_AT = 0.05


@pytest.fixture(scope="module", params=[pytest.param("asyncio", id="asyncio"),
                                        pytest.param(trio_virtual_clock(), id="trio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


class Counting(LLMCallStrategy[str]):
    """Answers after ``CALL`` s; ``fail-*`` prompts fail retryably ``fails`` times first."""

    model_name = "m"
    provider_name = "counting"

    def __init__(self, fails: int = 0) -> None:
        self.calls: list[tuple[str, float]] = []
        self.fails = fails

    async def execute(self, prompt: str, attempt: int, timeout: float | None,
                      state: RetryState | None = None) -> tuple[str, TokenUsage | None, Any]:
        self.calls.append((prompt, anyio.current_time()))
        await anyio.sleep(CALL)
        if prompt.startswith("fail") and attempt <= self.fails:
            raise ProviderError(f"HTTP 503: overloaded ({prompt})", category=ErrorCategory.SERVER,
                                status_code=503)
        return f"answer {prompt}", {"input_tokens": 5, "output_tokens": 5, "total_tokens": 10}, None


def _ended_at(ended: float, expected: float) -> None:
    """On Trio's virtual clock the batch ended exactly then; on asyncio's real one, about then."""
    if sniffio.current_async_library() == "trio":
        assert ended == pytest.approx(expected, abs=1e-6)
    else:
        assert expected <= ended < expected + 1.0


def _by_id(results: list[WorkItemResult[Any]]) -> dict[str, WorkItemResult[Any]]:
    return {r.item_id: r for r in results}


async def _stopped_batch(strategy: Counting, cfg: ProcessorConfig, prompts: list[str]
                         ) -> tuple[dict[str, WorkItemResult[Any]], Any, float]:
    """Run ``prompts``, ``request_stop()`` at ``STOP_AT``; the results, termination and when it ended."""
    start = anyio.current_time()
    with anyio.fail_after(10):  # the bug's batch waits a whole RPM window (60 s): fail, not hang
        async with ParallelBatchProcessor[str](cfg) as proc, anyio.create_task_group() as tg:
            for prompt in prompts:
                await proc.add_work(LLMWorkItem(item_id=prompt, strategy=strategy, prompt=prompt))

            async def stop_later() -> None:
                await anyio.sleep(STOP_AT)
                proc.request_stop("interrupted by SIGINT")

            tg.start_soon(stop_later)
            batch = await proc.process_all()
            ended = anyio.current_time() - start
    return _by_id(batch.results), batch.termination, ended


async def test_items_waiting_for_an_rpm_unit_end_not_executed_at_the_stop(anyio_backend: Any) -> None:
    """Concurrency 4, RPM 2, 20 items: two calls start, two items wait for the window; the stop at
    ``STOP_AT`` ends those two NOT_EXECUTED at once, the two calls in flight finish, nothing else calls."""
    strategy = Counting()
    cfg = ProcessorConfig(concurrency=4, max_requests_per_minute=2)
    prompts = [f"p{i:02d}" for i in range(20)]
    results, termination, ended = await _stopped_batch(strategy, cfg, prompts)
    called = sorted(p for p, _ in strategy.calls)
    assert len(called) == 2
    assert termination.kind == "interrupted"
    assert [results[p].success for p in called] == [True, True]
    rest = [results[p] for p in prompts if p not in called]
    assert {(r.error_category, r.stop_reason, r.attempts, r.error) for r in rest} == {
        (ErrorCategory.NOT_EXECUTED, StopReason.SHUTDOWN, 0, "not executed: interrupted by SIGINT")}
    _ended_at(ended, CALL)  # when the calls in flight finished, not a minute later


async def test_a_retry_does_not_start_after_the_stop(anyio_backend: Any) -> None:
    """An item in its retry backoff when the stop comes makes no new attempt: ABORTED with the stop's
    reason and its last failure; a call in flight that fails after the stop is not retried either."""
    strategy = Counting(fails=1)
    retry = RetryConfig(initial_wait=5.0, max_wait=5.0, jitter=False, max_attempts=3)
    cfg = ProcessorConfig(concurrency=2, retry=retry)
    results, termination, ended = await _stopped_batch(strategy, cfg, ["fail-a", "ok-b", "ok-c"])
    # fail-a's first call fails at CALL, after the stop: no second call; ok-b finishes; ok-c never starts.
    assert [p for p, _ in strategy.calls] == ["fail-a", "ok-b"]
    failed = results["fail-a"]
    assert (failed.error_category, failed.stop_reason, failed.attempts) == (
        ErrorCategory.ABORTED, StopReason.SHUTDOWN, 1)
    assert failed.error is not None and "before a retry" in failed.error and "HTTP 503" in failed.error
    assert failed.exception is None  # as for every cut-short item: its error says what happened
    assert results["ok-b"].success
    assert (results["ok-c"].error_category, results["ok-c"].stop_reason) == (
        ErrorCategory.NOT_EXECUTED, StopReason.SHUTDOWN)
    assert termination.kind == "interrupted"
    _ended_at(ended, CALL)


async def test_an_item_sleeping_in_its_backoff_is_cut_at_the_stop(anyio_backend: Any) -> None:
    """The stop comes during the backoff sleep (5 s): the item ends at once, with no second attempt."""
    strategy = Counting(fails=1)
    retry = RetryConfig(initial_wait=5.0, max_wait=5.0, jitter=False, max_attempts=3)
    cfg = ProcessorConfig(concurrency=1, retry=retry)
    start = anyio.current_time()
    with anyio.fail_after(10):
        async with ParallelBatchProcessor[str](cfg) as proc, anyio.create_task_group() as tg:
            await proc.add_work(LLMWorkItem(item_id="fail-a", strategy=strategy, prompt="fail-a"))

            async def stop_later() -> None:
                await anyio.sleep(CALL + 0.5)  # in the 5 s backoff after the first failure
                proc.request_stop("operator")

            tg.start_soon(stop_later)
            batch = await proc.process_all()
    ended = anyio.current_time() - start
    assert len(strategy.calls) == 1
    (result,) = batch.results
    assert (result.error_category, result.stop_reason, result.attempts) == (
        ErrorCategory.ABORTED, StopReason.SHUTDOWN, 1)
    assert result.error == ("cut short: operator, before a retry; last error: ProviderError: HTTP 503: "
                            "overloaded (fail-a)")
    _ended_at(ended, CALL + 0.5)  # at the stop


async def test_process_prompts_budget_stop_ends_items_waiting_for_admission(anyio_backend: Any) -> None:
    """A spent budget stops the batch: the items waiting for an RPM unit end BUDGET (as queued ones
    do) and are never called, so no call past the budget starts once the stop is decided."""
    strategy = Counting()
    cfg = ProcessorConfig(concurrency=4, max_requests_per_minute=2,
                          guardrails=GuardrailConfig(max_total_tokens=10))
    prompts = [{"id": f"p{i}", "prompt": f"p{i}"} for i in range(8)]
    start = anyio.current_time()
    with anyio.fail_after(10):
        batch = await process_prompts(strategy, prompts, config=cfg)
    ended = anyio.current_time() - start
    assert len(strategy.calls) == 2
    assert batch.termination.kind == "budget_exhausted"
    results = _by_id(batch.results)
    assert sum(r.success for r in results.values()) == 2
    unrun = [r for r in results.values() if not r.success]
    assert {(r.error_category, r.stop_reason, r.attempts) for r in unrun} == {
        (ErrorCategory.BUDGET, StopReason.BUDGET, 0)}
    _ended_at(ended, CALL)


async def test_a_stream_stops_its_items_waiting_for_admission_too(anyio_backend: Any) -> None:
    """Streaming mode (``start()``, ``results()``): the same stop, the same results, in the stream."""
    strategy = Counting()
    cfg = ProcessorConfig(concurrency=4, max_requests_per_minute=2)
    prompts = [f"p{i:02d}" for i in range(10)]
    start = anyio.current_time()
    with anyio.fail_after(10):
        async with ParallelBatchProcessor[str](cfg) as proc, anyio.create_task_group() as tg:
            proc.start()
            for prompt in prompts:
                await proc.add_work(LLMWorkItem(item_id=prompt, strategy=strategy, prompt=prompt))
            await proc.finish()

            async def stop_later() -> None:
                await anyio.sleep(STOP_AT)
                proc.request_stop("operator")

            tg.start_soon(stop_later)
            results = _by_id([r async for r in proc.results()])
            ended = anyio.current_time() - start
    assert len(strategy.calls) == 2 and len(results) == 10
    called = {p for p, _ in strategy.calls}
    assert all(results[p].success for p in called)
    assert {(r.error_category, r.stop_reason, r.attempts) for p, r in results.items() if p not in called} == {
        (ErrorCategory.NOT_EXECUTED, StopReason.SHUTDOWN, 0)}
    _ended_at(ended, CALL)
