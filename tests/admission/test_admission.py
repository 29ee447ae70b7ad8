"""Quota scopes under real tasks: cooldown storms, Retry-After, slow start, cancellation, close, FIFO.

Both backends run on virtual time, so every time below is exact: Trio under
``MockClock(autojump_threshold=0)``, asyncio under a selector loop whose clock
jumps to the next timer whenever nothing is runnable (``VirtualTimeLoop``).
Durations are binary fractions so that sums of them are exact floats.
"""

from __future__ import annotations

import asyncio
import math
import selectors
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_batch_llm import AdmissionClosedError, ProcessorConfig, RateLimitConfig
from trio_batch_llm._admission import Admission, QuotaRegistry, QuotaScope
from trio_batch_llm._admission._core import Grant, QuotaCore
from trio_batch_llm._admission._limits import CooldownCore

from ..conftest import trio_virtual_clock
from .test_admission_stateful import max_overlap

pytestmark = pytest.mark.anyio


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """asyncio with virtual time: when nothing is ready, jump to the next timer instead of sleeping."""

    def __init__(self) -> None:
        super().__init__(selectors.SelectSelector())
        self._virtual_now = 0.0
        real_select = self._selector.select  # type: ignore[attr-defined]

        def select(timeout: float | None = None) -> Any:
            events = real_select(0)
            if events or timeout == 0:
                return events
            if timeout is None:
                return real_select(None)
            self._virtual_now += timeout
            return []

        self._selector.select = select  # type: ignore[attr-defined]

    def time(self) -> float:
        return self._virtual_now


@pytest.fixture(scope="module", params=[
    pytest.param(("asyncio", {"loop_factory": VirtualTimeLoop}), id="asyncio"),
    pytest.param(trio_virtual_clock(), id="trio"),
])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


class Stopwatch:
    """Seconds since the test started: one virtual clock serves the whole module, so times are relative."""

    def __init__(self) -> None:
        self.start = anyio.current_time()

    def __call__(self) -> float:
        return anyio.current_time() - self.start


def rate_limit(cooldown: float = 5.0, ramp: float = 0.0, fraction: float = 0.25,
               max_cooldown: float = 120.0, learn: bool = False) -> RateLimitConfig:
    # These tests specify the cooldown every 429 starts when learning is off
    # (learning keeps it only for a Retry-After; see test_pacing_scope.py).
    return RateLimitConfig(cooldown_seconds=cooldown, backoff_multiplier=2.0,
                           max_cooldown_seconds=max_cooldown, slow_start_seconds=ramp,
                           slow_start_initial_fraction=fraction, learn_limits=learn)


async def wait_until_waiting(scope: QuotaScope, count: int) -> None:
    """Let tasks run (no virtual time passes) until ``count`` of them wait in the scope."""
    while scope.statistics().waiting < count:
        await anyio.lowlevel.checkpoint()


def assert_idle(scope: QuotaScope) -> None:
    stats = scope.statistics()
    assert (stats.in_flight, stats.waiting) == (0, 0)
    assert stats.tokens_reserved_in_window in (None, 0)
    assert stats.requests_in_window in (None, 0)


# -- the uncontended path ---------------------------------------------------


async def test_uncontended_admit_and_release() -> None:
    scope = QuotaScope(concurrency=2)
    first = scope.try_admit_nowait()
    second = await scope.admit()
    assert scope.statistics().in_flight == 2
    with pytest.raises(anyio.WouldBlock):
        scope.try_admit_nowait()
    first.release()
    first.release()  # idempotent: the slot is not freed twice
    assert scope.statistics().in_flight == 1
    second.release(actual_tokens=50)
    stats = scope.statistics()
    assert (stats.in_flight, stats.waiting, stats.admitted_total) == (0, 0, 2)
    assert stats.concurrency_limit == 2
    assert (stats.requests_in_window, stats.tokens_available) == (None, None)


async def test_admit_in_a_cancelled_scope_admits_nothing() -> None:
    scope = QuotaScope(concurrency=1)
    with anyio.CancelScope() as cancel:
        cancel.cancel()
        await scope.admit()
        pytest.fail("admit() did not see the cancellation")
    assert cancel.cancelled_caught
    assert_idle(scope)


