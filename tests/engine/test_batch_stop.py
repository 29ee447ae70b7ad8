"""A batch-stopping error (issue 33, point 1): a per-day quota or a spend limit ends the batch at once.

A strategy says so with ``ProviderError(stops_batch="why")``; the failure is final for its item
(never retried, whatever its category) and the batch ends ``provider_retired`` naming the error
and the item, its unrun items ``PROVIDER_RETIRED``. The same scripted strategy runs through
``process_prompts``, ``process_stream``, ``ParallelBatchProcessor``, ``LLMCallPool``,
``call_result`` and a durable run, which must agree. An item's prompt says what its attempts do:
``ok-N`` answers after 50 ms, ``quota-N`` fails with the batch-stopping 429 after 10 ms.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from trio_batch_llm import (
    BatchTermination,
    CircuitBreakerConfig,
    ErrorCategory,
    LLMCallPool,
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
    call_result,
    process_prompts,
    process_stream,
)
from trio_batch_llm._engine._classify import classify
from trio_batch_llm._runs import open_run

from .._runs_child import IDENTITY
from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio


@pytest.fixture(
    scope="module",
    params=[pytest.param("asyncio", id="asyncio"), pytest.param(trio_virtual_clock(threads=True), id="trio")],
)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param

WHY = "per-day quota of model m spent (GenerateRequestsPerDayPerProjectPerModel)"
RETRY = RetryConfig(initial_wait=0.01, max_wait=0.05, jitter_seed=3, max_attempts=5)
PROMPTS = ["ok-0", "ok-1", "ok-2", "quota-3", *(f"ok-{i}" for i in range(4, 12))]
"""With 4 workers, the first four start together: three answer, the fourth stops the batch."""


def _quota_error(prompt: str, category: ErrorCategory = ErrorCategory.RATE_LIMIT) -> ProviderError:
    return ProviderError(f"HTTP 429: quota exceeded ({prompt})", category=category, status_code=429,
                         retry_after=30.0, stops_batch=WHY)


class Scripted(LLMCallStrategy[str]):
    """Counts its calls by prompt; ``quota-*`` raises the batch-stopping error."""

    model_name = "m"
    provider_name = "scripted"

    def __init__(self, error: Callable[[str], Exception] = _quota_error) -> None:
        self.calls: dict[str, int] = {}
        self.error = error

    async def execute(self, prompt: str, attempt: int, timeout: float | None,
                      state: RetryState | None = None) -> tuple[str, TokenUsage | None, Any]:
        self.calls[prompt] = self.calls.get(prompt, 0) + 1
        if prompt.startswith("quota"):
            await anyio.sleep(0.01)  # the items ahead of it have started by then: their calls are in flight
            raise self.error(prompt)
        await anyio.sleep(0.05)
        return f"answer {prompt}", {"input_tokens": 5, "output_tokens": 5, "total_tokens": 10}, None


def _config(breaker: CircuitBreakerConfig | None) -> ProcessorConfig:
    return ProcessorConfig(concurrency=4, retry=RETRY, circuit_breaker=breaker)


Outcome = tuple[dict[str, WorkItemResult[Any]], BatchTermination | None]


async def via_process_prompts(strategy: Scripted, cfg: ProcessorConfig) -> Outcome:
    batch = await process_prompts(strategy, [{"id": p, "prompt": p} for p in PROMPTS], config=cfg)
    return {r.item_id: r for r in batch.results}, batch.termination


async def via_process_stream(strategy: Scripted, cfg: ProcessorConfig) -> Outcome:
    async with process_stream(strategy, [{"id": p, "prompt": p} for p in PROMPTS], config=cfg) as stream:
        got = {r.item_id: r async for r in stream}
        return got, stream.termination


async def via_processor(strategy: Scripted, cfg: ProcessorConfig) -> Outcome:
    async with ParallelBatchProcessor[str](cfg) as proc:
        for prompt in PROMPTS:
            await proc.add_work(LLMWorkItem(item_id=prompt, strategy=strategy, prompt=prompt))
        batch = await proc.process_all()
    return {r.item_id: r for r in batch.results}, batch.termination


async def via_pool(strategy: Scripted, cfg: ProcessorConfig) -> Outcome:
    """The first four together (as the workers take them), then the rest one by one."""
    results: dict[str, WorkItemResult[Any]] = {}
    async with LLMCallPool(strategy, config=cfg) as pool:
        async def one(prompt: str) -> None:
            results[prompt] = await pool.submit_result(prompt)

        async with anyio.create_task_group() as tg:
            for prompt in PROMPTS[:4]:
                tg.start_soon(one, prompt)
        for prompt in PROMPTS[4:]:
            await one(prompt)
    return {p: results[p] for p in PROMPTS}, None


SURFACES = [via_process_prompts, via_process_stream, via_processor, via_pool]


@pytest.mark.parametrize("breaker", [None, CircuitBreakerConfig(threshold=10)], ids=["no-breaker", "breaker"])
@pytest.mark.parametrize("surface", SURFACES, ids=lambda s: s.__name__)
async def test_every_surface_stops_the_batch_at_the_first_batch_stopping_error(
    anyio_backend: Any, surface: Callable[..., Any], breaker: CircuitBreakerConfig | None,
) -> None:
    strategy = Scripted()
    results, termination = await surface(strategy, _config(breaker))
    if surface is via_process_stream:  # a lazy source is read no further once the batch stopped
        assert set(PROMPTS[:4]) <= set(results) <= set(PROMPTS)
    else:
        assert set(results) == set(PROMPTS)  # one result per item
    by_prompt = results
    # The item that hit the quota: one attempt (a 429 with Retry-After, max_attempts=5), final; its
    # category is the provider's answer, its stop reason says the provider stopped the batch.
    failed = by_prompt["quota-3"]
    assert (failed.success, failed.error_category, failed.attempts, failed.stop_reason) == (
        False, ErrorCategory.RATE_LIMIT, 1, StopReason.PROVIDER_RETIRED)
    assert strategy.calls["quota-3"] == 1
    # Calls in flight when it failed finish; nothing else is called.
    for prompt in ("ok-0", "ok-1", "ok-2"):
        assert by_prompt[prompt].success, by_prompt[prompt].error
    for prompt in PROMPTS[4:]:
        assert prompt not in strategy.calls
        if prompt not in by_prompt:
            continue
        late = by_prompt[prompt]
        assert (late.success, late.error_category, late.stop_reason, late.attempts) == (
            False, ErrorCategory.NOT_EXECUTED, StopReason.PROVIDER_RETIRED, 0), prompt
        assert WHY in (late.error or "")
    if termination is not None:  # the batch surfaces; a pool has no termination
        assert termination.kind == "provider_retired"
        assert termination.reason is not None and WHY in termination.reason
        assert "quota exceeded (quota-3)" in termination.reason
        assert termination.item_id == "quota-3"


async def test_call_result_does_not_retry_it(anyio_backend: Any) -> None:
    strategy = Scripted()
    result = await call_result(strategy, "quota-0", config=_config(None))
    assert (result.error_category, result.attempts, result.stop_reason) == (
        ErrorCategory.RATE_LIMIT, 1, StopReason.PROVIDER_RETIRED)
    assert strategy.calls == {"quota-0": 1}


@pytest.mark.parametrize("category", [ErrorCategory.SERVER, ErrorCategory.INSUFFICIENT_BALANCE,
                                      ErrorCategory.UNKNOWN])
async def test_it_is_final_whatever_its_category(anyio_backend: Any, category: ErrorCategory) -> None:
    strategy = Scripted(lambda p: _quota_error(p, category))
    results, termination = await via_process_prompts(strategy, _config(None))
    assert strategy.calls["quota-3"] == 1
    assert results["quota-3"].error_category is category
    assert termination is not None and termination.kind == "provider_retired"


async def test_a_user_classifier_that_decides_the_category_keeps_the_stop(anyio_backend: Any) -> None:
    strategy = Scripted()
    seen: list[str] = []

    def mine(exc: Exception) -> ErrorCategory | None:
        seen.append(type(exc).__name__)
        return ErrorCategory.SERVER if isinstance(exc, ProviderError) else None

    batch = await process_prompts(strategy, [{"id": p, "prompt": p} for p in PROMPTS], config=_config(None),
                                  error_classifier=mine)
    by_id = {r.item_id: r for r in batch.results}
    assert seen == ["ProviderError"]
    assert (by_id["quota-3"].error_category, by_id["quota-3"].attempts) == (ErrorCategory.SERVER, 1)
    assert batch.termination.kind == "provider_retired"


def test_classify_carries_stops_batch_when_a_classifier_decides() -> None:
    exc = _quota_error("p")
    assert classify(exc).stops_batch == WHY
    assert classify(exc, user_classifier=lambda e: ErrorCategory.SERVER).stops_batch == WHY
    decided = classify(exc, strategy_classifier=lambda e: (ErrorCategory.RATE_LIMIT, 5.0))
    assert (decided.category, decided.retry_after, decided.stops_batch) == (
        ErrorCategory.RATE_LIMIT, 5.0, WHY)
    assert classify(ProviderError("x", category=ErrorCategory.SERVER)).stops_batch is None


async def test_a_per_day_429_neither_cools_the_scope_down_nor_lowers_its_rate(anyio_backend: Any) -> None:
    """The quota is spent for the day: a cooldown of 30 s or a lower rate would be a wrong lesson."""
    strategy = Scripted()
    async with LLMCallPool(strategy, config=_config(None)) as pool:
        await pool.submit_result("quota-0")
        stats = pool.statistics().admission
    assert stats.cooldown_remaining == 0
    assert stats.rate_limits_reported == 0


async def test_a_durable_run_stops_with_the_termination_and_keeps_unrun_items_pending(
    anyio_backend: Any, tmp_path: Path,
) -> None:
    strategy = Scripted()
    async with await open_run(tmp_path / "runs.sqlite", "run", strategy, PROMPTS, identity=IDENTITY,
                              config=_config(None)) as run:
        snap = await run.wait()
    assert snap.termination is not None and snap.termination.kind == "provider_retired"
    assert snap.termination.reason is not None and WHY in snap.termination.reason
    # The item that hit the quota stays pending too: tomorrow's quota may serve it.
    assert (snap.succeeded, snap.failed, snap.pending) == (3, 0, len(PROMPTS) - 3)
    assert strategy.calls["quota-3"] == 1
    assert set(strategy.calls) == set(PROMPTS[:4])


def test_the_cli_says_the_provider_stopped_the_batch_and_exits_69(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from trio_batch_llm._cli import _providers
    from trio_batch_llm.cli import main

    strategy = Scripted()
    monkeypatch.setattr(_providers, "llm", lambda name, **kwargs: strategy)
    monkeypatch.setenv("STOP_KEY", "sk-test")
    source = tmp_path / "in.jsonl"
    source.write_text("".join(f'{{"id": "{p}", "prompt": "{p}"}}\n' for p in PROMPTS))
    code = main(["run", str(source), "--model", "openai-compatible:m", "--api-key-env", "STOP_KEY",
                 "--base-url", "http://127.0.0.1:9/v1", "--backend", "asyncio", "--concurrency", "4",
                 "--out", str(tmp_path / "out.jsonl")])
    text = "".join(capsys.readouterr())
    assert code == 69, text
    assert f"Batch stopped: provider stopped the batch: {WHY}" in text
    assert "the provider stopped the batch (the termination says why)" in text
    assert strategy.calls["quota-3"] == 1
    assert set(strategy.calls) <= set(PROMPTS[:4])
