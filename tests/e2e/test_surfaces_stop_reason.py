"""Every outcome says why, on every surface (issue 32, point 5).

The same stop scenarios (a batch deadline, an abort category, a spent token budget,
an item's own deadline) run through ``call_result``, ``LLMCallPool.submit_result``,
``process_prompts``, ``process_stream`` and ``ParallelBatchProcessor``; on each,
every result that did not succeed because a stop or a deadline kept it from its end
carries the scenario's :class:`StopReason`, and every other result (a success, an
item whose own last attempt failed) carries none. A stop decided by an item's
result names that item in the termination.

An item's prompt says what its attempt does: ``ok`` answers at once (10 tokens),
``hang`` never answers, ``fatal`` fails with an ``authentication`` error (not
retried). Only a hang ever meets a deadline, so no outcome depends on how fast the
machine is (on asyncio's real clock a slow machine may also stop an ``ok`` item: then it
says so too); the single-call surfaces, which no batch stop reaches, run only the
scenarios that end without one (a hang there needs the item's own deadline).
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_batch_llm import (
    AbortMode,
    BatchTermination,
    ErrorCategory,
    GuardrailConfig,
    ItemCompleted,
    ItemFailed,
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

from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio

AUTH = ErrorCategory.AUTHENTICATION


class Scripted(LLMCallStrategy[str]):
    """The prompt's first word says what every attempt of it does (module docstring)."""

    async def execute(  # noqa: ASYNC910 - "ok" answers without a checkpoint on purpose
        self, prompt: str, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[str, TokenUsage | None, Any]:
        kind = prompt.split("-")[0]
        if kind == "hang":
            await anyio.sleep_forever()
        if kind == "fatal":
            raise ProviderError(f"scripted {prompt}", category=AUTH)
        return f"answer {prompt}", {"input_tokens": 5, "output_tokens": 5, "total_tokens": 10}, None


Outcome = tuple[dict[str, WorkItemResult[Any]], BatchTermination | None]


def _entries(prompts: list[str]) -> list[dict[str, str]]:
    return [{"id": p, "prompt": p} for p in prompts]


async def via_call_result(prompts: list[str], cfg: ProcessorConfig) -> Outcome:
    results: dict[str, WorkItemResult[Any]] = {}

    async def one(prompt: str) -> None:
        results[prompt] = await call_result(Scripted(), prompt, config=cfg)

    async with anyio.create_task_group() as tg:
        for prompt in prompts:
            tg.start_soon(one, prompt)
    return results, None


async def via_pool(prompts: list[str], cfg: ProcessorConfig) -> Outcome:
    results: dict[str, WorkItemResult[Any]] = {}
    async with LLMCallPool(Scripted(), config=cfg) as pool:

        async def one(prompt: str) -> None:
            results[prompt] = await pool.submit_result(prompt)

        async with anyio.create_task_group() as tg:
            for prompt in prompts:
                tg.start_soon(one, prompt)
    return results, None


async def via_process_prompts(prompts: list[str], cfg: ProcessorConfig) -> Outcome:
    batch = await process_prompts(Scripted(), _entries(prompts), config=cfg)
    return {r.item_id: r for r in batch.results}, batch.termination


async def via_process_stream(prompts: list[str], cfg: ProcessorConfig) -> Outcome:
    async with process_stream(Scripted(), _entries(prompts), config=cfg) as results:
        got = {r.item_id: r async for r in results}
        return got, results.termination


async def via_processor(prompts: list[str], cfg: ProcessorConfig) -> Outcome:
    strategy = Scripted()
    async with ParallelBatchProcessor[str](cfg) as proc:
        for prompt in prompts:
            await proc.add_work(LLMWorkItem(item_id=prompt, strategy=strategy, prompt=prompt))
        batch = await proc.process_all()
    return {r.item_id: r for r in batch.results}, batch.termination


SINGLE_CALLS = [via_call_result, via_pool]
BATCHES = [via_process_prompts, via_process_stream, via_processor]

SCENARIOS = ["batch_deadline", "abort", "budget", "item_deadline"]
REASON = {
    "batch_deadline": StopReason.BATCH_DEADLINE,
    "abort": StopReason.ABORT_CATEGORY,
    "budget": StopReason.BUDGET,
    "item_deadline": StopReason.ITEM_DEADLINE,
}


def scenario_config(scenario: str, prompts: list[str], concurrency: int, deadline: float,
                    budget_items: int) -> ProcessorConfig:
    guard = {
        "batch_deadline": GuardrailConfig(batch_timeout=deadline),
        "abort": GuardrailConfig(abort_on_error_categories=frozenset({AUTH}),
                                 abort_mode=AbortMode.CANCEL_ACTIVE),
        "budget": GuardrailConfig(max_total_tokens=10 * budget_items),
        "item_deadline": GuardrailConfig(total_timeout_per_item=deadline),
    }[scenario]
    return ProcessorConfig(concurrency=concurrency, guardrails=guard,
                           retry=RetryConfig(max_attempts=1, initial_wait=0.0, max_wait=0.0))


def check(scenario: str, prompts: list[str], outcome: Outcome, surface: str) -> None:
    results, termination = outcome
    if surface == "via_process_stream":  # a stop ends the reading of its source: the rest never enter
        assert set(results) <= set(prompts), surface
    else:
        assert sorted(results) == sorted(prompts), surface
    want = REASON[scenario]
    for prompt, result in results.items():
        kind = prompt.split("-")[0]
        where = (surface, scenario, prompt, result)
        if result.success:
            assert result.stop_reason is None, where
        elif result.error_category is AUTH:  # its own last attempt failed: it ran to its end
            assert kind == "fatal" and result.stop_reason is None, where
        else:
            assert result.stop_reason is want, where
        if kind == "hang":  # nothing ends a hang but a stop or a deadline
            assert not result.success and result.stop_reason is want, where
        # Kept by every store and export: to_dict/from_dict round-trips the reason.
        assert WorkItemResult.from_dict(result.to_dict()).stop_reason is result.stop_reason, where
    if termination is None:
        return
    stopped_by = {"abort": "aborted", "budget": "budget_exhausted", "batch_deadline": "batch_deadline"}
    if termination.kind == "completed":
        assert termination.item_id is None
        assert all(r.stop_reason in (None, StopReason.ITEM_DEADLINE) for r in results.values()), surface
        return
    assert termination.kind == stopped_by[scenario], (surface, termination)
    if scenario == "abort":
        (fatal,) = [p for p in prompts if p.startswith("fatal")]
        assert termination.item_id == fatal, (surface, termination)
    elif scenario == "budget":
        trigger = termination.item_id
        assert trigger is not None and results[trigger].success, (surface, termination)
    else:
        assert termination.item_id is None


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, list[str], int, int]:
    scenario = draw(st.sampled_from(SCENARIOS))
    kinds = {"batch_deadline": ["ok", "hang"], "abort": ["ok", "hang"], "budget": ["ok"],
             "item_deadline": ["ok", "hang", "fatal"]}[scenario]
    picked = draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=8))
    if scenario == "batch_deadline" and "hang" not in picked:
        picked.append("hang")
    if scenario == "abort":
        picked.insert(draw(st.integers(0, len(picked))), "fatal")
    prompts = [f"{kind}-{i}" for i, kind in enumerate(picked)]
    # An abort must be reached: a worker stays free of hangs to take the failing item.
    least = picked.count("hang") + 1 if scenario == "abort" else 1
    concurrency = draw(st.integers(least, max(least, 4)))
    budget_items = draw(st.integers(1, len(prompts)))
    return scenario, prompts, concurrency, budget_items