async def test_admit_is_a_schedule_point_on_every_path(anyio_backend: Any) -> None:
    scope = QuotaScope(concurrency=1)
    if isinstance(anyio_backend, tuple) and anyio_backend[0] == "trio":
        from trio.testing import assert_checkpoints

        with assert_checkpoints():
            admission = await scope.admit()  # the uncontended path
        admission.release()
    # A scope that is closed raises at once, without admitting anything.
    scope.close()
    with pytest.raises(AdmissionClosedError):
        await scope.admit()
    assert scope.statistics().admitted_total == (1 if isinstance(anyio_backend, tuple)
                                                 and anyio_backend[0] == "trio" else 0)


async def test_ready_at_tells_when_the_next_request_fits() -> None:
    scope = QuotaScope(concurrency=2, requests_per_minute=2, tokens_per_minute=1000)
    start = anyio.current_time()
    assert scope.ready_at(1000) <= start
    first = scope.try_admit_nowait(600)
    assert scope.ready_at(500) == start + 60.0  # the TPM window
    second = scope.try_admit_nowait(100)
    assert scope.ready_at(0) == math.inf  # both slots taken: only a release helps
    first.release(600)
    assert scope.ready_at(0) == start + 60.0  # the RPM window
    second.release(100)


async def test_bad_arguments() -> None:
    scope = QuotaScope(concurrency=1, tokens_per_minute=100)
    with pytest.raises(ValueError, match="tokens=-1"):
        scope.try_admit_nowait(-1)
    with pytest.raises(ValueError, match="tokens=True"):
        scope.try_admit_nowait(True)
    with pytest.raises(ValueError, match=r"tokens=1\.5"):
        scope.try_admit_nowait(1.5)  # type: ignore[arg-type]
    assert_idle(scope)


async def test_an_admission_gives_back_only_to_its_own_scope() -> None:
    # An admission carries its scope: there is no way to release it into another one.
    scope = QuotaScope(concurrency=1, requests_per_minute=10)
    other = QuotaScope(concurrency=1, requests_per_minute=10)
    admission = other.try_admit_nowait()
    held = scope.try_admit_nowait()
    admission.release()
    assert (scope.statistics().in_flight, other.statistics().in_flight) == (1, 0)
    assert admission.released and not held.released
    held.release_unused()
    assert_idle(scope)


async def test_every_release_is_idempotent_and_the_first_one_counts() -> None:
    now = Stopwatch()
    scope = QuotaScope(concurrency=2, requests_per_minute=10, tokens_per_minute=1000)
    unused = scope.try_admit_nowait(300)
    unused.release_unused()
    unused.release(300)  # a no-op: it stays refunded
    unused.release_rate_limited(retry_after=5.0)  # a no-op: no cooldown from a released call
    limited = scope.try_admit_nowait(300)
    limited.release_rate_limited(retry_after=5.0, actual_tokens=100)
    limited.release(10_000)  # a no-op: its settlement stands
    limited.release_unused()  # a no-op: its RPM unit still counts
    stats = scope.statistics()
    assert (stats.in_flight, stats.rate_limits_reported) == (0, 1)
    assert (stats.requests_in_window, stats.tokens_reserved_in_window) == (1, 100)
    assert stats.cooldown_remaining == 5.0
    assert now() == 0.0


# -- FIFO -------------------------------------------------------------------


async def test_waiters_are_admitted_in_arrival_order() -> None:
    now = Stopwatch()
    scope = QuotaScope(concurrency=1)
    holder = scope.try_admit_nowait()
    order: list[int] = []

    async def waiter(index: int) -> None:
        admission = await scope.admit()
        order.append(index)
        await anyio.sleep(1.0)
        admission.release()

    async with anyio.create_task_group() as tg:
        for index in range(5):
            tg.start_soon(waiter, index)
            await wait_until_waiting(scope, index + 1)
        holder.release()
    assert order == [0, 1, 2, 3, 4]
    assert now() == 5.0
    assert_idle(scope)


