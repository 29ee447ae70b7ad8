"""The admission stall behind random 429s (issue 34): a run taken for a limit too early, then never doubted.

Behind a gateway that refuses 30 % of calls at random, one batch in several took
5-25 times its usual time. The order answers came in decided it: before random
refusals are confirmed every 429 acts on the scope, so a storm's probes that
happened to be refused a few times in a row made a run of five or six that acted;
the noise share was then confirmed from a few dozen outcomes at 5-8 % (the true
share is 30 %), for which that run was as long as the rule asks. So the scope took
it for a real full window: near such a limit no refusal counts towards the noise
share (:meth:`RefusalEvidence.at_limit`), the share stayed at 5-8 % for good, and
every few dozen calls the 30 % of refusals looked "beyond noise" and lowered the
pace and cooled the scope down again (48 cooldowns, the pace down to 200 a
minute in a run that served 1,300 a minute clean).

The scope now keeps, beside the share it acts by, the share with those runs
counted (:attr:`RefusalEvidence.explained`), and doubts a run that acted once
refusals at random explain it (:meth:`RefusalRule.doubted`): it forgets what that
run taught, as it does for a lone 429 once noise is confirmed.
"""

from __future__ import annotations

import pytest

from trio_batch_llm._admission._core import QuotaCore
from trio_batch_llm._admission._refusals import run_needed

from .._pacing_sim import served_between, simulate
from .test_discovery_refusals import NO_RAMP, NoisyProvider


def _call(core: QuotaCore, now: float, refused: bool) -> tuple[float, bool]:
    """One call at a time, admitted as soon as the scope lets it, answered 0.05 s later; return
    the time after it and whether its 429 acted on the scope."""
    now = max(now, core.ready_at(0, now))
    grant = core.try_admit_nowait(0, now)
    now += 0.05
    if not refused:
        core.release(grant, None, now)
        return now, False
    core.release_rate_limited(grant, 1.0, None, now)
    return now, not core.refusals.transient


def test_a_run_that_acted_before_noise_was_known_is_doubted_once_the_noise_explains_it() -> None:
    # The order of answers of the slow runs, scripted: calls flow, then five refusals in a row
    # (a storm's probes, each refused at random) act while every 429 still acts; then 30 % of
    # calls are refused at random, one at a time (never two in a row).
    core = QuotaCore(concurrency=16, rate_limit=NO_RAMP)
    now = 0.0
    for _ in range(80):
        now, _ = _call(core, now, False)
    for _ in range(5):
        now, _ = _call(core, now, True)
    assert core.refusals.evidence.needed == 1  # nothing confirmed yet: all five acted
    began, acted = now, []
    for k in range(600):
        now, act = _call(core, now, k % 10 in (2, 5, 8))
        acted.append(act)
    evidence = core.refusals.evidence
    # The noise share reaches the refusals' share, so lone 429s are held to a run of about 11
    # (30 % of calls). It stayed at 2 % (the 2 lone 429s among the first 91 outcomes), the run of
    # five stood for a limit, 37 of the 150 lone 429s after the first 100 calls acted (51
    # cooldowns in all), the pace fell to 2.3 calls a minute and the 600 calls took 11,000 s.
    assert evidence.noise >= 0.2 and evidence.needed >= run_needed(0.2), (evidence.noise, evidence.needed)
    assert sum(acted[100:]) == 0, sum(acted)
    assert now - began < 60.0, now - began  # 600 calls of 0.05 s (30 s), and the first cooldowns
    stats = core.statistics(now)
    assert stats.cooldown_remaining == 0.0
    assert stats.paced_requests_per_minute is None  # what the five taught is forgotten


def test_a_storm_of_probes_refused_at_random_does_not_pin_the_pace() -> None:
    # The same on the simulated provider (16 workers, 0.5 s a call, Retry-After 1 s, 30 % refused at
    # random): seed 44 is an order in which the first storm's probes are refused five times in a
    # row. It served 14 % of what a semaphore and a retry loop serve (the others of seeds 0-59:
    # 96-103 %).
    provider = NoisyProvider(limit=10**9, headers=False, share=0.3, seed=44)
    workers, latency, stop = 16, 0.5, 300.0
    client = simulate(provider, workers=workers, latency=latency, stop=stop, config=NO_RAMP)
    served = served_between(provider, 0.0, stop)
    ideal = workers * (1 - 0.3) / (latency + 0.3 * 1.0) * stop
    assert served >= 0.85 * ideal, (served, ideal)
    evidence = client.core.refusals.evidence
    assert evidence.noise == pytest.approx(0.3, abs=0.1)
    stats = client.core.statistics(stop)
    assert stats.cooldown_remaining == 0.0
    paced = stats.paced_requests_per_minute
    assert paced is None or paced >= 0.7 * served / (stop / 60.0)


async def _cut_short_after_a_429() -> tuple[int, bool]:
    from trio_batch_llm._admission import QuotaScope

    scope = QuotaScope(concurrency=4, rate_limit=NO_RAMP)
    first = scope.try_admit_nowait()
    first.release_rate_limited()  # the first 429 (no Retry-After): discovery starts, one call at a time
    probe = scope.try_admit_nowait()
    probe.release(None, answered=False)  # cut short (cancelled, timed out): no answer came
    core = scope._core
    assert core.pacing is not None
    return core.refusals.evidence.run, core.pacing.discovery._storm


@pytest.mark.anyio
async def test_a_call_cut_short_is_no_answer_to_the_refusal_rule_nor_to_discovery() -> None:
    # Admission.release(answered=False) said "no answer" to the stall watch only: the refusal rule
    # ended the run of 429s there and discovery ended its storm, as if the provider had answered.
    run, storm = await _cut_short_after_a_429()
    assert (run, storm) == (1, True)
