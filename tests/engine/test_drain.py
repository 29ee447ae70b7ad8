"""The engine's stop and drain paths: one scope per runtime group, one per attempt, and a tight queue drain.

Exact times run on Trio's virtual clock; behaviour on both backends.
"""

from __future__ import annotations

import gc
import itertools
from collections import Counter
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import trio_batch_llm._engine._collector as collector_module
import trio_batch_llm._engine._guards as guards_module
import trio_batch_llm._engine._item as item_module
import trio_batch_llm._engine._publish as publish_module
import trio_batch_llm._engine._workers as workers_module
from trio_batch_llm import (
    AbortMode,
    BatchInterruptedError,
    CallableStrategy,
    ErrorCategory,
    ExecutorHost,
    GuardrailConfig,
    ItemDeadlineExceeded,
    LLMWorkItem,
    ParallelBatchProcessor,
    ProcessorConfig,
    ProviderError,
    RetryConfig,
    process_prompts,
)
from trio_batch_llm._core._deliveries import unwrap_group
from trio_batch_llm._engine._publish import DRAIN_CHUNK
from trio_batch_llm._observe._events import ItemFailed

from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio

virtual = pytest.mark.parametrize("anyio_backend", [pytest.param(trio_virtual_clock(), id="trio-virtual")])


# --- RuntimeTasks: one nested task group under one cancel scope --------------------------------


async def test_runtime_group_cancel_stops_every_task_and_wait_idle_sees_them_gone() -> None:
    log: list[str] = []

    async def hang(name: str) -> None:
        try:
            await anyio.sleep_forever()
        finally:
            log.append(name)

    async with ExecutorHost() as host:
        group = host.new_runtime_group()
        for i in range(5):
            group.start_soon(hang, f"t{i}", name=f"t{i}")
        await _settle()
        assert group.running == 5
        group.cancel("test stop")
        await group.wait_idle()
        assert group.running == 0
        assert sorted(log) == [f"t{i}" for i in range(5)]
        assert host.statistics().runtime_tasks == 0
    assert host.state == "closed"


async def _settle() -> None:
    for _ in range(5):
        await anyio.lowlevel.checkpoint()


async def test_nothing_of_a_batch_still_runs_when_process_all_returns() -> None:
    # The workers' supervisor used to leave a scheduler round after process_all() returned, so a
    # cancellation of the caller's scope right then could meet it and join the close's own
    # exception in a group (seen as a KeyboardInterrupt wrapped in a group on Trio).
    async def answer(prompt: str) -> str:
        await anyio.lowlevel.checkpoint()
        return prompt

    strategy = CallableStrategy(answer)
    config = ProcessorConfig(concurrency=4, attempt_timeout=30.0)  # the deadline watcher runs too
    async with ParallelBatchProcessor[str](config) as proc:
        before = {task.id for task in anyio.get_running_tasks()}
        for n in range(8):
            await proc.add_work(LLMWorkItem(item_id=f"i{n}", strategy=strategy, prompt=f"p{n}"))
        batch = await proc.process_all()
        left = [task.name for task in anyio.get_running_tasks() if task.id not in before]
    assert len(batch.results) == 8 and left == []


async def test_tasks_started_after_cancel_are_not_born_cancelled() -> None:
    finished: list[str] = []

    async def hang() -> None:
        await anyio.sleep_forever()

    async def work(name: str) -> None:
        await _settle()
        finished.append(name)

    async with ExecutorHost() as host:
        group = host.new_runtime_group()
        group.start_soon(hang)
        group.cancel("first stop")  # cancelled before its supervisor even ran
        group.start_soon(work, "after")  # a fresh supervisor, not the cancelled one
        await group.wait_idle()
        assert finished == ["after"]
        # Idle: the supervisor has left; a later task gets a new one and the host still exits.
        group.start_soon(work, "later")
        await group.wait_idle()
        assert finished == ["after", "later"]


async def test_a_failing_runtime_task_cancels_the_host_body_and_surfaces_as_itself() -> None:
    boom = RuntimeError("runtime task failed")
    body_cancelled = False

    async def fails() -> None:
        await anyio.lowlevel.checkpoint()
        raise boom

    async def sibling() -> None:
        await anyio.sleep_forever()

    with pytest.raises(RuntimeError) as info, unwrap_group():
        async with ExecutorHost() as host:
            group = host.new_runtime_group()
            group.start_soon(sibling)
            group.start_soon(fails)
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                body_cancelled = True
                raise
    assert info.value is boom
    assert body_cancelled