async def test_large_request_is_not_starved_by_small_ones() -> None:
    now = Stopwatch()
    scope = QuotaScope(concurrency=100, tokens_per_minute=1000)
    admitted: dict[str, float] = {}

    async def request(name: str, tokens: int) -> None:
        admission = await scope.admit(tokens)
        admitted[name] = now()
        await anyio.sleep(0.5)
        admission.release(None)  # usage unknown: the reservation stands

    async with anyio.create_task_group() as tg:
        for second in range(8):
            tg.start_soon(request, f"small-{second}", 100)
            if second == 2:
                await anyio.sleep(0.5)
                tg.start_soon(request, "large", 900)
                await anyio.sleep(0.5)
            else:
                await anyio.sleep(1.0)
    # The large request needs the 0 s and 1 s reservations to leave the window.
    assert admitted["large"] == 61.0
    assert [admitted[f"small-{s}"] for s in range(3)] == [0.0, 1.0, 2.0]
    # Nobody who came after it went first, though each small one would have fit.
    assert all(admitted[f"small-{s}"] >= 61.0 for s in range(3, 8))
    assert admitted["small-3"] == 62.0  # 900 + the 2 s reservation leave room at 62


async def test_requests_per_minute_window_is_exact() -> None:
    now = Stopwatch()
    scope = QuotaScope(concurrency=10, requests_per_minute=3)
    times: list[float] = []

    async def request() -> None:
        admission = await scope.admit()
        times.append(now())
        admission.release()

    async with anyio.create_task_group() as tg:
        for _ in range(7):
            tg.start_soon(request)
    assert times == [0.0, 0.0, 0.0, 60.0, 60.0, 60.0, 120.0]


@pytest.mark.parametrize(("rpm", "expected"), [(2.5, [0.0, 0.0, 60.0, 60.0]), (0.5, [0.0, 120.0, 240.0])])
async def test_fractional_requests_per_minute(rpm: float, expected: list[float]) -> None:
    now = Stopwatch()
    scope = QuotaScope(concurrency=10, requests_per_minute=rpm)
    times: list[float] = []
    for _ in expected:
        (await scope.admit()).release()
        times.append(now())
    assert times == expected


@pytest.mark.parametrize("outcome", ["release", "release_rate_limited"])
async def test_a_request_counts_until_a_minute_after_its_call_ended(outcome: str) -> None:
    # The provider counts a request from when it arrives, which may be as late
    # as the call's end; so the scope counts it from admission to end + 60 s.
    # Nobody waits and there is no token limit: this is the release fast path.
    now = Stopwatch()
    scope = QuotaScope(concurrency=10, requests_per_minute=1, rate_limit=rate_limit(cooldown=1.0))
    call = scope.try_admit_nowait()
    await anyio.sleep(30.0)
    assert scope.ready_at() == math.inf  # the call still runs: only its end can help
    getattr(call, outcome)()  # a 429 reached the provider too: it counts the same
    stats = scope.statistics()
    assert (stats.in_flight, stats.requests_in_window) == (0, 1)
    assert scope.ready_at() == anyio.current_time() + 60.0
    (await scope.admit()).release()
    assert now() == 90.0  # not 60: the call may have arrived as late as 30


async def test_a_waiter_blocked_by_running_calls_is_woken_by_their_end() -> None:
    now = Stopwatch()
    scope = QuotaScope(concurrency=10, requests_per_minute=2)
    calls = [scope.try_admit_nowait(), scope.try_admit_nowait()]
    admitted_at: list[float] = []

    async def waiter() -> None:
        (await scope.admit()).release()
        admitted_at.append(now())

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await wait_until_waiting(scope, 1)
        await anyio.sleep(10.0)
        calls[0].release()  # the waiter learns its ready time: 10 + 60
        await anyio.sleep(30.0)
        calls[1].release()
    assert admitted_at == [70.0]
    await anyio.sleep(100.0)
    assert_idle(scope)


async def test_an_unused_admission_is_refunded_at_once() -> None:
    now = Stopwatch()
    scope = QuotaScope(concurrency=10, requests_per_minute=1)
    unused = scope.try_admit_nowait()
    admitted_at: list[float] = []

    async def waiter() -> None:
        (await scope.admit()).release()
        admitted_at.append(now())

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await wait_until_waiting(scope, 1)
        await anyio.sleep(30.0)
        unused.release_unused()  # it never reached the provider
        unused.release()  # the engine's `finally`: a no-op now
    assert admitted_at == [30.0]
    assert scope.statistics().requests_in_window == 1  # the waiter's only
    await anyio.sleep(60.0)
    assert_idle(scope)


