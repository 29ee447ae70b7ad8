"""Refusals a lower rate cures, and refusals it does not (issue 32, point 1).

A provider whose window is full refuses every call until it has room: its 429s
come in runs. A gateway that refuses a share of calls at random makes runs only as
long as chance does, and no lower rate cures them. The rule (:mod:`._refusals`)
lets only a run too long for the learnt noise share act on the scope (cooldown,
storm, a lower rate); shorter runs are per-call refusals, retried by their call
alone. Checked on the pure evidence, on the quota core against a simulated
provider (exact times, hypothesis), and end to end against the mock server on
a virtual clock.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from trio_batch_llm import ProcessorConfig, RateLimitConfig, RetryConfig, process_prompts
from trio_batch_llm._admission._core import QuotaCore
from trio_batch_llm._admission._refusals import ALPHA, CONFIRM, MAX_RUN, RefusalEvidence, run_needed
from trio_batch_llm.mock import MockServerConfig, serve_mock

from .._pacing_sim import Provider, refused_between, served_between, simulate
from ..e2e.test_fault_storm import autojump_backends
from ..strategies.test_providers_engine import EXACT, KEY, build

NO_RAMP = RateLimitConfig(slow_start_seconds=0.0)
SIM = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True,
               phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])  # explaining a sim is slow


@dataclass
class NoisyProvider(Provider):
    """A provider (sliding-window limit, as :class:`Provider`) behind a gateway that refuses
    ``share`` of all calls at random, whatever the rate: 429, ``Retry-After: 1``, no headers."""

    share: float = 0.0
    seed: int = 0
    noise: list[float] = field(default_factory=list)
    _rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def arrive(self, now: float, tokens: int) -> tuple[bool, dict[str, str]]:
        if self._rng.random() < self.share:
            self.noise.append(now)
            return False, {"retry-after": "1"}
        return super().arrive(now, tokens)


# -- the pure rule --------------------------------------------------------------------------


def test_the_run_asked_for_grows_with_the_noise_share() -> None:
    assert run_needed(0.0) == 1 and run_needed(ALPHA) == 2
    assert [run_needed(b) for b in (0.02, 0.1, 0.3, 0.5)] == [4, 6, 11, MAX_RUN]
    assert run_needed(0.9) == run_needed(1.0) == MAX_RUN
    for share in (0.01, 0.05, 0.2, 0.4):
        k = run_needed(share)  # a random refusal grows into a run of k no likelier than ALPHA
        assert share ** (k - 1) <= ALPHA < share ** (k - 2)


def test_lone_429s_act_until_random_refusals_are_confirmed_then_only_long_runs_do() -> None:
    evidence = RefusalEvidence()
    for _ in range(CONFIRM):
        for _ in range(9):
            evidence.answered()
        assert evidence.refused()  # a lone 429 acts as long as noise is not confirmed
    evidence.answered()
    assert evidence.confirmed and evidence.noise == pytest.approx(CONFIRM / 20)
    needed = evidence.needed
    assert needed == run_needed(evidence.noise) >= 2
    assert [evidence.refused() for _ in range(needed)] == [False] * (needed - 1) + [True]
    before = evidence.noise
    evidence.answered()  # a run as long as asked for is a full window's: not noise
    assert evidence.noise < before


@SIM
@given(share=st.sampled_from([0.02, 0.1, 0.3]), seed=st.integers(0, 2**16))
def test_random_refusals_are_retried_alone_and_the_rate_is_kept(share: float, seed: int) -> None:
    # No limit at all, only a gateway refusing `share` at random: 16 workers, 0.5 s a call.
    provider = NoisyProvider(limit=10**9, headers=False, share=share, seed=seed)
    workers, latency, stop = 16, 0.5, 300.0
    client = simulate(provider, workers=workers, latency=latency, stop=stop, config=NO_RAMP)
    served = served_between(provider, 0.0, stop)
    # Each worker: a call, and after a refusal its Retry-After alone (1 s): the rate a semaphore
    # and a retry loop reach. The scope never pauses everyone nor paces below what is served.
    # (What a lone 429 did before random refusals were confirmed costs a few seconds at the start.)
    ideal = workers * (1 - share) / (latency + share * 1.0) * stop
    assert served >= 0.85 * ideal, (served, ideal)
    stats = client.core.statistics(stop)
    assert stats.cooldown_remaining == 0.0
    paced = stats.paced_requests_per_minute
    assert paced is None or paced >= 0.7 * served / (stop / 60.0)


@pytest.mark.parametrize(("share", "seed", "limit"), [
    (share, seed, limit) for seed in range(8) for limit in (600, 1200) for share in (0.0, 0.02)
])
def test_a_true_limit_behind_random_refusals_is_still_found(share: float, seed: int, limit: int) -> None:
    # Fixed seeds, not hypothesis's: its derandomized draw differs between environments, and a clean CI
    # run drew a slow case (seed 1) that runs here never had: a decrease measured over a window that held
    # a storm, whose peak was once what that window served (459 a minute against 1,200), now climbs back
    # to what was served while calls flowed. (Behind 10 % random refusals a limit is still found, more
    # slowly: not asserted.)
    provider = NoisyProvider(limit=limit, headers=False, share=share, seed=seed)
    stop = 360.0
    simulate(provider, workers=32, latency=0.5, stop=stop, config=NO_RAMP)
    minutes = (stop - 120.0) / 60.0
    served = served_between(provider, 120.0, stop) / minutes
    refused = refused_between(provider, 120.0, stop)  # by the limit (the gateway's are provider.noise)
    assert served >= 0.85 * limit  # the limit is used ...
    # ... and the limit's own 429s stay few (behind random refusals the pace may run a little over
    # the limit until its refusals stand out from the noise: its 429s are then retried alone).
    assert refused <= (0.05 if share == 0 else 0.15) * served * minutes


def test_a_storm_of_a_full_window_still_acts_once_noise_is_known() -> None:
    # Random refusals first (the noise share is learnt), then the provider refuses everything:
    # the run grows past the run asked for, and the scope cools down and starts discovery.
    core = QuotaCore(concurrency=8, rate_limit=NO_RAMP)
    now = 0.0
    for k in range(201):  # ends with an answer: no run open
        now = max(now, core.ready_at(0, now))  # the first lone 429s may still pause the scope
        grant = core.try_admit_nowait(0, now)
        if k % 10 == 9:
            wait, _ = core.release_rate_limited(grant, 1.0, None, now)
            assert k < 20 or wait == 1.0  # a per-call refusal once noise is confirmed: its own wait
        else:
            core.release(grant, None, now)
        now += 0.05
    assert core.refusals.evidence.confirmed and core.cooldown.remaining(now) == 0.0
    needed = core.refusals.evidence.needed
    waits = []
    for _ in range(needed):
        wait, _ = core.release_rate_limited(core.try_admit_nowait(0, now), 30.0, None, now)
        waits.append(wait)
    assert waits == [30.0] * (needed - 1) + [0.0]  # the last one ended a long run: the scope waits
    assert core.cooldown.remaining(now) == pytest.approx(30.0)
    assert core.statistics(now).pacing != "off" and core.pacing is not None
    assert core.pacing.discovery.generation > 0


# -- end to end: the engine against the mock server, on a virtual clock ---------------------


@pytest.fixture(params=autojump_backends(EXACT))
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


async def _virtual_seconds(share: float, prompts: int) -> float:
    import anyio

    async with serve_mock(MockServerConfig(api_key=KEY, latency=0.5, rate_limit_rate=share, retry_after=1.0,
                                           seed=3, record_requests=False)) as server:
        config = ProcessorConfig(concurrency=16, retry=RetryConfig(max_attempts=50))
        start = anyio.current_time()
        batch = await process_prompts(build("compatible", server), [f"p{i}" for i in range(prompts)],
                                      config=config)
        assert batch.succeeded == prompts
        if share:
            assert server.stats.rate_limited > 0
        return anyio.current_time() - start


@pytest.mark.anyio
async def test_sporadic_429s_cost_little_more_than_their_own_retries() -> None:
    # 600 prompts, 5 % refused at random with Retry-After 1 s and no rate-limit headers: the batch
    # takes about what each refused item's own second adds (1.15x), plus what the first lone 429s
    # cost before random refusals are confirmed (up to ~1.6x, by the order answers come in), not a
    # collapsing rate (it took 4.2x).
    clean = await _virtual_seconds(0.0, 600)
    noisy = await _virtual_seconds(0.05, 600)
    assert noisy <= 1.75 * clean, (noisy, clean)


@pytest.mark.anyio
async def test_thirty_percent_random_429s_do_not_collapse_the_scope() -> None:
    # 30 %: each worker waits out its own refusals (0.5 s a call, 1 s a refusal: about 1.14 s an
    # item, so 600 items on 16 workers take ~43 s, 2.3x), with no scope-wide pause (it took hours:
    # 15,000 virtual seconds).
    clean = await _virtual_seconds(0.0, 600)
    noisy = await _virtual_seconds(0.3, 600)
    # The first lone 429s' cooldowns run their whole Retry-After before the rule lifts them, and the
    # circuit breaker's start limit holds the first wave. One run in five or six took 13-33x (issue
    # 33's 14.4x): a storm's probes refused a few times in a row before noise was confirmed stood
    # for a limit for good (tests/admission/test_stall_refusals.py). Since that run is doubted again (issue
    # 34), 91 of 92 runs on Trio took 2.63-3.34x and one 4.04x; 4.5x leaves that room and still
    # fails the stall (13x) and the old collapse (800x).
    assert noisy <= 4.5 * clean, (noisy, clean)