# --- The item path: no cancel scope per attempt ------------------------------------------------


class _CountingScopes:
    """Stands in for the ``anyio`` module inside the engine: counts the cancel scopes it creates."""

    def __init__(self) -> None:
        self.created = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(anyio, name)

    def CancelScope(self, *args: Any, **kwargs: Any) -> anyio.CancelScope:
        self.created += 1
        return anyio.CancelScope(*args, **kwargs)


def _count_scopes(monkeypatch: pytest.MonkeyPatch) -> _CountingScopes:
    counting = _CountingScopes()
    for module in (item_module, guards_module, workers_module, publish_module):
        monkeypatch.setattr(module, "anyio", counting)
    return counting


def _flaky() -> CallableStrategy[str]:
    outcomes: dict[str, int] = {}

    async def flaky(prompt: str) -> str:
        outcomes[prompt] = outcomes.get(prompt, 0) + 1
        await anyio.lowlevel.checkpoint()
        if outcomes[prompt] % 3:
            raise ProviderError("503", category=ErrorCategory.SERVER)
        return prompt

    return CallableStrategy(flaky)


@pytest.mark.parametrize(
    ("guard", "attempt_timeout", "watched"),
    [
        (GuardrailConfig(), None, False),  # nothing can cut an attempt short: no watcher
        (GuardrailConfig(), 30.0, True),
        (GuardrailConfig(total_timeout_per_item=100.0), 30.0, True),
        (GuardrailConfig(batch_timeout=100.0, total_timeout_per_item=100.0), 30.0, True),
        (
            GuardrailConfig(
                abort_on_error_categories=frozenset({ErrorCategory.AUTHENTICATION}),
                abort_mode=AbortMode.CANCEL_ACTIVE,
            ),
            None,
            False,
        ),
    ],
)
@pytest.mark.parametrize("items", [6, 60])
async def test_no_cancel_scope_per_attempt_one_per_worker(
    monkeypatch: pytest.MonkeyPatch, guard: GuardrailConfig, attempt_timeout: float | None, watched: bool,
    items: int,
) -> None:
    counting = _count_scopes(monkeypatch)
    cfg = ProcessorConfig(
        concurrency=4,
        attempt_timeout=attempt_timeout,
        retry=RetryConfig(max_attempts=3, initial_wait=0.0, max_wait=0.0),
        guardrails=guard,
    )
    batch = await process_prompts(_flaky(), [f"p{i}" for i in range(items)], config=cfg)
    assert batch.succeeded == items
    assert sum(r.attempts for r in batch.results) == 3 * items
    # One guard scope per worker, and the watcher's own scope and its sleep (no deadline
    # comes during the batch): the same for 18 attempts as for 180.
    assert counting.created == 4 + (2 if watched else 0)


async def test_a_pool_request_has_one_cancel_scope_whatever_its_attempts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trio_batch_llm import LLMCallPool

    counting = _count_scopes(monkeypatch)
    retry = RetryConfig(max_attempts=3, initial_wait=0.0, max_wait=0.0)
    cfg = ProcessorConfig(attempt_timeout=30.0, retry=retry)
    async with LLMCallPool(_flaky(), config=cfg) as pool:
        results = [await pool.submit_result(f"p{i}", timeout=100.0) for i in range(5)]
    assert [r.attempts for r in results] == [3] * 5
    assert counting.created == 5


def _hangs_then(plan: dict[int, float]) -> CallableStrategy[str]:
    """Attempt n sleeps plan[n] seconds (default: forever) and then succeeds."""
    seen: dict[str, int] = {}

    async def fn(prompt: str) -> str:
        seen[prompt] = seen.get(prompt, 0) + 1
        await anyio.sleep(plan.get(seen[prompt], float("inf")))
        return prompt

    return CallableStrategy(fn)