async def test_smaller_real_usage_refunds_and_wakes_the_next_waiter() -> None:
    now = Stopwatch()
    scope = QuotaScope(concurrency=10, tokens_per_minute=1000)
    first = await scope.admit(800)
    admitted_at: list[float] = []

    async def second() -> None:
        (await scope.admit(500)).release(500)
        admitted_at.append(now())

    async with anyio.create_task_group() as tg:
        tg.start_soon(second)
        await wait_until_waiting(scope, 1)
        await anyio.sleep(2.0)
        first.release(actual_tokens=300)  # 500 refunded: the waiter fits at once
    assert admitted_at == [2.0]
    assert scope.statistics().tokens_reserved_in_window == 800


async def test_larger_real_usage_is_debt_and_unknown_usage_keeps_the_estimate() -> None:
    now = Stopwatch()
    scope = QuotaScope(concurrency=10, tokens_per_minute=1000)
    (await scope.admit(100)).release(None)
    assert scope.statistics().tokens_reserved_in_window == 100
    await anyio.sleep(10.0)
    (await scope.admit(100)).release(1500)  # 1400 of debt, charged now
    assert scope.statistics().tokens_reserved_in_window == 1600
    (await scope.admit(5000)).release(0)  # larger than TPM: clamped, runs alone
    assert now() == 70.0
    assert scope.statistics().tokens_reserved_in_window == 0


# -- cooldown ---------------------------------------------------------------


async def run_crowd(
    scope: QuotaScope,
    workers: int,
    call: Callable[[int, int, Admission], Awaitable[bool]],
    now: Stopwatch,
) -> list[tuple[float, int, int]]:
    """Each worker admits and calls until ``call`` returns True.

    Returns ``(time, worker, in_flight)`` per admission.

    ``call`` gets the admission's ordinal (0 for the first admitted in the
    scope), not the worker's index: the order tasks start in is the backend's
    business (Trio shuffles it on purpose).
    """
    admissions: list[tuple[float, int, int]] = []

    async def worker(index: int) -> None:
        attempt = 0
        while True:
            admission = await scope.admit()
            ordinal = len(admissions)
            admissions.append((now(), index, scope.statistics().in_flight))
            attempt += 1
            try:
                if await call(ordinal, attempt, admission):
                    return
            finally:
                admission.release()

    async with anyio.create_task_group() as tg:
        for index in range(workers):
            tg.start_soon(worker, index)
    return admissions


async def test_one_429_pauses_the_whole_scope_and_in_flight_calls_finish() -> None:
    now = Stopwatch()
    scope = QuotaScope(concurrency=10, rate_limit=rate_limit(cooldown=5.0))
    finished: list[tuple[float, int]] = []
    storm = {3: 0.5, 4: 0.625, 5: 0.75}  # three of the first calls hit the same storm

    async def call(ordinal: int, attempt: int, admission: Admission) -> bool:
        if ordinal in storm:
            await anyio.sleep(storm[ordinal])
            admission.release_rate_limited(retry_after=None)
            if ordinal == 5:
                stats = scope.statistics()
                assert stats.cooldown_remaining == 4.75  # joined, not stacked end to end
                assert stats.concurrency_limit == 0
            return False
        await anyio.sleep(1.0)
        finished.append((now(), ordinal))
        return True

    admissions = await run_crowd(scope, 50, call, now)
    times = [t for t, _, _ in admissions]
    # Nobody was admitted during the cooldown [0.5, 5.5); the calls in flight finished.
    assert not [t for t in times if 0.0 < t < 5.5]
    assert [t for t, i in finished if t < 5.5] == [1.0] * 7
    assert times == [0.0] * 10 + [5.5] * 10 + [6.5] * 10 + [7.5] * 10 + [8.5] * 10 + [9.5] * 3
    assert max(in_flight for _, _, in_flight in admissions) <= 10
    stats = scope.statistics()
    assert (stats.rate_limits_reported, stats.admitted_total) == (3, 53)
    assert_idle(scope)


