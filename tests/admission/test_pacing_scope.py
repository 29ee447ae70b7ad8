"""The async quota scope paced by what the provider says, and discovering a limit it does not say.

Workers admit through a real :class:`QuotaScope`, "call" by sleeping, and
release with what a simulated provider answered (its sliding window, its
headers, its Retry-After: :class:`tests._pacing_sim.Provider`). Both backends
run on virtual time (Trio's ``MockClock(autojump_threshold=0)``, asyncio's
``VirtualTimeLoop``), so the times asserted are exact. The engine and the
strategies attach observations in phase 2 of issue 19; here the scope is
driven directly.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from trio_batch_llm import RateLimitConfig
from trio_batch_llm._admission import QuotaScope, parse_rate_limit_headers

from .._pacing_sim import Provider, refused_between, served_between
from ..conftest import trio_virtual_clock
from .test_admission import Stopwatch, VirtualTimeLoop

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module", params=[
    pytest.param(("asyncio", {"loop_factory": VirtualTimeLoop}), id="asyncio"),
    pytest.param(trio_virtual_clock(), id="trio"),
])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


LEARN = RateLimitConfig(slow_start_seconds=0.0)


async def drive(scope: QuotaScope, provider: Provider, *, workers: int, latency: float, until: float,
                now: Stopwatch, admitted: list[float] | None = None) -> None:
    """Workers call through ``scope`` until ``until``; the provider decides mid-call, answers at the end."""

    async def worker() -> None:
        while now() < until:
            admission = await scope.admit()
            if admitted is not None:
                admitted.append(now())
            await anyio.sleep(latency / 2)
            ok, headers = provider.arrive(now(), 100)
            await anyio.sleep(latency / 2)
            observation = parse_rate_limit_headers(headers, anyio.current_time()) if headers else None
            if ok:
                admission.release(100, observation)
                continue
            retry_after = observation.retry_after if observation is not None else None
            wait = admission.release_rate_limited(retry_after, None, observation)
            await anyio.sleep(wait)

    async with anyio.create_task_group() as tg:
        for _ in range(workers):
            tg.start_soon(worker)


async def test_the_first_answer_sets_the_pace() -> None:
    now = Stopwatch()
    scope = QuotaScope(concurrency=8, rate_limit=LEARN)
    provider = Provider(limit=60)  # one a second, and it says so
    admitted: list[float] = []
    await drive(scope, provider, workers=8, latency=0.5, until=10.0, now=now, admitted=admitted)
    # Eight at once before anything was known; the first answers (at 0.5) set a pace of one a
    # second with 3 s of credit: four more at once (one, and three seconds' worth), then one a
    # second, never a burst at a reset.
    assert admitted[:8] == [0.0] * 8
    assert admitted[8:12] == [0.5] * 4
    assert admitted[12:] == [1.5 + k for k in range(len(admitted) - 12)]
    assert refused_between(provider, 0.0, 60.0) == 0
    stats = scope.statistics()
    assert (stats.pacing, stats.paced_requests_per_minute) == ("headers", 60.0)


async def test_headers_keep_the_scope_at_the_limit_without_429s() -> None:
    now = Stopwatch()
    scope = QuotaScope(concurrency=16, rate_limit=LEARN)
    provider = Provider(limit=240)
    admitted: list[float] = []
    await drive(scope, provider, workers=16, latency=0.25, until=180.0, now=now, admitted=admitted)
    served = served_between(provider, 0.0, 180.0)
    assert served >= 0.97 * 240 * 3
    assert refused_between(provider, 0.0, 180.0) <= 0.01 * served
    # Spread: no ten seconds hold more than ten seconds' worth plus the credit.
    busiest = max(sum(1 for t in admitted if s <= t < s + 10.0) for s in range(10, 170))
    assert busiest <= (10 + 3) * 240 / 60 + 1


@pytest.mark.parametrize("headers", [True, False], ids=["headers", "discovery"])
async def test_a_halved_limit_is_found_within_a_window(headers: bool) -> None:
    now = Stopwatch()
    scope = QuotaScope(concurrency=16, rate_limit=LEARN)
    provider = Provider(limit=240, headers=headers, schedule=((120.0, 120),))
    await drive(scope, provider, workers=16, latency=0.25, until=360.0, now=now)
    attempts = sorted(provider.accepted + provider.refused)
    settle = 180.0 if headers else 240.0
    minutes = (360.0 - settle) / 60.0
    sent = sum(1 for t in attempts if settle <= t < 360.0) / minutes
    served = served_between(provider, settle, 360.0) / minutes
    assert sent <= 120 * (1.01 if headers else 1.05)
    assert served >= 120 * (0.97 if headers else 0.85)
    everything = sum(1 for t in attempts if t < 360.0)
    # Discovery learns the halved limit from 429s by design, and its storm probes meet the wall clock's
    # next minute: over these six minutes it is refused 4.5-5.1 % of its calls (30 Trio runs; Trio's
    # randomised scheduling decides which), asyncio 4.5 %. A climb back to a burst's rate took it to
    # 4.9-7.1 %, which this bound catches.
    assert refused_between(provider, 0.0, 360.0) <= (0.01 if headers else 0.06) * everything
    assert scope.statistics().pacing == ("headers" if headers else "discovery")


async def test_a_blip_holds_only_its_own_call() -> None:
    now = Stopwatch()
    scope = QuotaScope(concurrency=4, rate_limit=LEARN)
    blip = scope.try_admit_nowait()
    others = [scope.try_admit_nowait() for _ in range(3)]
    said = parse_rate_limit_headers({
        "x-ratelimit-remaining-requests": "50", "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-tokens": "9000", "x-ratelimit-limit-tokens": "10000",
    }, anyio.current_time())
    assert blip.release_rate_limited(None, None, said) == LEARN.blip_retry_seconds
    assert blip.release_rate_limited(None, None, said) == 0.0  # released already
    again = await scope.admit()  # at once: nothing paused the scope
    assert now() == 0.0
    stats = scope.statistics()
    assert (stats.rate_limit_blips, stats.cooldown_remaining) == (1, 0.0)
    for admission in [again, *others]:
        admission.release()


async def test_only_a_retry_after_pauses_the_scope() -> None:
    now = Stopwatch()
    scope = QuotaScope(concurrency=4, rate_limit=LEARN)
    first, second = scope.try_admit_nowait(), scope.try_admit_nowait()
    first.release_rate_limited(2.0)  # the provider asked for 2 s: everyone waits
    second.release()  # (admitted before that 429: it proves nothing about now)
    probe = await scope.admit()
    assert now() == 2.0
    # Until a call admitted after the 429 gets through, they go one at a time.
    with pytest.raises(anyio.WouldBlock):
        scope.try_admit_nowait()
    probe.release()
    third, fourth = scope.try_admit_nowait(), scope.try_admit_nowait()
    # A later 429 with neither headers nor Retry-After pauses nobody: it lowers the
    # discovered rate: 0.8 of the rate admitted since calls flowed again (the two admitted once the
    # probe got through, at once: counted over the shortest span, 50 ms; the 2 s pause before the
    # probe is not the rate) ...
    third.release_rate_limited()
    stats = scope.statistics()
    assert stats.cooldown_remaining == 0.0 and stats.pacing == "discovery"
    assert stats.paced_requests_per_minute == pytest.approx(0.8 * 60 * 2 / 0.05)
    # ... and calls keep going at that rate (with its 3 s of credit).
    fifth = await scope.admit()
    assert now() == 2.0
    for admission in (fourth, fifth):
        admission.release()