@virtual
@pytest.mark.parametrize(
    ("attempt_timeout", "item_timeout", "batch_timeout", "ends_at", "category", "error_part", "attempts"),
    [
        # The attempt deadline alone: a TIMEOUT failure, retried (initial_wait 1 s) until out of attempts.
        (3.0, None, None, 3.0 + 1 + 3.0, ErrorCategory.TIMEOUT, "attempt 2 timed out after 3.0 s", 2),
        # Attempt and item deadline at the same instant: the item deadline wins (it was the outer scope).
        (5.0, 5.0, None, 5.0, ErrorCategory.DEADLINE, "total_timeout_per_item of 5.0 s", 1),
        # The item deadline during the second attempt.
        (3.0, 5.0, None, 5.0, ErrorCategory.DEADLINE, "total_timeout_per_item of 5.0 s", 2),
        # A backoff that would pass the item deadline is not started: the item ends at once.
        (3.0, 3.5, None, 3.0, ErrorCategory.DEADLINE, "leaves no room for a retry after 1 s", 1),
        # Batch and item deadline at the same instant: the batch's stop wins (cut short), and the
        # reason is the same whether the watcher task or the worker saw the deadline first.
        (3.0, 5.0, 5.0, 5.0, ErrorCategory.DEADLINE, "cut short: batch deadline (5.0 s) reached", 2),
        # The batch deadline during the backoff.
        (3.0, None, 3.5, 3.5, ErrorCategory.DEADLINE, "cut short: batch deadline (3.5 s) reached", 1),
    ],
)
async def test_which_deadline_fired_is_exact(
    attempt_timeout: float,
    item_timeout: float | None,
    batch_timeout: float | None,
    ends_at: float,
    category: ErrorCategory,
    error_part: str,
    attempts: int,
) -> None:
    cfg = ProcessorConfig(
        attempt_timeout=attempt_timeout,
        retry=RetryConfig(max_attempts=2, initial_wait=1.0, jitter=False),
        guardrails=GuardrailConfig(total_timeout_per_item=item_timeout, batch_timeout=batch_timeout),
    )
    t0 = anyio.current_time()
    (result,) = (await process_prompts(_hangs_then({}), ["p"], config=cfg)).results
    assert anyio.current_time() - t0 == ends_at
    assert (result.error_category, result.attempts) == (category, attempts)
    assert error_part in (result.error or "")
    if category is ErrorCategory.DEADLINE:
        assert isinstance(result.exception, ItemDeadlineExceeded)


@virtual
async def test_cancel_active_abort_cuts_an_item_in_its_backoff_and_releases_its_slot() -> None:
    async def fn(prompt: str) -> str:
        if prompt == "bad":
            await anyio.sleep(2.0)
            raise ProviderError("401", category=ErrorCategory.AUTHENTICATION)
        await anyio.lowlevel.checkpoint()
        raise ProviderError("503", category=ErrorCategory.SERVER)  # then backs off for 10 s

    cfg = ProcessorConfig(
        concurrency=2,
        retry=RetryConfig(max_attempts=3, initial_wait=10.0, jitter=False),
        guardrails=GuardrailConfig(
            abort_on_error_categories=frozenset({ErrorCategory.AUTHENTICATION}),
            abort_mode=AbortMode.CANCEL_ACTIVE,
        ),
    )
    strategy = CallableStrategy(fn)
    async with ParallelBatchProcessor[str](cfg) as proc:
        for prompt in ("flaky", "bad"):
            await proc.add_work(LLMWorkItem(item_id=prompt, strategy=strategy, prompt=prompt))
        t0 = anyio.current_time()
        batch = await proc.process_all()
        assert anyio.current_time() - t0 == 2.0
        admission = proc.host.quota_scope(strategy).statistics()
        assert admission.in_flight == 0
    flaky = batch.by_id()["flaky"]
    assert (flaky.error_category, flaky.attempts, flaky.exception) == (ErrorCategory.ABORTED, 1, None)
    assert flaky.timing.backoff == flaky.timing.total == 2.0  # cut in its wait: the time it waited counts


# --- Graceful and deadline stops: the queue drains in one tight loop ---------------------------


