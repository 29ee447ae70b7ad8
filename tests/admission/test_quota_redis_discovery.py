"""The rate discovered from 429s alone, shared through Redis: one pace for every process.

Each "process" is a QuotaRegistry with its own connection, as in test_quota_redis;
the script runs on an injected clock (``script_clock``) and so does each scope,
so the simulated minutes below take no wall-clock time. Most tests admit as a
scope would (the local core first, then one round trip for the share) but one
attempt at a time, at the simulated time the test chooses, and send releases
before the next step (the flusher's job, done here at once). Two go through the
scopes' own ``admit()`` and the link's own flusher, waiting for what they expect
(never for time to pass) as test_quota_redis does.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from trio_batch_llm import ProcessorConfig, RateLimitConfig, RedisQuotaBackend
from trio_batch_llm._admission import QuotaRegistry, QuotaScope
from trio_batch_llm._admission._limits import PACE_CREDIT
from trio_batch_llm._admission._redis_discovery import SharedDiscovery
from trio_batch_llm._admission._redis_lua import AcquireReply
from trio_batch_llm._admission._redis_quota import RedisSharedQuota, _Want
from trio_batch_llm._admission._scope import Admission

from .._servers.redis import RedisServer

pytestmark = pytest.mark.anyio

LIMIT = 120  # the provider's: requests in any 60 s
LEARN = RateLimitConfig(slow_start_seconds=0.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Provider:
    """A fixed sliding-window limit that answers 429 (no headers) to a call beyond it."""

    def __init__(self, clock: Clock, limit: int = LIMIT) -> None:
        self.clock, self.limit = clock, limit
        self.accepted: deque[float] = deque()

    def call(self) -> bool:
        now, accepted = self.clock.now, self.accepted
        while accepted and accepted[0] <= now - 60.0:
            accepted.popleft()
        if len(accepted) >= self.limit:
            return False
        accepted.append(now)
        return True


@contextlib.asynccontextmanager
async def processes(url: str, clock: Clock, *, count: int = 2, rpm: float | None = 6000,
                    rate_limit: RateLimitConfig = LEARN) -> AsyncIterator[list[QuotaScope]]:
    config = ProcessorConfig(concurrency=1000, max_requests_per_minute=rpm, rate_limit=rate_limit,
                             quota_backend=RedisQuotaBackend(url))
    async with anyio.create_task_group() as tg:
        made = [QuotaRegistry(backend=config.quota_backend, clock=clock, spawn=tg.start_soon)
                for _ in range(count)]
        try:
            scopes = [registry.scope_for(("provider", "key"), config) for registry in made]
            for registry in made:
                assert registry._link is not None
                registry._link.script_clock = clock
            yield scopes
        finally:
            for registry in made:
                await registry.aclose()


def shared_of(scope: QuotaScope) -> RedisSharedQuota:
    shared = scope._shared
    assert shared is not None
    return shared


async def attempt(scope: QuotaScope) -> tuple[Admission | None, float | None]:
    """One admission attempt now, as admit() makes it: ``(admission, None)`` or ``(None, ready)``."""
    core, shared, now = scope._core, shared_of(scope), scope._clock()
    try:
        grant = core.try_admit_nowait(0, now)
    except anyio.WouldBlock:
        return None, None
    ticket = shared.try_take_nowait(0)
    ready = None
    if ticket is None:
        want = _Want(0)
        reply = await shared._round_trip([want])
        shared._admit([want], reply)
        ticket, ready = want.ticket, reply.ready_at
    if ticket is None:
        core.release_unused(grant, now)
        return None, ready
    return Admission(scope, grant, ticket), None


async def flush(scope: QuotaScope) -> None:
    shared = shared_of(scope)
    if shared.buffered:
        await shared._round_trip([])


async def drive(scopes: list[QuotaScope], provider: Provider, clock: Clock, until: float,
                demand: float = 10.0) -> list[list[float]]:
    """Each process wants ``demand`` calls a second until ``until``; return each one's admission times.

    A refused process tries again at the ready time the script gave; of two due at once, the one
    that waited longer goes first (as two processes' leaders would race).
    """
    admitted: list[list[float]] = [[] for _ in scopes]
    next_try = [clock.now + 0.001 * n for n in range(len(scopes))]
    since = [0.0 for _ in scopes]
    while True:
        n = min(range(len(scopes)), key=lambda k: (next_try[k], since[k]))
        if next_try[n] >= until:
            return admitted
        clock.now = max(clock.now, next_try[n])
        scope = scopes[n]
        admission, ready = await attempt(scope)
        if admission is None:
            next_try[n] = clock.now + 0.05 if ready is None else max(ready, clock.now + 0.001)
            continue
        admitted[n].append(clock.now)
        since[n] = clock.now
        if provider.call():
            admission.release(0)
        else:
            admission.release_rate_limited(None, 0)
        await flush(scope)
        next_try[n] = clock.now + 1.0 / demand


def in_windows(times: list[float], start: float, end: float) -> tuple[int, int]:
    """The fewest and most of ``times`` in a 60 s window beginning in [start, end - 60], a second apart."""
    counts = []
    t = start
    while t + 60.0 <= end:
        counts.append(sum(1 for x in times if t <= x < t + 60.0))
        t += 1.0
    return min(counts), max(counts)


def between(times: list[float], start: float, end: float) -> int:
    return sum(1 for x in times if start <= x < end)


def test_events_ride_in_order_and_a_failed_round_trip_resends_only_its_429s() -> None:
    kicks: list[int] = []
    now = [0.0]
    discovery = SharedDiscovery(RateLimitConfig(), 120, lambda: kicks.append(1), lambda: now[0])
    discovery.answered(0)
    discovery.answered(2)
    discovery.rate_limited(2, False)
    discovery.answered(1)
    args, events = discovery.take()
    assert events == [("a", 2, 2), ("r", 2, 0), ("a", 1, 1)]  # consecutive answers as one
    assert args[0] == "1" and args[5] == repr(2.0) and args[9:] == [3, "a", 2, 2, "r", 2, 0, "a", 1, 1]
    assert len(kicks) == 4  # nothing heard yet: every event asks for a round trip
    discovery.give_back(events)  # not known to have applied: a 429 again is a no-op, an answer is not
    assert discovery.take()[1] == [("r", 2, 0)]
    discovery.read(0, None)
    discovery.answered(0)
    assert len(kicks) == 4  # heard within the second: the answer waits for the next round trip
    now[0] = 1.0
    discovery.answered(0)
    assert len(kicks) == 5
    off = SharedDiscovery(RateLimitConfig(learn_limits=False), None, lambda: kicks.append(1), lambda: 0.0)
    off.answered(0)
    off.rate_limited(0, True)
    args, events = off.take()
    assert args[0] == "0" and events == [] and len(kicks) == 5


@pytest.mark.parametrize("rpm", [6000, None], ids=["cap", "no-cap"])
async def test_two_processes_pace_at_one_shared_rate(redis_url: str, rpm: float | None) -> None:
    # 20 calls a second wanted, 2 a second allowed. The first 429s come about 6 s in (the provider's
    # first window took 120 at once); probes find the window open a minute later; then a pace.
    # Without a configured RPM nothing asks Redis before the first 429, and storm probes go a gap apart.
    clock = Clock()
    provider = Provider(clock)
    start = clock.now
    async with processes(redis_url, clock, rpm=rpm) as scopes:
        admitted = await drive(scopes, provider, clock, until=start + 600.0)
        rates = [scope.statistics().paced_requests_per_minute for scope in scopes]
    combined = sorted(admitted[0] + admitted[1])
    low, high = in_windows(combined, start + 120.0, start + 600.0)
    # One pace for both: within the limit but for one PACE_CREDIT's burst at about the limit's rate
    # (2 a second: 6), and no lower than 80 % of it (one decrease).
    assert high <= LIMIT + PACE_CREDIT * LIMIT / 60.0
    assert low >= 0.8 * LIMIT
    # Both took part (neither was starved by the other's pace), and both read the same shared rate.
    for times in admitted:
        assert between(times, start + 120.0, start + 600.0) >= 0.25 * between(combined, start + 120.0,
                                                                               start + 600.0)
    assert rates[0] is not None and rates[1] is not None
    assert 0.8 * LIMIT <= rates[0] <= 1.2 * LIMIT and abs(rates[0] - rates[1]) <= 0.1 * LIMIT


@pytest.mark.parametrize("how", ["release", "report"])
async def test_a_429_in_one_process_slows_the_other(redis_url: str, how: str) -> None:
    clock = Clock()
    provider = Provider(clock)
    slow_recovery = RateLimitConfig(slow_start_seconds=0.0, discovery_recovery_seconds=300.0)
    async with processes(redis_url, clock, rate_limit=slow_recovery) as (a, b):
        await drive([a, b], provider, clock, until=clock.now + 200.0)  # both paced now
        provider.limit = 10**9  # from here on the provider refuses nothing: only A's one 429 below
        t = clock.now
        # Past the recovery time of the last decrease (one decrease per climb), B alone for a while.
        before = (await drive([b], provider, clock, until=t + 310.0))[0]
        paced_before = b.statistics().paced_requests_per_minute
        admission = None
        while admission is None:
            admission, ready = await attempt(a)
            clock.now = max(clock.now + 0.01, ready or 0.0)
        if how == "release":
            admission.release_rate_limited(None, 0)  # a 429 without headers, seen by A alone
        else:  # the same 429, reported apart from the call (QuotaScope.report_rate_limit)
            admission.release(0)
            assert not a.report_rate_limit()
        await flush(a)
        t = clock.now
        after = (await drive([b], provider, clock, until=t + 30.0))[0]
        paced_after = b.statistics().paced_requests_per_minute
    assert paced_before is not None and paced_after is not None
    assert paced_after <= 0.85 * paced_before  # the decrease (0.8) reached B's pace
    # B admitted as fast as the pace let it before; after A's 429, a fifth slower.
    assert len(after) <= 0.9 * between(before, t - 30.0 - 0.02, t)


async def test_admit_waits_for_the_shared_pace(redis_url: str) -> None:
    # Through the scopes' own admit() (leaders, FIFO, flusher): 60 answers, then a 429, pace the
    # scope at 60 a minute; a probe's answer ends the storm. Then a burst goes as far as the pace's
    # credit allows, in either process, and the next admission waits until the clock moves on.
    clock = Clock()
    async with processes(redis_url, clock) as (a, b):
        for _ in range(60):
            admission, _ = await attempt(b)
            assert admission is not None
            admission.release(0)
        admission, _ = await attempt(b)
        assert admission is not None
        admission.release_rate_limited(None, 0)
        await flush(b)
        with anyio.fail_after(5):
            probe = await a.admit()
        probe.release(0)
        assert shared_of(a).discovery.rate == 1.0
        burst = 0
        while True:
            with anyio.move_on_after(0.3) as waited:
                await (a if burst % 2 else b).admit()
            if waited.cancelled_caught:
                break
            burst += 1
        assert 1 <= burst <= PACE_CREDIT * 1.0 + 1  # both processes' grants come out of one credit
        clock.now += 10.0
        with anyio.fail_after(5):
            await a.admit()
            await b.admit()


async def until(condition: Any) -> None:
    with anyio.fail_after(5):
        while not condition():  # noqa: ASYNC110 - the link's flusher signals nobody; a test's probe
            await anyio.sleep(0.001)


async def test_without_a_limit_answers_hear_of_discovery_once_a_second(redis_url: str) -> None:
    # No RPM or TPM: admissions ask Redis nothing. The link's own flusher (not the test) carries
    # what goes: a 429 at once, answers at most once a second, and a reply that discovery began.
    clock = Clock()
    async with processes(redis_url, clock, rpm=None) as (a, b):
        shared = shared_of(b)

        async def answer() -> None:
            admission, _ = await attempt(b)
            assert admission is not None
            admission.release(0)

        await answer()  # nothing heard yet: it asks for a round trip
        await until(lambda: shared.round_trips == 1 and not shared.pending)
        await answer()  # within the second: it waits
        assert shared.buffered and not shared._link._flush_wanted.is_set()
        clock.now += 1.0
        await answer()
        await until(lambda: shared.round_trips == 2 and not shared.pending)
        assert not shared.discovery.active
        admission, _ = await attempt(a)
        assert admission is not None
        admission.release_rate_limited(None, 0)  # A's 429, sent by A's flusher at once
        await until(lambda: shared_of(a).discovery.active)
        clock.now += 1.0
        await answer()
        await until(lambda: shared.discovery.active)  # B heard of it with its answers
        trips = shared.round_trips
        await answer()
        assert shared.round_trips == trips + 1  # from now on B asks Redis for every admission


@pytest.mark.parametrize("learn", [True, False])
async def test_spares_go_back_once_discovery_is_active(redis_url: str, learn: bool) -> None:
    clock = Clock()
    config = RateLimitConfig(slow_start_seconds=0.0, learn_limits=learn)
    async with processes(redis_url, clock, rate_limit=config) as (a, b):
        shared = shared_of(a)
        shared._admitted = 10  # a busy process: its next round trip leases spares for that demand
        wants = [_Want(0)]
        shared._admit(wants, await shared._round_trip(wants))
        assert a.statistics().backend_spares == 10
        admission, _ = await attempt(b)
        assert admission is not None
        admission.release_rate_limited(None, 0)  # B's first 429: discovery begins for the scope
        await flush(b)
        await shared._round_trip([])  # A hears of it with its next round trip
        held = a.statistics().backend_spares
        taken = shared.try_take_nowait(0)
    if learn:
        assert held == 0 and taken is None  # handed back: a spare would go unpaced
    else:
        assert held == 10 and taken is not None


@pytest.mark.parametrize("learn", [True, False])
async def test_learning_off_shares_no_pace(redis_url: str, learn: bool) -> None:
    clock = Clock()
    provider = Provider(clock)
    config = RateLimitConfig(slow_start_seconds=0.0, learn_limits=learn, cooldown_seconds=5.0)
    async with processes(redis_url, clock, rate_limit=config) as (a, b):
        await drive([a, b], provider, clock, until=clock.now + 200.0)
        clock.now += 120.0  # any cooldown is over, and the pace has its whole credit back
        shared = shared_of(b)
        wants = [_Want(0) for _ in range(20)]
        reply = await shared._round_trip(wants)
        shared._admit(wants, reply)
    granted = len(reply.units) - reply.spares
    if learn:
        assert reply.generation > 0 and reply.discovered_rate is not None
        assert granted <= PACE_CREDIT * reply.discovered_rate + 1  # the credit's burst, then the pace
    else:
        assert reply.generation == 0 and reply.discovered_rate is None
        assert granted == 20  # nothing paces: only the configured RPM (6000) counts


# -- the decrease rule, as _discovery's (the pure tests of test_pacing, on a shared scope) -------------


async def grant(scope: QuotaScope, count: int = 1) -> list[Admission]:
    """``count`` admissions now, in one round trip, as a leader with that many waiters asks: all granted."""
    core, shared, now = scope._core, shared_of(scope), scope._clock()
    grants = [core.try_admit_nowait(0, now) for _ in range(count)]
    wants = [_Want(0) for _ in grants]
    shared._admit(wants, await shared._round_trip(wants))
    # No spares for that demand: the link's flusher would lease them (at a simulated time the event
    # loop picks) and, open units granted within the last minute, they would hold storm probes up.
    shared._admitted = 0
    admissions = []
    for core_grant, want in zip(grants, wants, strict=True):
        assert want.ticket is not None, "the shared pace refused a grant the test expects to go"
        admissions.append(Admission(scope, core_grant, want.ticket))
    return admissions


async def sent(scope: QuotaScope) -> None:
    """What was released reaches Redis now, before the clock moves (the link's flusher may carry some)."""
    await flush(scope)
    shared = shared_of(scope)
    await until(lambda: not shared.pending)


async def answer(scope: QuotaScope, admissions: list[Admission]) -> None:
    """Answers that were not 429s, sent now."""
    for admission in admissions:
        admission.release(0)
    await sent(scope)


async def refuse(scope: QuotaScope, admission: Admission) -> float | None:
    """A 429 without headers or Retry-After, sent now; return the shared rate the reply gave."""
    assert admission._scope is scope
    admission.release_rate_limited(None, 0)
    await sent(scope)
    return shared_of(scope).discovery.rate


async def served_before(scope: QuotaScope, count: int) -> None:
    """``count`` calls granted and answered now, a hundred at a time (the scope's concurrency is 1000)."""
    while count > 0:
        await answer(scope, await grant(scope, min(100, count)))
        count -= 100


async def paced_calls(a: QuotaScope, b: QuotaScope, clock: Clock, seconds: float) -> None:
    """``seconds`` of calls from both processes in turn, each as soon as the shared pace lets it, answered."""
    end = clock.now + seconds
    k = 0
    while clock.now < end:
        scope = (a, b)[k % 2]
        admission, ready = await attempt(scope)
        if admission is None:
            assert ready is not None
            clock.now = max(ready, clock.now + 0.001)
            continue
        clock.now += 0.01
        await answer(scope, [admission])
        clock.now += 0.01
        k += 1


async def test_a_shared_decrease_just_after_a_long_cooldown_measures_the_calls_since_it_not_the_pause(
    redis_url: str,
) -> None:
    # As test_pacing's test of that name: a first 429 after 1,200 calls, 56 s without calls, then
    # two seconds at the pace and a 429. The decrease starts from the rate admitted since calls
    # flowed again (the storm's probe got through), not over a window that holds the pause: counted
    # so, 41 grants over 58 s paced the scope at about 0.6 a second, 3 % of the limit found.
    clock = Clock()
    async with processes(redis_url, clock) as (a, b):
        await served_before(b, 1200)
        clock.now += 4.0
        assert await refuse(a, (await grant(a))[0]) == pytest.approx(20.0)  # the first 429: 20 a second
        clock.now += 56.0
        probe = await grant(a)  # the storm's probe
        clock.now += 0.2
        await answer(a, probe)  # it got through: calls flow again from here
        for k in range(40):  # two seconds at 20 a second (within the pace), answered, from both processes
            scope = (a, b)[k % 2]
            await answer(scope, await grant(scope))
            clock.now += 0.05
        rate = await refuse(b, (await grant(b))[0])  # the 41st since the probe's answer, 2 s after it
    assert rate == pytest.approx(0.8 * 20.0)  # one decrease from the pace (41 / 2 s, at most the rate)


async def test_after_a_shared_whole_window_a_decrease_comes_down_to_what_was_served_and_climbs_back_to_it(
    redis_url: str,
) -> None:
    # As test_pacing's test of that name: the provider answered half of the 20 a second the scope
    # admitted; a 429 after a whole window says its limit is about 10 a second, so the shared rate
    # comes down from there (not 0.8 of 20) and climbs back to 10, not to the 20 it refused.
    clock = Clock()
    config = RateLimitConfig(slow_start_seconds=0.0, discovery_decrease=0.8, discovery_recovery_seconds=20.0,
                             discovery_probe=0.05)
    async with processes(redis_url, clock, rate_limit=config) as (a, b):
        await served_before(b, 1200)
        assert await refuse(a, (await grant(a))[0]) == pytest.approx(20.0)  # the first 429, then a storm
        start = clock.now
        clock.now = start + 1.0
        probe = await grant(a)
        clock.now = start + 1.1
        await answer(a, probe)  # calls flow again
        unanswered: list[Admission] = []
        for k in range(71):  # 71 s at 20 a second (a second's worth per round trip), half answered
            clock.now = start + 1.1 + k
            scope = (a, b)[k % 2]
            admissions = await grant(scope, 20)
            clock.now += 0.01
            await answer(scope, admissions[:10])
            unanswered += admissions[10:]  # still open when the 429 comes (the provider's other half)
        clock.now = start + 71.5  # the last window holds 60 whole seconds of 10 answers
        rate = await refuse(a, unanswered[-1])  # one of A's last grants
        assert rate == pytest.approx(0.8 * 10.0)  # 600 answers in the window: not 0.8 of the 20 admitted
        await paced_calls(a, b, clock, 30.0)  # calls wait for the pace, and every one is answered
        rate = shared_of(a).discovery.rate
        assert shared_of(b).discovery.rate == pytest.approx(rate, rel=0.01)  # one rate for both
    assert rate == pytest.approx(10.0 * (1 + 0.05 * 10 / 60), rel=0.02)  # 20 s back, 10 probing


async def test_within_the_climb_back_a_shared_429_lowers_the_rate_only_after_the_recovery_time(
    redis_url: str,
) -> None:
    # As test_pacing's test of that name: two 429s 5 s apart, with answers between, are one decrease
    # (isolated 429s would ratchet the rate down faster than it climbs); once
    # discovery_recovery_seconds have passed since that decrease, a 429 lowers the rate again.
    clock = Clock()
    config = RateLimitConfig(slow_start_seconds=0.0, discovery_decrease=0.8, discovery_recovery_seconds=20.0)
    async with processes(redis_url, clock, rate_limit=config) as (a, b):
        await served_before(b, 1200)
        clock.now += 4.0
        assert await refuse(a, (await grant(a))[0]) == pytest.approx(20.0)  # the first 429, then a storm
        clock.now += 1.0
        probe = await grant(a)
        clock.now += 0.1
        await answer(a, probe)

        async def calls(seconds: float, per_second: int) -> None:  # answered, from both processes
            for k in range(round(per_second * seconds)):
                scope = (a, b)[k % 2]
                await answer(scope, await grant(scope))
                clock.now += 1.0 / per_second

        await calls(5.0, 20)  # at the pace
        first = await refuse(b, (await grant(b))[0])
        assert first == pytest.approx(0.8 * 20.0, rel=0.05)  # one decrease: 0.8 of the pace
        await calls(5.0, 10)  # below the pace from here on: it holds nobody back, so no growth
        assert await refuse(a, (await grant(a))[0]) == first  # 5 s later, in the climb back: none
        await calls(15.5, 10)  # past discovery_recovery_seconds since the decrease
        third = await refuse(b, (await grant(b))[0])
    # Lowered again: 0.8 of the rate admitted since calls flowed (308 calls in 25.5 s), as in test_pacing.
    assert third == pytest.approx(0.8 * 308 / 25.5)



async def test_a_shared_decrease_over_a_window_with_a_storm_climbs_back_to_what_flowed(
    redis_url: str,
) -> None:
    # As test_pacing's test of that name: a 40 s storm, then 20 s at 20 a second, answered; a 429 then
    # comes down from the 401 the window served but climbs back to the 20 a second that flowed.
    clock = Clock()
    config = RateLimitConfig(slow_start_seconds=0.0, discovery_decrease=0.8, discovery_recovery_seconds=20.0,
                             discovery_probe=0.05)
    async with processes(redis_url, clock, rate_limit=config) as (a, b):
        await served_before(b, 1200)
        assert await refuse(a, (await grant(a))[0]) == pytest.approx(20.0)  # the first 429, then a storm
        start = clock.now
        clock.now = start + 40.0
        await answer(a, await grant(a))  # the storm's probe got through 40 s later
        for k in range(20):  # 20 s at 20 a second (a second's worth per round trip), answered
            clock.now = start + 40.1 + k
            scope = (a, b)[k % 2]
            admissions = await grant(scope, 20)
            clock.now += 0.01
            await answer(scope, admissions)
        clock.now = start + 60.5
        rate = await refuse(a, (await grant(a))[0])
        assert rate == pytest.approx(0.8 * 401 / 60, rel=0.02)  # down from what the window served
        await paced_calls(a, b, clock, 30.0)  # calls wait for the pace, and every one is answered
        rate = shared_of(a).discovery.rate
    assert rate == pytest.approx(401 / 20.5 * (1 + 0.05 * 10 / 60), rel=0.03)  # back to what flowed


async def test_a_shared_decrease_after_a_brief_flow_climbs_back_to_what_the_window_served(
    redis_url: str,
) -> None:
    # As test_pacing's test of the burst after a storm: three answers in 0.6 s after a 58 s storm
    # are no rate to climb back to.
    clock = Clock()
    config = RateLimitConfig(slow_start_seconds=0.0, discovery_decrease=0.8, discovery_recovery_seconds=20.0,
                             discovery_probe=0.05, discovery_min_rpm=6.0)
    async with processes(redis_url, clock, rate_limit=config) as (a, b):
        await served_before(b, 1200)
        assert await refuse(a, (await grant(a))[0]) == pytest.approx(20.0)  # the first 429, then a storm
        start = clock.now
        clock.now = start + 59.4
        await answer(a, await grant(a))  # the storm's probe got through
        for k in (1, 2):
            clock.now = start + 59.4 + 0.2 * k
            admissions = await grant(b)
            clock.now += 0.01
            await answer(b, admissions)
        clock.now = start + 60.0
        assert await refuse(a, (await grant(a))[0]) == pytest.approx(0.1)  # the floor: 3 served
        await paced_calls(a, b, clock, 30.0)
        rate = shared_of(a).discovery.rate
    assert rate is not None and rate < 0.2  # not back up to the 5 a second of the burst


CLIENTS, MIN_RPM, CAP_RPM = 3, 30.0, 60.0  # a pace of 0.5 to 1 a second: 1.5 to 3 calls of credit
PROPERTY = RateLimitConfig(slow_start_seconds=0.0, discovery_min_rpm=MIN_RPM, cooldown_seconds=1.0)
ADMIT = st.tuples(st.just("admit"), st.integers(0, CLIENTS - 1), st.integers(1, 4))  # waiters in one trip
OPS = st.lists(
    st.one_of(
        ADMIT, ADMIT,  # twice as likely as the others
        st.tuples(st.just("answer"), st.integers(0, CLIENTS - 1), st.just(0)),
        st.tuples(st.just("limited"), st.integers(0, CLIENTS - 1), st.integers(0, 1)),  # 1: Retry-After
        st.tuples(st.just("tick"), st.just(0), st.integers(1, 3000)),  # hundredths of a second
    ),
    max_size=60,
)


async def _play(url: str, ops: list[tuple[str, int, int]]) -> int:
    """Play ``ops``; check the shared rate's bounds and the pace after every round trip; return refusals."""
    clock = Clock()
    tat = -math.inf  # the pace as the grants seen so far make it (GCRA at the rates the replies gave)
    refused = 0

    def check(reply: AcquireReply, granted: int) -> None:
        nonlocal tat
        rate = reply.discovered_rate
        if rate is None:
            return
        assert MIN_RPM / 60.0 - 1e-9 <= rate <= CAP_RPM / 60.0 + 1e-9
        for _ in range(granted):
            assert tat - PACE_CREDIT <= clock.now + 1e-6  # never ahead of the pace by more than its credit
            tat = max(tat, clock.now) + 1.0 / rate

    async with processes(url, clock, count=CLIENTS, rpm=CAP_RPM, rate_limit=PROPERTY) as scopes:
        open_calls: list[list[Admission]] = [[] for _ in scopes]
        for op, n, value in ops:
            scope = scopes[n]
            core, shared = scope._core, shared_of(scope)
            if op == "tick":
                clock.now += value / 100.0
            elif op == "admit":
                grants = []
                with contextlib.suppress(anyio.WouldBlock):  # a local cooldown (Retry-After) refuses
                    for _ in range(value):
                        grants.append(core.try_admit_nowait(0, clock.now))
                if not grants:
                    continue
                wants = [_Want(0) for _ in grants]
                reply = await shared._round_trip(wants)
                shared._admit(wants, reply)
                check(reply, len(reply.units) - reply.spares)
                for grant, want in zip(grants, wants, strict=True):
                    if want.ticket is None:
                        refused += 1
                        core.release_unused(grant, clock.now)
                    else:
                        open_calls[n].append(Admission(scope, grant, want.ticket))
            elif any(open_calls):
                n = next(k for k in [*range(n, CLIENTS), *range(n)] if open_calls[k])  # its own, or the next
                shared = shared_of(scopes[n])
                admission = open_calls[n].pop(0)
                if op == "answer":
                    admission.release(0)
                else:
                    admission.release_rate_limited(1.0 if value else None, 0)
                check(await shared._round_trip([]), 0)
    return refused


DECREASE = [("admit", 0, 1), ("limited", 0, 0), ("tick", 0, 1000), ("admit", 1, 1), ("answer", 1, 0),
            ("admit", 1, 1), ("limited", 1, 0), ("admit", 2, 4), ("admit", 0, 4)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
@example(ops=DECREASE)  # the first 429, an answer, a decrease: a pace, and a burst it must hold back
def test_the_shared_rate_stays_bounded_and_grants_keep_its_pace(
    redis_server: RedisServer, anyio_backend: Any, ops: Any
) -> None:
    redis_server.flush()
    anyio.run(_play, redis_server.url, ops, backend=anyio_backend)


def test_the_property_sees_the_pace_refuse(redis_server: RedisServer, anyio_backend: Any) -> None:
    # The example above does exercise the pace (else the property would check nothing).
    redis_server.flush()
    assert anyio.run(_play, redis_server.url, DECREASE, backend=anyio_backend) > 0