async def test_retry_after_sets_the_cooldown() -> None:
    now = Stopwatch()
    scope = QuotaScope(concurrency=4, rate_limit=rate_limit(cooldown=5.0))

    async def call(ordinal: int, attempt: int, admission: Admission) -> bool:
        if ordinal == 0:
            await anyio.sleep(0.25)
            admission.release_rate_limited(retry_after=2.0)
            return False
        await anyio.sleep(0.5)
        return True

    admissions = await run_crowd(scope, 8, call, now)
    # Paused from 0.25 to 2.25 (not the configured 5 s); the retry queued behind the others.
    assert [t for t, _, _ in admissions] == [0.0] * 4 + [2.25] * 4 + [2.75]


async def test_release_rate_limited_never_hands_the_slot_to_a_waiter() -> None:
    now = Stopwatch()
    scope = QuotaScope(concurrency=1, rate_limit=rate_limit(cooldown=5.0))
    holder = scope.try_admit_nowait()
    admitted_at: list[float] = []

    async def waiter() -> None:
        (await scope.admit()).release()
        admitted_at.append(now())

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await wait_until_waiting(scope, 1)
        await anyio.sleep(1.0)
        holder.release_rate_limited(retry_after=None)
        holder.release()  # the engine's `finally`: a no-op now
    assert admitted_at == [6.0]


async def test_slow_start_ramps_admission_back_up() -> None:
    now = Stopwatch()
    # bound 8, initial max(1, ceil(0.25 * 8)) = 2, six steps over 6 s: one more slot a second.
    scope = QuotaScope(concurrency=8, rate_limit=rate_limit(cooldown=5.0, ramp=6.0))
    scope.try_admit_nowait().release_rate_limited()
    limits: list[tuple[float, int]] = []

    async def call(ordinal: int, attempt: int, admission: Admission) -> bool:
        limits.append((now(), scope.statistics().concurrency_limit))
        await anyio.sleep(100.0)
        return True

    admissions = await run_crowd(scope, 10, call, now)
    times = [t for t, _, _ in admissions]
    assert times == [5.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 105.0, 105.0]
    assert [limit for _, limit in limits[:8]] == [2, 2, 3, 4, 5, 6, 7, 8]
    # At every admission the calls in flight stayed within the ramp's bound.
    for (_, _, in_flight), (_, limit) in zip(admissions, limits, strict=True):
        assert in_flight <= limit


async def test_a_stale_429_starts_no_second_cooldown() -> None:
    now = Stopwatch()
    scope = QuotaScope(concurrency=4, rate_limit=rate_limit(cooldown=5.0))
    slow = scope.try_admit_nowait()  # admitted before the storm
    scope.try_admit_nowait().release_rate_limited()  # the storm: paused until 5
    await anyio.sleep(6.0)
    slow.release_rate_limited()  # its 429 belongs to the storm already answered
    assert scope.statistics().cooldown_remaining == 0
    (await scope.admit()).release()
    assert now() == 6.0
    fresh = await scope.admit()
    fresh.release_rate_limited(retry_after=3.0)  # a 429 from a call admitted after it: a new one
    (await scope.admit()).release()
    assert now() == 9.0
    assert scope.statistics().rate_limits_reported == 3


def test_repeated_storms_escalate_and_reset() -> None:
    core = CooldownCore(rate_limit(cooldown=5.0, ramp=10.0, max_cooldown=30.0))
    t, durations = 0.0, []
    for _ in range(5):
        core.report(None, t)
        durations.append(core.remaining(t))
        t += core.remaining(t) + 1.0  # a fresh 429 one second into the ramp
    assert durations == [5.0, 10.0, 20.0, 30.0, 30.0]
    t += 100.0  # a quiet spell: the next storm starts from the base again
    core.report(None, t)
    assert core.remaining(t) == 5.0


# -- cancellation and close -------------------------------------------------