async def test_graceful_stop_reports_the_queue_in_one_loop_without_yielding() -> None:
    ticks = 0
    seen_at_tick: list[int] = []
    calls: list[str] = []

    class Ticks:
        def on_event(self, event: Any) -> None:
            if isinstance(event, ItemFailed) and event.result.error_category is ErrorCategory.NOT_EXECUTED:
                seen_at_tick.append(ticks)

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.lowlevel.checkpoint()

    go = anyio.Event()

    async def fn(prompt: str) -> str:
        calls.append(prompt)
        await go.wait()
        if prompt == "trigger":
            raise ProviderError("401", category=ErrorCategory.AUTHENTICATION)
        await _settle()
        return prompt

    guard = GuardrailConfig(
        abort_on_error_categories=frozenset({ErrorCategory.AUTHENTICATION}), abort_mode=AbortMode.DRAIN_ACTIVE
    )
    strategy = CallableStrategy(fn)
    queued = 300
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        async with ParallelBatchProcessor[str](
            ProcessorConfig(concurrency=4, guardrails=guard), observers=[Ticks()]
        ) as proc:
            prompts = ["trigger", "a", "b", "c"] + [f"q{i}" for i in range(queued)]
            for i, prompt in enumerate(prompts):
                await proc.add_work(LLMWorkItem(item_id=f"i{i}", strategy=strategy, prompt=prompt))

            async def release() -> None:
                while len(calls) < 4:
                    await anyio.lowlevel.checkpoint()
                go.set()

            tg.start_soon(release)
            batch = await proc.process_all()
        tg.cancel_scope.cancel()
    assert sorted(calls) == ["a", "b", "c", "trigger"]  # no queued item ran
    assert batch.termination.kind == "aborted"
    assert (batch.total_items, batch.succeeded) == (len(prompts), 3)
    assert len(seen_at_tick) == queued
    assert len(set(seen_at_tick)) == 1  # the whole queue between two checkpoints of another task
    reason = f"not executed: {batch.termination.reason}"
    by_id = batch.by_id()
    for result in (by_id[f"i{i}"] for i in range(4, len(prompts))):
        assert result.error_category is ErrorCategory.NOT_EXECUTED
        assert (result.error, result.exception, result.attempts, result.token_usage) == (reason, None, 0, {})
        assert result.timing.total == 0.0


@virtual
async def test_batch_deadline_cut_short_and_not_executed_results_keep_their_shape() -> None:
    async def hang(prompt: str) -> str:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    cfg = ProcessorConfig(concurrency=3, guardrails=GuardrailConfig(batch_timeout=4.0))
    batch = await process_prompts(CallableStrategy(hang), [f"p{i}" for i in range(30)], config=cfg)
    assert batch.termination.kind == "batch_deadline"
    cut = [r for r in batch.results if r.error_category is ErrorCategory.DEADLINE]
    rest = [r for r in batch.results if r.error_category is ErrorCategory.NOT_EXECUTED]
    assert (len(cut), len(rest)) == (3, 27)
    for r in cut:
        assert isinstance(r.exception, ItemDeadlineExceeded)
        assert r.error == (f"ItemDeadlineExceeded: item {r.item_id!r}: cut short: "
                           "batch deadline (4.0 s) reached")
        assert (r.attempts, r.timing.total) == (1, 4.0)
    assert {(r.error, r.exception, r.attempts) for r in rest} == {
        ("not executed: batch deadline (4.0 s) reached", None, 0)
    }
    assert len({id(r.token_usage) for r in rest}) == 27  # every result owns its own mutable parts


async def test_workers_leave_as_soon_as_their_own_item_is_done_after_a_stop() -> None:
    release: dict[str, anyio.Event] = {}

    async def fn(prompt: str) -> str:
        await release[prompt].wait()
        return prompt

    strategy = CallableStrategy(fn)
    async with ParallelBatchProcessor[str](ProcessorConfig(concurrency=3)) as proc:
        proc.start()
        for prompt in ("a", "b", "c", "queued-1", "queued-2"):
            release[prompt] = anyio.Event()
            await proc.add_work(LLMWorkItem(item_id=prompt, strategy=strategy, prompt=prompt))
        await _settle()
        proc.request_stop("enough")
        release["a"].set()
        results = proc.results()
        got = [await results.__anext__() for _ in range(3)]
        assert [r.item_id for r in got] == ["a", "queued-1", "queued-2"]
        assert all(r.error_category is ErrorCategory.NOT_EXECUTED for r in got[1:])
        await _settle()
        assert proc.statistics().workers == 2  # the one that finished "a" is gone
        release["b"].set()
        release["c"].set()
        rest = [r async for r in results]
        assert sorted(r.item_id for r in rest) == ["b", "c"] and all(r.success for r in rest)


