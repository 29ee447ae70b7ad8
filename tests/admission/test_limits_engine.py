"""The engine learns the provider's limits from what both strategies report, over real loopback HTTP.

The mock server enforces its own RPM/TPM windows and, with ``ratelimit_headers``,
says on every answer how much is left (OpenAI's headers). Each strategy puts
those headers, and only those, in the answer's ``metadata["rate_limit"]`` (a
429's too, on its exception); the engine's settle stage parses them and hands
the observation to the quota scope. Time runs on an autojumping virtual clock
that real sockets tolerate (as in ``test_providers_engine``), so a minute of
pacing costs milliseconds and the instants asserted are exact.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from trio_batch_llm import ProcessorConfig, RateLimitConfig, RetryConfig, process_prompts
from trio_batch_llm.mock import MockServer, MockServerConfig, serve_mock

from ..e2e.test_fault_storm import autojump_backends
from ..strategies.test_providers_engine import EXACT, KEY, KINDS, build

pytestmark = pytest.mark.anyio

HEADER_NAMES = {f"x-ratelimit-{what}-{kind}" for what in ("limit", "remaining", "reset")
                for kind in ("requests", "tokens")}
NO_RAMP = RateLimitConfig(slow_start_seconds=0.0)


@pytest.fixture(params=autojump_backends(EXACT))
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


def enforced(server: MockServer) -> int:
    return sum(1 for r in server.requests if r.outcome == "rate_limited_enforced")


@pytest.mark.parametrize("kind", KINDS)
async def test_headers_keep_a_batch_under_a_limit_it_was_not_told(kind: str) -> None:
    # 20 requests a minute, unknown to the client; 8 calls at once and 45 items take three windows.
    async with serve_mock(MockServerConfig(api_key=KEY, rpm_limit=20, tpm_limit=100_000,
                                           ratelimit_headers=True)) as server:
        config = ProcessorConfig(concurrency=8, rate_limit=NO_RAMP)
        batch = await process_prompts(build(kind, server), [f"p{i}" for i in range(45)], config=config)
        assert batch.succeeded == 45
        requests = sorted(server.requests, key=lambda r: r.arrival)
        start = requests[0].arrival
        # Once a window is used up and nothing is in flight, one probe may go (the provider's budget
        # may come back before its reset): at most one 429 per full window, each a call alone.
        refused = [r for r in requests if r.outcome == "rate_limited_enforced"]
        assert len(refused) <= 2
        for probe in refused:
            assert not [r for r in requests if r is not probe and abs(r.arrival - probe.arrival) < 1.0]
        served = [r.arrival for r in requests if r.outcome == "ok"]
        assert served[-1] - start < 3 * 60.0  # and the batch did not idle: 45 in three windows
    for result in batch.results:
        reported = result.metadata["rate_limit"]
        assert set(reported) == HEADER_NAMES, reported
        assert reported["x-ratelimit-limit-requests"] == "20"
    assert KEY not in json.dumps([r.to_dict() for r in batch.results])


@pytest.mark.parametrize("kind", KINDS)
async def test_without_learning_the_same_batch_meets_429s(kind: str) -> None:
    # The counterpart of the test above: the scope of before issue 19 runs into the window.
    async with serve_mock(MockServerConfig(api_key=KEY, rpm_limit=20, tpm_limit=100_000,
                                           ratelimit_headers=True)) as server:
        config = ProcessorConfig(concurrency=8, rate_limit=RateLimitConfig(learn_limits=False,
                                                                           slow_start_seconds=0.0))
        batch = await process_prompts(build(kind, server), [f"p{i}" for i in range(45)], config=config)
        assert batch.succeeded == 45
        assert enforced(server) > 0


@pytest.mark.parametrize("kind", KINDS)
async def test_a_429_that_says_capacity_remains_holds_only_its_own_call(kind: str) -> None:
    wait = 0.4
    async with serve_mock(MockServerConfig(api_key=KEY, rpm_limit=1000, tpm_limit=1_000_000,
                                           ratelimit_headers=True)) as server:
        first = f"[[fail:429x1]] [[retry_after:{wait}]] limited"
        prompts = [first] + [f"[[latency:0.05]] p{i}" for i in range(1, 12)]
        config = ProcessorConfig(concurrency=4, rate_limit=NO_RAMP,
                                 retry=RetryConfig(initial_wait=0.0, max_wait=0.0))
        batch = await process_prompts(build(kind, server), prompts, config=config, preserve_order=True)
        assert batch.succeeded == 12
        limited = batch.results[0]
        assert (limited.attempts, limited.timing.cooldown) == (2, 0.0)
        assert limited.timing.backoff == pytest.approx(wait)  # its own wait, the Retry-After it was given
        requests = server.requests
        (refused,) = [r for r in requests if r.outcome == "error:429"]
        retried = [r for r in requests if r.prompt == first and r is not refused]
        assert [r.arrival - refused.arrival for r in retried] == pytest.approx([wait])
        others = sorted(r.arrival - refused.arrival for r in requests if r.prompt != first)
        # Nobody else waited: the three other workers went on every 50 ms, as without a 429.
        assert others == pytest.approx([0.0] * 3 + [0.05] * 3 + [0.1] * 3 + [0.15] * 2)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_429_with_nothing_left_pauses_the_scope_for_its_retry_after(kind: str) -> None:
    # 4 requests a minute: of the first 8 (sent before anything was known) 4 are refused, each
    # saying nothing is left and when to come back. The scope sends nothing until then.
    async with serve_mock(MockServerConfig(api_key=KEY, rpm_limit=4, tpm_limit=1_000_000,
                                           ratelimit_headers=True)) as server:
        config = ProcessorConfig(concurrency=8, rate_limit=NO_RAMP)
        batch = await process_prompts(build(kind, server), [f"p{i}" for i in range(10)], config=config)
        assert batch.succeeded == 10
        requests = sorted(server.requests, key=lambda r: r.arrival)
        start = requests[0].arrival
        first, later = requests[:8], requests[8:]
        assert [r.arrival - start for r in first] == pytest.approx([0.0] * 8)
        assert sorted(r.outcome for r in first) == ["ok"] * 4 + ["rate_limited_enforced"] * 4
        assert later[0].arrival - start == pytest.approx(60.0)  # the Retry-After: the window refills
        retried = [r for r in batch.results if r.attempts > 1]
        assert len(retried) >= 4
        assert min(r.timing.cooldown for r in retried) >= 60.0 - 1e-6  # in the scope's cooldown, not alone
