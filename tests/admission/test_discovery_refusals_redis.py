"""Random refusals in a scope shared through Redis (issue 32, point 1), on a real Redis.

Each process applies the refusal rule (:mod:`trio_batch_llm._admission._refusals`) to
its own answers, and only the 429s that act reach the shared discovery in the script.
Two processes behind a gateway that refuses 10 % of calls at random, whatever the
rate: once each has seen the noise, its refusals no longer reach the script. What
the lone 429s before that taught the script (a pace) is not undone there (each
process forgets only its own): the shared pace climbs back by ``discovery_probe``
a window, so the processes get about half their demand at first, where before
the rule every 429 lowered the shared pace (about a quarter).
"""

from __future__ import annotations

import random

import pytest

from .test_quota_redis_discovery import Clock, Provider, between, drive, processes

pytestmark = pytest.mark.anyio


class NoisyProvider(Provider):
    """:class:`Provider` behind a gateway refusing ``share`` of all calls at random (no headers)."""

    def __init__(self, clock: Clock, limit: int, share: float, seed: int = 7) -> None:
        super().__init__(clock, limit)
        self.share, self.rng, self.noise = share, random.Random(seed), 0

    def call(self) -> bool:
        if self.rng.random() < self.share:
            self.noise += 1
            return False
        return super().call()


async def test_random_refusals_do_not_slow_two_processes_sharing_a_scope(redis_url: str) -> None:
    clock = Clock()
    provider = NoisyProvider(clock, limit=10**9, share=0.1)
    start = clock.now
    async with processes(redis_url, clock) as scopes:
        admitted = await drive(scopes, provider, clock, until=start + 300.0)
        rates = [scope.statistics().paced_requests_per_minute for scope in scopes]
    assert provider.noise > 300  # the gateway did refuse its share (176 before the rule: fewer calls)
    for times in admitted:  # each wanted 10 a second
        assert between(times, start + 60.0, start + 300.0) >= 0.5 * 10 * 240, rates