@pytest.mark.parametrize("enabled_before", [True, False])
async def test_the_queue_drain_pauses_the_collector_and_leaves_it_as_found(enabled_before: bool) -> None:
    # Every result the drain builds survives, so a collection in the middle of it can free nothing.
    during: list[bool] = []

    class Watch:
        def on_event(self, event: Any) -> None:
            if isinstance(event, ItemFailed) and event.result.error_category is ErrorCategory.NOT_EXECUTED:
                during.append(gc.isenabled())

    async def fn(prompt: str) -> str:
        await anyio.lowlevel.checkpoint()
        if prompt == "trigger":
            raise ProviderError("401", category=ErrorCategory.AUTHENTICATION)
        return prompt

    guard = GuardrailConfig(
        abort_on_error_categories=frozenset({ErrorCategory.AUTHENTICATION}), abort_mode=AbortMode.DRAIN_ACTIVE
    )
    strategy = CallableStrategy(fn)
    was = gc.isenabled()
    if not enabled_before:
        gc.disable()
    try:
        async with ParallelBatchProcessor[str](
            ProcessorConfig(concurrency=1, guardrails=guard), observers=[Watch()]
        ) as proc:
            for i, prompt in enumerate(["trigger"] + [f"q{i}" for i in range(50)]):
                await proc.add_work(LLMWorkItem(item_id=f"i{i}", strategy=strategy, prompt=prompt))
            batch = await proc.process_all()
        assert gc.isenabled() is enabled_before
    finally:
        if was:
            gc.enable()
    assert batch.failed == 51
    assert during == [False] * 50



@pytest.mark.parametrize("enabled_before", [True, False])
@pytest.mark.parametrize("stop", ["deadline", "graceful"])
async def test_a_stop_defers_full_collections_until_process_all_returns(
    enabled_before: bool, stop: str,
) -> None:
    # Settling every call in flight and reporting the queue is a burst of survivors: a full
    # collection due in it ran inside the drain (deadline: 20-35 ms of ~90 at N = 1,000; graceful:
    # 25-28 ms of ~65). It runs after the call; the young generations are collected meanwhile.
    found = gc.get_threshold()
    seen: list[int] = []  # the oldest generation's threshold as each call in flight ended
    release = anyio.Event()

    async def fn(prompt: str) -> str:
        if prompt == "trigger":
            await anyio.lowlevel.checkpoint()
            raise ProviderError("401", category=ErrorCategory.AUTHENTICATION)
        try:
            if stop == "deadline":
                await anyio.sleep_forever()
            await release.wait()
        finally:
            seen.append(gc.get_threshold()[2])
        return prompt

    was = gc.isenabled()
    if not enabled_before:
        gc.disable()
    try:
        strategy = CallableStrategy(fn)
        if stop == "deadline":
            guard = GuardrailConfig(batch_timeout=0.05)
        else:
            guard = GuardrailConfig(abort_on_error_categories=frozenset({ErrorCategory.AUTHENTICATION}),
                                    abort_mode=AbortMode.DRAIN_ACTIVE)
        class LetGo:  # the calls in flight end once the stop has reported the queue
            def on_event(self, event: Any) -> None:
                failed = isinstance(event, ItemFailed)
                if failed and event.result.error_category is ErrorCategory.NOT_EXECUTED:
                    release.set()

        async with ParallelBatchProcessor[str](ProcessorConfig(concurrency=4, guardrails=guard),
                                               observers=[LetGo()]) as proc:
            prompts = ["p"] * 3 + ["trigger" if stop == "graceful" else "p"] + ["q"] * 16
            for i, prompt in enumerate(prompts):
                await proc.add_work(LLMWorkItem(item_id=f"i{i}", strategy=strategy, prompt=prompt))
            batch = await proc.process_all()
            assert gc.get_threshold() == found  # back as found once process_all returned
        assert gc.isenabled() is enabled_before and gc.get_threshold() == found
    finally:
        if was:
            gc.enable()
    assert batch.failed == (20 if stop == "deadline" else 17)
    deferred = collector_module.DEFERRED if enabled_before else found[2]
    assert seen == [deferred] * (4 if stop == "deadline" else 3)