async def check_every_surface(case: tuple[str, list[str], int, int], deadline: float) -> None:
    scenario, prompts, concurrency, budget_items = case
    cfg = scenario_config(scenario, prompts, concurrency, deadline, budget_items)
    surfaces = list(BATCHES)
    if scenario in ("budget", "item_deadline"):  # no batch stop: a single call ends on its own
        surfaces += SINGLE_CALLS
    outcomes: dict[str, Outcome] = {}

    async def run(surface: Any) -> None:
        outcomes[surface.__name__] = await surface(prompts, cfg)

    async with anyio.create_task_group() as tg:  # side by side: one deadline's wait for all
        for surface in surfaces:
            tg.start_soon(run, surface)
    for name, outcome in outcomes.items():
        check(scenario, prompts, outcome, name)


@pytest.mark.parametrize("anyio_backend", [pytest.param(trio_virtual_clock(), id="trio-virtual")])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
async def test_every_surface_says_why_on_virtual_time(case: tuple[str, list[str], int, int]) -> None:
    await check_every_surface(case, deadline=1.0)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
async def test_every_surface_says_why_on_asyncio(case: tuple[str, list[str], int, int]) -> None:
    await check_every_surface(case, deadline=0.2)


# --- the stops no scenario above reaches -------------------------------------------------


