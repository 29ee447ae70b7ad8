"""The engine: one result per item, bounded concurrency, backpressure, early exit, lifecycle."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_batch_llm import (
    BatchResult,
    CallableStrategy,
    CallOutcome,
    ErrorCategory,
    FakeStrategy,
    LLMWorkItem,
    ParallelBatchProcessor,
    ProcessorConfig,
    ProviderError,
    RetryConfig,
    process_prompts,
    process_stream,
)

pytestmark = pytest.mark.anyio

FAST_RETRY = RetryConfig(max_attempts=3, initial_wait=0.0, max_wait=0.0)


async def test_process_prompts_every_item_succeeds() -> None:
    fake = FakeStrategy()
    batch = await process_prompts(fake, [f"p{i}" for i in range(50)], concurrency=8)
    assert (batch.total_items, batch.succeeded, batch.failed) == (50, 50, 0)
    assert batch.termination.kind == "completed"
    assert {r.item_id for r in batch.results} == {f"item-{i}" for i in range(50)}
    assert batch.by_id()["item-7"].output == "echo: p7"
    assert all(r.attempts == 1 and r.token_usage["total_tokens"] == 15 for r in batch.results)
    assert fake.prepare_count == 1 and fake.cleanup_count == 1


async def test_tuples_contexts_and_preserve_order() -> None:
    async def slow_first(prompt: str) -> str:
        await anyio.sleep(0.02 if prompt == "a" else 0)
        return prompt.upper()

    prompts = [("x1", "a", {"n": 1}), ("x2", "b", {"n": 2}), ("x3", "c")]
    batch = await process_prompts(CallableStrategy(slow_first), prompts, concurrency=3, preserve_order=True)
    assert [r.item_id for r in batch.results] == ["x1", "x2", "x3"]
    assert [r.output for r in batch.results] == ["A", "B", "C"]
    assert batch.results[0].context == {"n": 1} and batch.results[2].context is None


async def test_duplicate_ids_rejected_before_any_call() -> None:
    fake = FakeStrategy()
    with pytest.raises(ValueError, match="duplicate item_id='a'"):
        await process_prompts(fake, [("a", "1"), ("b", "2"), ("a", "3")])
    assert fake.calls == [] and fake.prepare_count == 0


@pytest.mark.parametrize("bad", ["one string", b"bytes", {"a": "b"}, 42])
async def test_bad_sources_rejected(bad: Any) -> None:
    with pytest.raises(TypeError, match="prompts"):
        await process_prompts(FakeStrategy(), bad)


async def test_bad_entry_names_its_index() -> None:
    with pytest.raises(TypeError, match=r"prompts\[1\]"):
        await process_prompts(FakeStrategy(), ["ok", 3])


async def test_concurrency_never_exceeds_bound() -> None:
    in_flight = 0
    peak = 0

    async def tracked(prompt: str) -> str:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await anyio.sleep(0.001)
        in_flight -= 1
        return prompt

    batch = await process_prompts(CallableStrategy(tracked), [str(i) for i in range(200)], concurrency=7)
    assert batch.succeeded == 200
    assert peak == 7


async def test_callable_outcome_usage_and_metadata() -> None:
    async def fn(prompt: str, *, attempt: int) -> CallOutcome[str]:
        await anyio.lowlevel.checkpoint()
        return CallOutcome(
            prompt, token_usage={"input_tokens": 3, "output_tokens": 4}, metadata={"a": attempt}
        )

    batch = await process_prompts(CallableStrategy(fn), ["p"])
    (result,) = batch.results
    assert result.token_usage == {"input_tokens": 3, "output_tokens": 4}
    assert result.metadata == {"a": 1}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    outcomes=st.lists(st.sampled_from(["ok", "server", "auth", "flaky"]), min_size=0, max_size=40),
    concurrency=st.integers(min_value=1, max_value=12),
)
async def test_every_item_gets_exactly_one_result(outcomes: list[str], concurrency: int) -> None:
    script: dict[str, list[Any]] = {}
    for i, kind in enumerate(outcomes):
        prompt = f"p{i}"
        if kind == "server":
            script[prompt] = [ProviderError("5xx", category=ErrorCategory.SERVER)] * 3
        elif kind == "auth":
            script[prompt] = [ProviderError("401", category=ErrorCategory.AUTHENTICATION)]
        elif kind == "flaky":
            script[prompt] = [ProviderError("5xx", category=ErrorCategory.SERVER), "recovered"]
    fake = FakeStrategy(script=script)
    cfg = ProcessorConfig(concurrency=concurrency, retry=FAST_RETRY)
    batch = await process_prompts(fake, [f"p{i}" for i in range(len(outcomes))], config=cfg)
    ids = [r.item_id for r in batch.results]
    assert sorted(ids) == sorted(f"item-{i}" for i in range(len(outcomes)))
    assert len(set(ids)) == len(ids)
    for i, kind in enumerate(outcomes):
        result = batch.by_id()[f"item-{i}"]
        assert result.success is (kind in ("ok", "flaky"))
        assert result.attempts == {"ok": 1, "server": 3, "auth": 1, "flaky": 2}[kind]
        if not result.success:
            assert result.error_category in (ErrorCategory.SERVER, ErrorCategory.AUTHENTICATION)
            assert isinstance(result.exception, ProviderError)
    assert batch.succeeded + batch.failed == len(outcomes)


async def test_process_stream_yields_in_completion_order() -> None:
    async def fn(prompt: str) -> str:
        await anyio.sleep(float(prompt))
        return prompt

    async with process_stream(CallableStrategy(fn), ["0.03", "0.01", "0.02"], concurrency=3) as results:
        order = [r.output async for r in results]
    assert order == ["0.01", "0.02", "0.03"]
    assert results.termination.kind == "completed"


async def test_process_stream_async_source_and_lazy_duplicate() -> None:
    async def source() -> Any:
        for i in range(5):
            yield ("same" if i == 3 else f"id{i}", f"p{i}")
        yield ("same", "again")

    seen = []
    with pytest.raises(ValueError, match="duplicate item_id='same'"):
        async with process_stream(FakeStrategy(), source(), concurrency=2) as results:
            async for r in results:
                seen.append(r.item_id)
    assert len(seen) <= 5


async def test_early_exit_cancels_work_and_closes_strategy() -> None:
    fake = FakeStrategy(latency=10.0)
    before = len(anyio.get_running_tasks())
    with anyio.fail_after(5):
        async with process_stream(fake, [f"p{i}" for i in range(100)], concurrency=4) as results:
            await _settle()
            assert fake.in_flight == 4
            assert results.statistics().delivered == 0
    assert len(anyio.get_running_tasks()) == before
    assert fake.cleanup_count == 1
    assert fake.in_flight == 0
    assert len(fake.calls) == 4


async def test_producer_backpressure_input_bound() -> None:
    release = anyio.Event()
    started = 0

    async def blocked(prompt: str) -> str:
        nonlocal started
        started += 1
        await release.wait()
        return prompt

    cfg = ProcessorConfig(concurrency=2, max_queue_size=3)
    added = 0
    async with ParallelBatchProcessor[str](cfg) as proc:
        proc.start()
        strategy = CallableStrategy(blocked)

        async def produce() -> None:
            nonlocal added
            for i in range(20):
                await proc.add_work(LLMWorkItem(item_id=str(i), strategy=strategy, prompt=str(i)))
                added += 1
            await proc.finish()

        async with anyio.create_task_group() as tg:
            tg.start_soon(produce)
            await _settle()
            # 2 taken by workers + 3 queued; the producer is blocked on the 6th.
            assert (started, added) == (2, 5)
            assert proc.statistics().queued == 3
            release.set()
            results = [r async for r in proc.results()]
    assert len(results) == 20


async def test_consumer_backpressure_result_bound() -> None:
    cfg = ProcessorConfig(concurrency=4, max_result_queue_size=3)
    fake = FakeStrategy()
    peak = 0
    async with ParallelBatchProcessor[str](cfg) as proc:
        proc.start()
        for i in range(40):
            await proc.add_work(LLMWorkItem(item_id=str(i), strategy=fake, prompt=str(i)))
        await proc.finish()
        count = 0
        async for _ in proc.results():
            await _settle()
            stats = proc.results_statistics()
            peak = max(peak, stats.queued)
            count += 1
    assert count == 40
    assert peak == 3


async def test_lifecycle_errors() -> None:
    fake = FakeStrategy()
    item = LLMWorkItem(item_id="a", strategy=fake, prompt="x")
    proc = ParallelBatchProcessor[str]()
    with pytest.raises(RuntimeError, match="streaming mode needs `async with"):
        proc.start()  # batch mode works without a block (test_migration_lifecycle.py)
    async with proc:
        await proc.add_work(item)
        with pytest.raises(RuntimeError, match="results\\(\\) before start"):
            proc.results()
        batch = await proc.process_all()
        assert batch.succeeded == 1
        with pytest.raises(RuntimeError, match="runs once"):
            await proc.process_all()
        with pytest.raises(RuntimeError, match="input is closed"):
            await proc.add_work(item)
        with pytest.raises(RuntimeError, match="runs once"):
            proc.start()
    with pytest.raises(RuntimeError, match="one-shot"):
        async with proc:
            pass


async def test_batch_result_round_trip_and_summary() -> None:
    script = {"bad": [ProviderError("no", category=ErrorCategory.INVALID_REQUEST)]}
    batch = await process_prompts(FakeStrategy(script=script), ["good", "bad"], preserve_order=True)
    again = BatchResult.from_json(batch.to_json())
    assert [r.to_dict() for r in again.results] == [r.to_dict() for r in batch.results]
    assert again.in_input_order()[0].item_id == "item-0"
    text = batch.summary()
    assert "succeeded 1" in text and "failed 1" in text and "invalid_request 1" in text
    assert "p50" in text and "p95" in text and "p99" in text


async def test_progress_callable_called_per_item() -> None:
    calls: list[tuple[int, int | None, str]] = []
    await process_prompts(
        FakeStrategy(),
        ["a", "b", "c"],
        concurrency=1,
        progress=lambda done, total, item_id: calls.append((done, total, item_id)),
    )
    assert [c[0] for c in calls] == [1, 2, 3]
    assert {c[2] for c in calls} == {"item-0", "item-1", "item-2"}
    assert all(c[1] == 3 for c in calls)


async def _settle() -> None:
    for _ in range(50):
        await anyio.lowlevel.checkpoint()


def _digest(batch: BatchResult[Any]) -> str:
    rows = sorted(
        (
            r.item_id,
            r.success,
            r.output,
            r.attempts,
            r.error_category.value if r.error_category else None,
            r.token_usage.get("total_tokens"),
        )
        for r in batch.results
    )
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def test_seeded_run_identical_on_both_backends() -> None:
    async def run() -> str:
        fake = FakeStrategy(
            latency=(0.0, 0.002), failure_rate=0.2, rate_limit_rate=0.05, retry_after=0.0, seed=7
        )
        cfg = ProcessorConfig(concurrency=16, retry=FAST_RETRY)
        batch = await process_prompts(fake, [f"p{i}" for i in range(300)], config=cfg)
        return _digest(batch)

    digests = {backend: anyio.run(run, backend=backend) for backend in ("trio", "asyncio")}
    assert digests["trio"] == digests["asyncio"]


async def test_progress_true_falls_back_to_log_lines_off_a_terminal(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    caplog.set_level(logging.INFO, logger="trio_batch_llm.progress")
    batch = await process_prompts(FakeStrategy(), [f"p{i}" for i in range(20)], concurrency=4, progress=True)
    assert batch.succeeded == 20
    lines = [r.getMessage() for r in caplog.records if r.name == "trio_batch_llm.progress"]
    assert lines and "20/20" in lines[-1]


@pytest.mark.parametrize(
    "prompts",
    [["a", ("item-0", "b")], [("item-1", "b"), "x", "y"], [("k", "a"), ("k", "b")]],
    ids=["explicit-after-generated", "generated-after-explicit", "explicit-twice"],
)
async def test_duplicates_between_generated_and_explicit_ids(prompts: list[Any]) -> None:
    with pytest.raises(ValueError, match="duplicate item_id"):
        await process_prompts(FakeStrategy(), prompts)


async def test_explicit_ids_that_only_look_generated_are_fine() -> None:
    batch = await process_prompts(FakeStrategy(), ["a", ("item-01", "b"), ("item-7", "c")])
    assert sorted(r.item_id for r in batch.results) == ["item-0", "item-01", "item-7"]


async def test_every_strategy_is_cleaned_up_even_when_their_identities_print_alike() -> None:
    """Distinct lease identities with equal reprs each get their own release step (regression)."""
    strategies = [FakeStrategy() for _ in range(5)]
    assert len({repr(s) for s in strategies}) == 1
    assert len({s.lease_identity() for s in strategies}) == 5
    items = [LLMWorkItem(f"i{n}", s, f"p{n}") for n, s in enumerate(strategies)]
    result = await process_prompts(strategies[0], items, concurrency=2)
    assert result.succeeded == 5
    assert [s.cleanup_count for s in strategies] == [1] * 5