async def test_a_cancelled_waiter_leaks_nothing() -> None:
    now = Stopwatch()
    scope = QuotaScope(concurrency=2, requests_per_minute=10, tokens_per_minute=1000)
    holder = await scope.admit(600)
    results: dict[str, float] = {}

    async def waiter(name: str, tokens: int, cancel: anyio.CancelScope) -> None:
        with cancel:
            admission = await scope.admit(tokens)
            try:
                results[name] = now()
                await anyio.sleep(1.0)
            finally:
                admission.release(tokens)

    head, middle, tail = anyio.CancelScope(), anyio.CancelScope(), anyio.CancelScope()
    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter, "head", 500, head)  # 600 + 500 > 1000: waits for the window
        await wait_until_waiting(scope, 1)
        tg.start_soon(waiter, "middle", 100, middle)
        await wait_until_waiting(scope, 2)
        tg.start_soon(waiter, "tail", 300, tail)
        await wait_until_waiting(scope, 3)
        await anyio.sleep(1.0)
        middle.cancel()  # not first in line: simply gone
        await anyio.sleep(1.0)
        head.cancel()  # first in line: the tail behind it is woken and fits
    assert results == {"tail": 2.0}
    assert middle.cancelled_caught
    assert head.cancelled_caught
    stats = scope.statistics()
    assert (stats.in_flight, stats.waiting) == (1, 0)
    assert stats.requests_in_window == 2  # the holder's and the tail's
    assert stats.tokens_reserved_in_window == 900
    holder.release(600)
    await anyio.sleep(60.0)
    assert_idle(scope)


async def test_a_waiter_woken_and_cancelled_at_once_gets_its_admission_and_gives_it_back() -> None:
    # The wake-up wins over a cancellation that arrives before the waiter runs
    # (as with Trio's own locks); the caller's `finally` then releases.
    now = Stopwatch()
    scope = QuotaScope(concurrency=1, requests_per_minute=2, tokens_per_minute=1000)
    holder = await scope.admit(400)
    results: list[tuple[str, float]] = []

    async def waiter(name: str, cancel: anyio.CancelScope) -> None:
        with cancel:
            admission = await scope.admit(300)
            try:
                results.append((name, now()))
                await anyio.sleep(1.0)
            finally:
                admission.release_unused() if cancel.cancel_called else admission.release(300)

    first = anyio.CancelScope()
    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter, "first", first)
        await wait_until_waiting(scope, 1)
        tg.start_soon(waiter, "second", anyio.CancelScope())
        await wait_until_waiting(scope, 2)
        await anyio.sleep(1.0)
        holder.release(400)  # grants "first" ...
        first.cancel()  # ... which is cancelled before it runs
    # Had "first" kept its RPM unit, "second" would have waited until 61.
    assert results == [("first", 1.0), ("second", 1.0)]
    stats = scope.statistics()
    assert stats.tokens_reserved_in_window == 700  # the holder's 400 and the second's 300
    assert stats.requests_in_window == 2  # the holder's and the second's
    await anyio.sleep(60.0)
    assert_idle(scope)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_native_cancel_after_the_grant_returns_the_admission() -> None:
    # asyncio's Task.cancel() gets past anyio's rule above: the waiter is
    # cancelled inside admit() although it was granted. Nothing may leak.
    scope = QuotaScope(concurrency=1, requests_per_minute=10, tokens_per_minute=1000)
    holder = await scope.admit(100)
    task = asyncio.ensure_future(scope.admit(200))
    await wait_until_waiting(scope, 1)
    holder.release(100)  # grants the waiting task
    assert scope.statistics().in_flight == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    stats = scope.statistics()
    assert (stats.in_flight, stats.waiting) == (0, 0)
    assert (stats.requests_in_window, stats.tokens_reserved_in_window) == (1, 100)  # the holder's only


async def test_close_wakes_waiters_with_admission_closed_error() -> None:
    scope = QuotaScope(concurrency=1)
    holder = scope.try_admit_nowait()
    errors: list[BaseException] = []

    async def waiter() -> None:
        try:
            await scope.admit()
        except AdmissionClosedError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for index in range(5):
            tg.start_soon(waiter)
            await wait_until_waiting(scope, index + 1)
        scope.close()
        scope.close()  # idempotent
    assert len(errors) == 5
    with pytest.raises(AdmissionClosedError):
        scope.try_admit_nowait()
    with pytest.raises(AdmissionClosedError):
        await scope.admit()
    holder.release()  # calls admitted before the close still give their slot back
    stats = scope.statistics()
    assert (stats.in_flight, stats.waiting, stats.closed) == (0, 0, True)