def test_the_collector_pause_is_bounded_and_leaves_the_applications_settings_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(collector_module.time, "perf_counter", lambda: now[0])
    was, found = gc.isenabled(), gc.get_threshold()
    gc.enable()
    gc.set_threshold(700, 10, 10)
    deferred = collector_module.DEFERRED
    try:
        pause = collector_module.CollectorPause()
        pause.begin()
        assert gc.isenabled() and gc.get_threshold() == (700, 10, deferred) and pause.active
        now[0] += collector_module.MAX_PAUSE_SECONDS - 0.01
        pause.check()
        assert gc.get_threshold() == (700, 10, deferred)
        now[0] += 0.02
        pause.check()  # a drain waiting on a slow store, a stream or long calls: full collections again
        assert gc.get_threshold() == (700, 10, 10) and not pause.active
        pause.end()  # idempotent
        assert gc.get_threshold() == (700, 10, 10)

        other = collector_module.CollectorPause()  # two processors stopping at once
        pause.begin()
        other.begin()
        assert not other.active  # inside the first one's pause: nothing of its own to restore
        other.end()
        assert gc.get_threshold() == (700, 10, deferred)
        pause.end()
        assert gc.get_threshold() == (700, 10, 10)

        pause.begin()
        gc.set_threshold(500, 5, 5)  # the application's own setting, made during the pause, stays
        pause.end()
        assert gc.get_threshold() == (500, 5, 5)

        gc.disable()  # the application's own pause: begin() and end() leave it alone
        pause.begin()
        assert not pause.active and gc.get_threshold() == (500, 5, 5)
        pause.end()
        assert not gc.isenabled()
    finally:
        gc.set_threshold(*found)
        if was:
            gc.enable()
        else:
            gc.disable()


@virtual
async def test_a_close_before_the_batch_deadline_is_an_interruption_not_a_deadline() -> None:
    async def hang(prompt: str) -> str:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    cfg = ProcessorConfig(concurrency=2, guardrails=GuardrailConfig(batch_timeout=5.0))
    strategy = CallableStrategy(hang)
    outcome: list[BaseException] = []
    async with ParallelBatchProcessor[str](cfg) as proc:
        for i in range(4):
            await proc.add_work(LLMWorkItem(item_id=f"p{i}", strategy=strategy, prompt=f"p{i}"))

        async def run() -> None:
            try:
                await proc.process_all()
            except BatchInterruptedError as exc:
                outcome.append(exc)

        async with anyio.create_task_group() as tg:
            t0 = anyio.current_time()
            tg.start_soon(run)
            await anyio.sleep(1.0)
            await proc.aclose()
            assert anyio.current_time() - t0 == 1.0
    assert len(outcome) == 1 and proc.termination.kind == "interrupted"
    assert proc.counters.finished == 0


class _CountingCheckpoints:
    """Stands in for the ``anyio`` module inside ``_publish``: counts ``lowlevel.checkpoint()`` calls."""

    def __init__(self) -> None:
        self.count = 0
        outer = self

        class _Lowlevel:
            def __getattr__(self, name: str) -> Any:
                return getattr(anyio.lowlevel, name)

            async def checkpoint(self) -> None:
                outer.count += 1
                await anyio.lowlevel.checkpoint()

        self.lowlevel = _Lowlevel()

    def __getattr__(self, name: str) -> Any:
        return getattr(anyio, name)


async def test_a_long_queue_is_reported_in_chunks_with_one_checkpoint_between_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counting = _CountingCheckpoints()
    monkeypatch.setattr(publish_module, "anyio", counting)
    seen_at_checkpoint: list[int] = []

    class Watch:
        def on_event(self, event: Any) -> None:
            if isinstance(event, ItemFailed) and event.result.error_category is ErrorCategory.NOT_EXECUTED:
                seen_at_checkpoint.append(counting.count)

    async def fn(prompt: str) -> str:
        await anyio.lowlevel.checkpoint()
        raise ProviderError("401", category=ErrorCategory.AUTHENTICATION)

    guard = GuardrailConfig(
        abort_on_error_categories=frozenset({ErrorCategory.AUTHENTICATION}), abort_mode=AbortMode.DRAIN_ACTIVE
    )
    strategy = CallableStrategy(fn)
    queued = 2 * DRAIN_CHUNK + 500
    async with ParallelBatchProcessor[str](
        ProcessorConfig(concurrency=1, guardrails=guard), observers=[Watch()]
    ) as proc:
        for i in range(queued + 1):
            await proc.add_work(LLMWorkItem(item_id=f"i{i}", strategy=strategy, prompt="p"))
        batch = await proc.process_all()
    assert batch.failed == queued + 1
    # One checkpoint after each full chunk (other tasks, e.g. calls still in flight, run there);
    # none within a chunk.
    assert list(Counter(seen_at_checkpoint).values()) == [DRAIN_CHUNK, DRAIN_CHUNK, 500]
    assert len(set(seen_at_checkpoint)) == 3 and sorted(seen_at_checkpoint) == seen_at_checkpoint