async def test_request_stop_is_shutdown_and_the_queue_says_so(anyio_backend: Any) -> None:
    strategy = Scripted()
    cfg = ProcessorConfig(concurrency=1)
    async with ParallelBatchProcessor[str](cfg) as proc:
        for i in range(5):
            await proc.add_work(LLMWorkItem(item_id=f"ok-{i}", strategy=strategy, prompt=f"ok-{i}"))
        with pytest.raises(TypeError, match="stop_reason='pause': must be a StopReason"):
            proc.request_stop("operator", stop_reason="pause")  # type: ignore[arg-type]
        proc.request_stop("operator")
        batch = await proc.process_all()
    assert batch.termination == BatchTermination("interrupted", "operator")
    assert [(r.error_category, r.stop_reason) for r in batch.results] == [
        (ErrorCategory.NOT_EXECUTED, StopReason.SHUTDOWN)] * 5
    assert "  stopped     shutdown 5" in batch.summary().splitlines()


async def test_a_failing_input_is_fail_fast(anyio_backend: Any) -> None:
    """A lazy source that raises ends the stream with its error; the call it cut short and the
    items it left queued say ``fail_fast`` (an observer sees them: the stream ends with the error)."""
    strategy = Scripted()
    calling = anyio.Event()
    finished = anyio.Event()
    seen: list[WorkItemResult[Any]] = []

    class Flagged(LLMCallStrategy[str]):
        async def execute(self, prompt: str, attempt: int, timeout: float | None,
                          state: RetryState | None = None) -> tuple[str, TokenUsage | None, Any]:
            calling.set()
            return await strategy.execute(prompt, attempt, timeout, state)

    class Terminals:
        def on_event(self, event: Any) -> None:
            if isinstance(event, ItemFailed | ItemCompleted):
                seen.append(event.result)
                if len(seen) == 4:
                    finished.set()

    flagged = Flagged()

    async def source() -> Any:
        for i in range(4):
            yield LLMWorkItem(item_id=f"hang-{i}", strategy=flagged, prompt=f"hang-{i}")
        await calling.wait()  # hang-0 is in its call: only the stop can end it
        raise RuntimeError("the source broke")

    async with ParallelBatchProcessor[str](ProcessorConfig(concurrency=1, max_queue_size=8),
                                           observers=[Terminals()]) as proc:
        proc.start()
        proc.feed(source())
        with pytest.raises(RuntimeError, match="the source broke"):
            async for _ in proc.results():
                pass
        with anyio.fail_after(5):  # the stream's error may come before the stopped items settle
            await finished.wait()
    # The call in flight is cut short, the queue reported not executed: all say why.
    assert [(r.item_id, r.error_category, r.stop_reason) for r in seen] == [
        ("hang-0", ErrorCategory.ABORTED, StopReason.FAIL_FAST),
        *((f"hang-{i}", ErrorCategory.NOT_EXECUTED, StopReason.FAIL_FAST) for i in (1, 2, 3))]
    assert proc.termination.kind == "interrupted"


async def test_a_full_pool_refuses_at_the_door_as_pool_full(anyio_backend: Any) -> None:
    pool = LLMCallPool(Scripted(), config=ProcessorConfig(concurrency=1), max_pending=0)
    async with pool, anyio.create_task_group() as tg:
        tg.start_soon(pool.submit_result, "hang-0")
        while pool.pending == 0:
            await anyio.lowlevel.checkpoint()
        refused = await pool.submit_result("ok-1")
        tg.cancel_scope.cancel()
    assert (refused.error_category, refused.stop_reason) == (ErrorCategory.NOT_EXECUTED, StopReason.POOL_FULL)


async def test_a_call_start_deadline_is_the_items_own_deadline(anyio_backend: Any) -> None:
    strategy = Scripted()
    async with ParallelBatchProcessor[str](ProcessorConfig(concurrency=2),
                                           call_start_deadline=anyio.current_time() - 1) as proc:
        await proc.add_work(LLMWorkItem(item_id="ok-0", strategy=strategy, prompt="ok-0"))
        batch = await proc.process_all()
    (result,) = batch.results
    assert result.error_category is ErrorCategory.NOT_EXECUTED
    assert result.stop_reason is StopReason.ITEM_DEADLINE
    assert batch.termination.kind == "completed"


def test_a_record_without_a_stop_reason_is_unchanged_and_an_unknown_one_reads_as_none() -> None:
    plain = WorkItemResult("a", True, "x")
    assert "stop_reason" not in plain.to_dict()
    stopped = WorkItemResult("b", False, error="e", error_category=ErrorCategory.NOT_EXECUTED,
                             stop_reason=StopReason.PAUSE)
    assert stopped.to_dict()["stop_reason"] == "pause"
    assert WorkItemResult.from_dict(stopped.to_dict()).stop_reason is StopReason.PAUSE
    newer = {**stopped.to_dict(), "stop_reason": "from_the_future"}
    assert WorkItemResult.from_dict(newer).stop_reason is None
    term = BatchTermination("aborted", "authentication failure of item 'b'", item_id="b")
    assert BatchTermination.from_dict(term.to_dict()) == term
    assert "item_id" not in BatchTermination("completed").to_dict()
