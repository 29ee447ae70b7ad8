"""Admission through the engine: shared cooldowns, shared scopes, pool bounds, no leaks."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

from trio_batch_llm import (
    AdmissionClosedError,
    CallableStrategy,
    ErrorCategory,
    ExecutorHost,
    FakeStrategy,
    LLMCallPool,
    LLMWorkItem,
    ParallelBatchProcessor,
    ProcessorConfig,
    ProviderError,
    QueueFullError,
    RateLimitConfig,
    RetryConfig,
    process_prompts,
)

from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio

TRIO_VIRTUAL = pytest.mark.parametrize(
    "anyio_backend", [pytest.param(trio_virtual_clock(), id="trio-virtual")]
)


@TRIO_VIRTUAL
async def test_one_429_pauses_all_50_workers_for_the_cooldown() -> None:
    starts: list[tuple[float, str, int]] = []
    rate_limited_at: list[float] = []

    async def fn(prompt: str, *, attempt: int) -> str:
        starts.append((anyio.current_time(), prompt, attempt))
        if prompt == "p7" and attempt == 1:
            await anyio.sleep(0.5)
            rate_limited_at.append(anyio.current_time())
            raise ProviderError("429", category=ErrorCategory.RATE_LIMIT, retry_after=5.0, status_code=429)
        await anyio.sleep(1.0)
        return prompt

    config = ProcessorConfig(
        concurrency=50,
        rate_limit=RateLimitConfig(slow_start_seconds=0.0),
        retry=RetryConfig(max_rate_limit_retries=3),
        circuit_breaker=None,  # all 50 calls at t=0, not the breaker's start bound (10 until an answer)
    )
    t0 = anyio.current_time()
    batch = await process_prompts(CallableStrategy(fn), [f"p{i}" for i in range(200)], config=config)
    assert batch.succeeded == 200
    (hit,) = rate_limited_at
    assert hit - t0 == 0.5
    # Nobody in the scope started a call during the 5 s cooldown; calls in flight finished.
    during = [s for s in starts if hit <= s[0] < hit + 5.0]
    assert during == []
    after = sorted(s[0] for s in starts if s[0] >= hit)
    assert after[0] - t0 == 5.5
    assert (after[0], "p7", 2) in starts


@TRIO_VIRTUAL
async def test_slow_start_ramp_after_cooldown() -> None:
    starts: list[float] = []
    first = [True]

    async def fn(prompt: str) -> str:
        starts.append(anyio.current_time())
        if first[0]:
            first[0] = False
            raise ProviderError("429", category=ErrorCategory.RATE_LIMIT, retry_after=2.0)
        await anyio.sleep(1.0)
        return prompt

    config = ProcessorConfig(
        concurrency=8,
        # The ramp as learning off has it (with learning, one call goes first: test_pacing_scope.py).
        rate_limit=RateLimitConfig(slow_start_seconds=4.0, slow_start_initial_fraction=0.25,
                                   learn_limits=False),
    )
    t0 = anyio.current_time()
    await process_prompts(CallableStrategy(fn), [f"p{i}" for i in range(40)], config=config)
    reopened = [s - t0 for s in starts if s - t0 >= 2.0]
    # At the end of the cooldown only a quarter of the 8 slots reopen; more follow as the ramp grows.
    assert sum(1 for s in reopened if s == 2.0) == 2
    assert max(sum(1 for s in reopened if w <= s < w + 1.0) for w in (2.0, 3.0)) < 8


async def test_two_processors_on_one_host_share_the_scope() -> None:
    in_flight = 0
    peak = 0

    async def fn(prompt: str) -> str:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await anyio.sleep(0.002)
        in_flight -= 1
        return prompt

    strategy = CallableStrategy(fn, identity="shared-endpoint")
    async with ExecutorHost(ProcessorConfig(concurrency=3)) as host:
        results = []

        async def run(tag: str) -> None:
            async with ParallelBatchProcessor[str](ProcessorConfig(concurrency=3), host=host) as proc:
                for i in range(30):
                    await proc.add_work(LLMWorkItem(item_id=f"{tag}{i}", strategy=strategy, prompt="x"))
                results.append(await proc.process_all())

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "a")
            tg.start_soon(run, "b")
        scope_stats = host.quota_scope(strategy).statistics()
    assert [r.succeeded for r in results] == [30, 30]
    assert peak == 3  # six workers in all, but one scope of three slots
    assert scope_stats.admitted_total == 60 and scope_stats.in_flight == 0


async def test_cancelled_pool_submitter_leaks_nothing() -> None:
    started = anyio.Event()

    async def hang(prompt: str) -> str:
        started.set()
        await anyio.sleep_forever()
        return prompt  # pragma: no cover

    config = ProcessorConfig(concurrency=2, max_tokens_per_minute=10_000, max_requests_per_minute=600)
    async with LLMCallPool[str](CallableStrategy(hang), config=config) as pool:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(pool.submit_result, "p")
                await started.wait()
                await anyio.lowlevel.checkpoint()
                busy = pool.statistics()
                scope.cancel()
        assert busy.pending == 3 and busy.admission.in_flight == 2 and busy.admission.waiting == 1
        idle = pool.statistics()
        assert idle.pending == 0
        assert idle.admission.in_flight == 0 and idle.admission.waiting == 0
        # Unknown usage of the cut-short calls keeps their token reservations (never a silent zero).
        assert idle.admission.tokens_reserved_in_window is not None
        assert idle.admission.tokens_reserved_in_window > 0
    assert pool.state == "closed"


@pytest.mark.parametrize("max_pending", [0, 2])
async def test_queue_full_exactly_at_concurrency_plus_max_pending(max_pending: int) -> None:
    gate = anyio.Event()

    async def gated(prompt: str) -> str:
        await gate.wait()
        return prompt

    async with LLMCallPool[str](
        CallableStrategy(gated), config=ProcessorConfig(concurrency=3), max_pending=max_pending
    ) as pool:
        results: list[Any] = []
        async with anyio.create_task_group() as tg:
            for _ in range(3 + max_pending):
                tg.start_soon(lambda: _collect(pool, results))
            for _ in range(10):
                await anyio.lowlevel.checkpoint()
            assert pool.pending == 3 + max_pending
            with pytest.raises(QueueFullError, match=f"concurrency \\+ max_pending = {3 + max_pending}"):
                await pool.submit("one too many")
            refused = await pool.submit_result("one too many")
            assert not refused.success and refused.error_category is ErrorCategory.NOT_EXECUTED
            gate.set()
        assert len(results) == 3 + max_pending and all(r == "x" for r in results)


async def _collect(pool: LLMCallPool[str], results: list[Any]) -> None:
    results.append(await pool.submit("x"))


async def test_closing_pool_rejects_new_requests_and_admission_closes() -> None:
    pool = LLMCallPool[str](FakeStrategy())
    async with pool:
        assert await pool.submit("a") == "echo: a"
    with pytest.raises(AdmissionClosedError):
        await pool.submit("b")
    assert pool.statistics().admission.closed


@TRIO_VIRTUAL
async def test_rpm_limit_holds_through_the_engine() -> None:
    starts: list[float] = []

    async def fn(prompt: str) -> str:
        starts.append(anyio.current_time())
        await anyio.lowlevel.checkpoint()
        return prompt

    config = ProcessorConfig(concurrency=20, max_requests_per_minute=30)
    await process_prompts(CallableStrategy(fn), [f"p{i}" for i in range(75)], config=config)
    starts.sort()
    for i, t in enumerate(starts):
        in_window = [s for s in starts[i:] if s < t + 60.0]
        assert len(in_window) <= 30
    assert starts[-1] - starts[0] >= 120.0


@TRIO_VIRTUAL
async def test_rpm_limit_holds_at_the_provider_whatever_the_transit_time() -> None:
    # Each call spends 0-20 s in transit before it reaches the provider, then
    # some more before its answer is back. Counting a request from its
    # admission for 60 s lets one provider window catch the late arrivals of
    # one minute's burst and the early ones of the next (the 20x-speed run saw
    # 532 arrivals in 60 s at RPM 500); counting it until 60 s after its call
    # ended cannot, whatever the transit time.
    rpm = 10
    arrivals: list[float] = []

    async def fn(prompt: str) -> str:
        index = int(prompt[1:])
        await anyio.sleep(float(index * 7 % 21))  # transit: 0 to 20 s
        arrivals.append(anyio.current_time())
        await anyio.sleep(float(index % 3))  # the answer's way back
        return prompt

    config = ProcessorConfig(concurrency=50, max_requests_per_minute=rpm)
    t0 = anyio.current_time()
    with anyio.fail_after(10_000):
        batch = await process_prompts(CallableStrategy(fn), [f"p{i}" for i in range(60)], config=config)
    assert batch.succeeded == 60
    arrivals.sort()
    for i, t in enumerate(arrivals):
        assert len([a for a in arrivals[i:] if a < t + 60.0]) <= rpm
    # The price is each call's duration per minute of quota, no more: six
    # rounds of at most 60 s + 22 s each.
    assert arrivals[-1] - t0 <= 6 * 82.0


async def _waiting(scope: Any, count: int) -> None:
    while scope.statistics().waiting < count:
        await anyio.lowlevel.checkpoint()


async def test_an_admission_cancelled_before_its_call_is_refunded() -> None:
    calls: list[str] = []

    async def fn(prompt: str) -> str:
        calls.append(prompt)
        await anyio.lowlevel.checkpoint()
        return prompt

    strategy = CallableStrategy(fn, identity="refunds")
    config = ProcessorConfig(concurrency=1, max_requests_per_minute=2)
    async with ExecutorHost(config) as host, LLMCallPool[str](strategy, config=config, host=host) as pool:
        scope = host.quota_scope(strategy)
        holder = scope.try_admit_nowait()  # the test holds the only slot
        with anyio.CancelScope() as cancel:
            async with anyio.create_task_group() as tg:
                tg.start_soon(pool.submit_result, "doomed")
                await _waiting(scope, 1)
                holder.release()  # grants the submitter its admission ...
                cancel.cancel()  # ... and it is cancelled before its call starts
        stats = scope.statistics()
        assert calls == []  # the provider never saw it
        assert (stats.in_flight, stats.waiting) == (0, 0)
        assert stats.requests_in_window == 1  # the holder's only: the doomed unit came back
        assert scope.ready_at() <= anyio.current_time()