async def test_a_worker_takes_queued_items_without_a_scheduler_round_up_to_a_streak() -> None:
    """A queued item is taken at once (an HTTP connection handed back is checked out again without
    sitting idle in the pool), but never more than NOWAIT_STREAK in a row without a real round."""
    from trio_batch_llm import CallableStrategy
    from trio_batch_llm._engine._workers import NOWAIT_STREAK

    rounds = 0
    seen: list[int] = []

    async def ticker() -> None:
        nonlocal rounds
        while True:
            rounds += 1
            await anyio.lowlevel.checkpoint()

    async def answer(prompt: str) -> str:  # never awaits: only the engine can yield
        seen.append(rounds)
        return prompt

    prompts = [f"p{n}" for n in range(3 * NOWAIT_STREAK)]
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        result = await process_prompts(CallableStrategy(answer), prompts, concurrency=1)
        tg.cancel_scope.cancel()
    assert result.succeeded == len(prompts)
    streaks = [len(list(group)) for _, group in itertools.groupby(seen)]
    # A round every NOWAIT_STREAK items at least; two streaks can see the same tick when the
    # scheduler runs the ticker before the worker in one batch and after it in the next (Trio).
    assert max(streaks) <= 2 * NOWAIT_STREAK + 1
    assert 2 <= len(streaks) <= 4  # a few rounds for 48 items, not one per item


async def test_an_item_that_finishes_as_a_stop_cuts_calls_keeps_its_result_and_its_after_hook() -> None:
    # A stop that cuts calls records itself on every guard at once, but on asyncio cancels their
    # scopes from a loop callback a moment later (_backends.cancel_scopes). A call that returned
    # in that moment must not await its after-hook inside a scope about to be cancelled: the hook
    # would be cut off and run again, and the finished call reported as cut short.
    from trio_batch_llm import BaseMiddleware, WorkItemResult

    release = anyio.Event()
    after: Counter[str] = Counter()

    async def fn(prompt: str) -> str:
        if prompt == "trigger":
            await anyio.lowlevel.checkpoint()
            raise ProviderError("401", category=ErrorCategory.AUTHENTICATION)
        if prompt == "b":
            await release.wait()
            return "b done"
        await anyio.sleep_forever()
        raise AssertionError("cancelled")

    class ReleaseAtTheStop:  # "b" returns in the instant the stop is decided
        def on_event(self, event: Any) -> None:
            if isinstance(event, ItemFailed) and event.result.item_id == "t":
                release.set()

    class SlowAfter(BaseMiddleware):
        async def after_process(self, result: WorkItemResult[Any]) -> WorkItemResult[Any]:
            after[result.item_id] += 1
            await anyio.lowlevel.checkpoint()
            await anyio.lowlevel.checkpoint()
            return result

    guard = GuardrailConfig(abort_on_error_categories=frozenset({ErrorCategory.AUTHENTICATION}),
                            abort_mode=AbortMode.CANCEL_ACTIVE)
    async with ParallelBatchProcessor[str](ProcessorConfig(concurrency=3, guardrails=guard),
                                           middlewares=[SlowAfter()], observers=[ReleaseAtTheStop()]) as proc:
        for item_id, prompt in [("b", "b"), ("x", "x"), ("t", "trigger"), ("q", "q")]:
            await proc.add_work(LLMWorkItem(item_id=item_id, strategy=CallableStrategy(fn), prompt=prompt))
        batch = await proc.process_all()
    by_id = batch.by_id()
    assert len(batch.results) == 4 and set(by_id) == {"b", "x", "t", "q"}
    assert (by_id["b"].success, by_id["b"].output) == (True, "b done")
    assert by_id["x"].error_category is ErrorCategory.ABORTED
    assert by_id["q"].error_category is ErrorCategory.NOT_EXECUTED
    assert after["b"] == 1  # once, not cut off and run again