@settings(max_examples=25, deadline=None)
@given(
    plan=st.lists(
        st.tuples(
            st.sampled_from([0.0, 0.25, 1.0, 30.0]),  # arrives after the previous one
            st.sampled_from([0, 200, 700, 1500]),  # estimated tokens
            st.sampled_from([0.5, 2.0, 61.0]),  # call time
            st.sampled_from([None, 0.25, 3.0, 100.0]),  # cancelled this long after arriving
            st.sampled_from([None, 0, 100, 2000]),  # real usage
            st.booleans(),  # rate limited
        ),
        min_size=1, max_size=14,
    )
)
async def test_random_crowds_keep_every_quota_and_leave_nothing_behind(
    plan: list[tuple[float, int, float, float | None, int | None, bool]],
) -> None:
    scope = QuotaScope(concurrency=3, requests_per_minute=4, tokens_per_minute=1000,
                       rate_limit=rate_limit(cooldown=2.0, ramp=4.0, fraction=0.5))
    spans: list[tuple[float, float]] = []  # each call: from admission to a minute after it ended
    commit = QuotaCore._commit

    def checked_commit(core: QuotaCore, tokens: int, now: float) -> Grant:
        # Checked at the instant of admission, whichever task caused it.
        grant = commit(core, tokens, now)
        stats = core.statistics(now)
        assert stats.cooldown_remaining == 0
        assert stats.in_flight <= stats.concurrency_limit
        assert stats.requests_in_window is not None
        assert stats.requests_in_window <= 4
        assert stats.tokens_reserved_in_window is not None
        assert stats.tokens_reserved_in_window <= 1000
        return grant

    async def request(tokens: int, hold: float, cancel_after: float | None,
                      usage: int | None, limited: bool) -> None:
        with anyio.move_on_after(math.inf if cancel_after is None else cancel_after):
            admission = await scope.admit(tokens)
            admitted = anyio.current_time()
            try:
                await anyio.sleep(hold)
            finally:
                spans.append((admitted, anyio.current_time() + 60.0))
                if limited:
                    admission.release_rate_limited(retry_after=None, actual_tokens=usage)
                admission.release(usage)

    QuotaCore._commit = checked_commit  # type: ignore[method-assign]
    try:
        async with anyio.create_task_group() as tg:
            for gap, tokens, hold, cancel_after, usage, limited in plan:
                await anyio.sleep(gap)
                tg.start_soon(request, tokens, hold, cancel_after, usage, limited)
    finally:
        QuotaCore._commit = commit  # type: ignore[method-assign]
    # Whenever during its call each request reached the provider, no 60 s
    # window saw more than 4 (admissions granted and refunded inside admit()
    # never reached it, and are not here).
    assert max_overlap(spans) <= 4
    await anyio.sleep(200.0)
    assert_idle(scope)


# -- the registry -----------------------------------------------------------


async def test_registry_creates_one_scope_per_key_from_the_config() -> None:
    registry = QuotaRegistry()
    config = ProcessorConfig(concurrency=8, max_provider_concurrency=3, max_requests_per_minute=60.0,
                             max_tokens_per_minute=10_000, rate_limit=rate_limit(cooldown=1.0))
    scope = registry.scope_for("openai", config)
    assert registry.scope_for("openai", ProcessorConfig(concurrency=1)) is scope  # first config wins
    unhashable: list[str] = []
    other = registry.scope_for(unhashable, config)
    assert other is not scope
    assert registry.scope_for(unhashable, config) is other
    stats = scope.statistics()
    assert (stats.concurrency_bound, stats.requests_per_minute, stats.tokens_per_minute) == (3, 60.0, 10_000)
    assert scope.needs_token_estimate
    admission = await scope.admit(100)
    assert registry.statistics().in_flight == 1
    registry.close()
    assert scope.closed
    assert other.closed
    with pytest.raises(AdmissionClosedError):
        registry.scope_for("new", config)
    admission.release(100)
    totals = registry.statistics()
    assert (totals.scopes, totals.in_flight, totals.admitted_total, totals.closed) == (2, 0, 1, True)
    assert [key for key, _ in registry.scope_statistics()] == ["openai", unhashable]
