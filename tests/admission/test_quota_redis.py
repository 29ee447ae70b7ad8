"""Quota scopes shared through a real Redis: RPM, TPM with refunds, the cooldown, FIFO, an unreachable server.

Each "process" is a QuotaRegistry with its own connection (a RedisLink), as
two processes would have; they share only the Redis server.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import pickle
import warnings
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from trio_batch_llm import (
    ConfigurationError,
    FakeStrategy,
    ProcessorConfig,
    QuotaBackendError,
    RedisQuotaBackend,
    process_prompts,
)
from trio_batch_llm._admission import QuotaRegistry, QuotaScope, RateLimitObservation
from trio_batch_llm._admission._headers import Dialect
from trio_batch_llm._admission._redis_link import RedisLink
from trio_batch_llm._admission._redis_quota import RedisSharedQuota, SharedTicket, _Want

from .._paths import ROOT
from .._servers.redis import PASSWORD, start_redis

pytestmark = pytest.mark.anyio


@contextlib.asynccontextmanager
async def registries(config: ProcessorConfig, count: int = 2) -> AsyncIterator[list[QuotaRegistry]]:
    async with anyio.create_task_group() as tg:
        made = [QuotaRegistry(backend=config.quota_backend, spawn=tg.start_soon) for _ in range(count)]
        try:
            yield made
        finally:
            for registry in made:
                await registry.aclose()


async def flushed(scope: QuotaScope) -> None:
    shared = scope._shared
    assert shared is not None
    with anyio.fail_after(5):
        while shared.pending:  # noqa: ASYNC110 - the flusher signals nobody; this is a test's probe
            await anyio.sleep(0.001)


def scopes(made: list[QuotaRegistry], config: ProcessorConfig) -> list[QuotaScope]:
    return [registry.scope_for(("provider", "key-fingerprint"), config) for registry in made]


def test_backend_hides_the_password_and_validates() -> None:
    backend = RedisQuotaBackend(f"redis://:{PASSWORD}@127.0.0.1:6379/0")
    assert PASSWORD not in repr(backend) and PASSWORD not in backend.display_url
    assert "127.0.0.1:6379" in repr(backend)
    config = ProcessorConfig(quota_backend=backend)
    assert PASSWORD not in repr(config)
    assert pickle.loads(pickle.dumps(backend)) == backend
    with pytest.raises(ConfigurationError, match="quota_backend") as caught:
        RedisQuotaBackend(f"http://user:{PASSWORD}@example.com")
    assert PASSWORD not in str(caught.value)
    with pytest.raises(ConfigurationError, match="unreachable_timeout"):
        RedisQuotaBackend("redis://h", unreachable_timeout=0)
    with pytest.raises(ConfigurationError, match="quota_backend"):
        ProcessorConfig(quota_backend="redis://h")  # type: ignore[arg-type]


async def test_two_processes_share_one_rpm_limit(redis_url: str) -> None:
    config = ProcessorConfig(concurrency=10, max_requests_per_minute=5,
                             quota_backend=RedisQuotaBackend(redis_url))
    async with registries(config) as made:
        a, b = scopes(made, config)
        held = [await a.admit() for _ in range(3)] + [await b.admit() for _ in range(2)]
        with anyio.move_on_after(0.3) as waited:
            await b.admit()
        assert waited.cancelled_caught  # the sixth request in the window waits, in either process
        with pytest.raises(anyio.WouldBlock):
            a.try_admit_nowait()
        held[0].release_unused()  # never reached the provider: its unit comes back at once
        with anyio.fail_after(5):
            late = await b.admit()
        for admission in [*held[1:], late]:
            admission.release()
        stats = b.statistics()
        assert stats.backend == "redis" and stats.requests_per_minute == 5
        assert stats.backend_round_trips >= 1 and stats.in_flight == 0


async def test_tpm_reservations_are_shared_and_refunded(redis_url: str) -> None:
    config = ProcessorConfig(concurrency=10, max_tokens_per_minute=100,
                             quota_backend=RedisQuotaBackend(redis_url))
    async with registries(config) as made:
        a, b = scopes(made, config)
        assert a.needs_token_estimate
        first = await a.admit(60)
        with anyio.move_on_after(0.3) as waited:
            await b.admit(50)
        assert waited.cancelled_caught  # 60 + 50 > 100
        first.release(10)  # used 10 of its 60: 50 come back
        with anyio.fail_after(5):
            second = await b.admit(50)
        second.release(200)  # used more than reserved: the excess is charged as debt ...
        await flushed(b)  # ... once b's flusher has told Redis (other processes learn it then)
        with anyio.move_on_after(0.3) as waited:
            await a.admit(1)
        assert waited.cancelled_caught  # 10 + 200 > 100: nothing fits until the debt leaves the window


@pytest.mark.parametrize("how", ["release", "report"])
async def test_a_429_pauses_every_process(redis_url: str, how: str) -> None:
    config = ProcessorConfig(concurrency=4, max_requests_per_minute=100,
                             quota_backend=RedisQuotaBackend(redis_url))
    async with registries(config) as made:
        a, b = scopes(made, config)
        if how == "release":
            admission = await a.admit()
            admission.release_rate_limited(retry_after=30.0)
        else:  # a 429 not tied to an admission (QuotaScope.report_rate_limit)
            assert a.report_rate_limit(retry_after=30.0)
        with anyio.fail_after(5):
            while True:  # b learns of the cooldown at its next round trip
                with anyio.move_on_after(0.2):
                    (await b.admit()).release_unused()
                if b.statistics().cooldown_remaining > 0:
                    break
        assert 25 < b.statistics().cooldown_remaining <= 30


async def test_the_providers_reported_budget_binds_every_process(redis_url: str) -> None:
    config = ProcessorConfig(concurrency=10, max_requests_per_minute=1000,
                             quota_backend=RedisQuotaBackend(redis_url, max_lease=0))
    async with registries(config) as made:
        a, b = scopes(made, config)
        first = await a.admit()
        # The provider says 3 requests remain for the next 30 s (the margin keeps one back).
        said = RateLimitObservation(dialect=next(iter(Dialect)), at=first.now(), requests_limit=100,
                                    requests_remaining=3, requests_reset_at=first.now() + 30.0)
        first.release(observation=said)
        await flushed(a)
        held = [await b.admit(), await a.admit()]  # 3 - 1 (margin) = 2 more, across both processes
        with anyio.move_on_after(0.3) as waited:
            await b.admit()
        assert waited.cancelled_caught  # the ceiling holds until the reported reset
        for admission in held:
            admission.release_unused()


async def test_the_providers_reported_token_budget_binds_every_process(redis_url: str) -> None:
    config = ProcessorConfig(concurrency=10, max_tokens_per_minute=100_000,
                             quota_backend=RedisQuotaBackend(redis_url, max_lease=0))
    async with registries(config) as made:
        a, b = scopes(made, config)
        first = await a.admit(100)
        # The provider says 300 tokens remain for the next 30 s (the margin keeps one call's 100 back).
        said = RateLimitObservation(dialect=next(iter(Dialect)), at=first.now(), tokens_limit=10_000,
                                    tokens_remaining=300, tokens_reset_at=first.now() + 30.0)
        first.release(observation=said)
        await flushed(a)
        held = [await b.admit(100), await a.admit(100)]  # 300 - 100 (margin): two more calls of 100
        with anyio.move_on_after(0.3) as waited:
            await b.admit(100)
        assert waited.cancelled_caught  # the ceiling holds in every process until the reported reset
        with anyio.move_on_after(0.3) as waited:
            await b.admit(0)  # a call without an estimate still uses tokens: it waits too
        assert waited.cancelled_caught
        for admission in held:
            admission.release_unused()


async def test_a_token_budget_reported_after_its_reset_binds_again_at_an_equal_mark(redis_url: str) -> None:
    # Calls that reserve 0 tokens share one token mark: the newer answer must still replace the old one.
    now = [1000.0]
    async with anyio.create_task_group() as tg:
        link = RedisLink(RedisQuotaBackend(redis_url), script_clock=lambda: now[0])
        tg.start_soon(link.serve)
        quota = RedisSharedQuota(link, "equal-marks", requests_per_minute=None, tokens_per_minute=1000)

        async def granted() -> bool:
            reply = await quota._round_trip([_Want(0)])
            if reply.units:
                ticket = SharedTicket(reply.units[0], 0, reply.token_marks[0])
                said = RateLimitObservation(dialect=next(iter(Dialect)), at=link.clock(), tokens_limit=1000,
                                            tokens_remaining=0, tokens_reset_at=link.clock() + 10.0)
                quota.settle_ended(ticket, None, said)  # the provider: nothing left for 10 s
                await quota._round_trip([])
            return bool(reply.units)

        assert await granted()
        assert not await granted()  # the ceiling binds until the reported reset
        now[0] += 20.0
        assert await granted()  # past the reset; this call's answer says nothing is left again
        assert not await granted()
        await link.aclose()


async def test_local_waiters_keep_their_fifo(redis_url: str) -> None:
    config = ProcessorConfig(concurrency=10, max_requests_per_minute=2,
                             quota_backend=RedisQuotaBackend(redis_url))
    async with registries(config, count=1) as made:
        (scope,) = scopes(made, config)
        held = [await scope.admit(), await scope.admit()]
        order: list[int] = []

        async def wait(index: int) -> None:
            admission = await scope.admit()
            order.append(index)
            admission.release_unused()

        async with anyio.create_task_group() as tg:
            for index in range(4):
                tg.start_soon(wait, index)
                await anyio.sleep(0.01)  # a definite arrival order
            held.pop().release_unused()
        assert order == [0, 1, 2, 3]
        held.pop().release_unused()


class SlowTrips:
    """The process's clock, which a round trip advances by ``trip`` seconds (the script reads it first)."""

    def __init__(self, trip: float) -> None:
        self.now, self.trip = 1000.0, trip

    def __call__(self) -> float:
        return self.now

    def script(self) -> float:
        self.now += self.trip  # the reply arrives this much later on the process's clock
        return self.now


@pytest.mark.parametrize(("trip", "max_lease", "spares"), [
    (0.001, 1024, 100),  # fast round trips: the demand seen since the last one
    (3.0, 1024, 150),  # slow ones: two round trips at the pace (100 in 4 s = 25/s, 3 s each)
    (3.0, 64, 64),  # never more than max_lease
])
async def test_a_lease_covers_two_round_trips_at_the_recent_pace(
    redis_url: str, trip: float, max_lease: int, spares: int,
) -> None:
    clock = SlowTrips(trip)
    config = ProcessorConfig(concurrency=1000, max_requests_per_minute=1_000_000,
                             quota_backend=RedisQuotaBackend(redis_url, max_lease=max_lease))
    async with anyio.create_task_group() as tg:
        registry = QuotaRegistry(backend=config.quota_backend, clock=clock, spawn=tg.start_soon)
        try:
            scope = registry.scope_for(("provider", "key-fingerprint"), config)
            assert registry._link is not None
            registry._link.script_clock = clock.script
            shared = scope._shared
            assert shared is not None
            started = clock.now
            wants = [_Want(0)]
            shared._admit(wants, await shared._round_trip(wants))  # a leader's: the count starts here
            assert wants[0].ticket is not None and scope.statistics().backend_spares == 0
            clock.now = started + 4.0
            shared._admitted = 100  # admitted since, from spares or by leaders
            shared._admit([], await shared._round_trip([], refill=True))
            assert scope.statistics().backend_spares == spares
        finally:
            await registry.aclose()


async def test_an_unreachable_redis_admits_nothing_then_fails_clearly() -> None:
    # coredis 6.9 leaves the memory streams of a connection that never connected unclosed (its
    # Connection.__init__ makes them): their ResourceWarning is expected here, and only here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            await _unreachable_redis()
        finally:
            gc.collect()


async def _unreachable_redis() -> None:
    server = start_redis()
    try:
        backend = RedisQuotaBackend(server.url, unreachable_timeout=0.5, connect_timeout=0.2,
                                    command_timeout=0.5)
        config = ProcessorConfig(concurrency=4, max_requests_per_minute=1000, quota_backend=backend)
        async with registries(config, count=1) as made:
            (scope,) = scopes(made, config)
            (await scope.admit()).release()
            server.kill()
            started = anyio.current_time()
            with pytest.raises(QuotaBackendError) as caught:
                await scope.admit()
            assert anyio.current_time() - started >= 0.5  # it waited its bound first
            assert scope.statistics().in_flight == 0  # nothing admitted, the local slot came back
            message = str(caught.value)
            assert f"127.0.0.1:{server.port}" in message and PASSWORD not in message
            assert "unreachable_timeout" in message
    finally:
        server.close()


async def test_redis_killed_mid_run_stops_the_batch_with_nothing_over_admitted() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # coredis's leak, as above
        try:
            await _killed_mid_run()
        finally:
            gc.collect()


async def _killed_mid_run() -> None:
    server = start_redis()
    try:
        strategy = FakeStrategy(latency=0.001)
        backend = RedisQuotaBackend(server.url, unreachable_timeout=0.5, connect_timeout=0.2,
                                    command_timeout=0.5)
        config = ProcessorConfig(concurrency=8, max_requests_per_minute=20, quota_backend=backend)

        async def kill_when_the_window_is_full() -> None:
            while len(strategy.calls) < 20:  # noqa: ASYNC110 - FakeStrategy has no event to wait on
                await anyio.sleep(0.005)
            server.kill()

        errors: list[BaseException] = []
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(kill_when_the_window_is_full)
                await process_prompts(strategy, [f"p{i}" for i in range(60)], config=config)
        except* QuotaBackendError as group:
            errors.extend(group.exceptions)
        assert len(errors) == 1  # the batch stopped with the clear error
        assert len(strategy.calls) == 20  # the window's 20, and not one more while Redis was gone
        assert PASSWORD not in str(errors[0]) and f"127.0.0.1:{server.port}" in str(errors[0])
    finally:
        server.close()


async def test_a_scope_without_rpm_or_tpm_needs_no_round_trip(redis_url: str) -> None:
    config = ProcessorConfig(concurrency=3, quota_backend=RedisQuotaBackend(redis_url))
    async with registries(config, count=1) as made:
        (scope,) = scopes(made, config)
        held: list[Any] = [scope.try_admit_nowait() for _ in range(3)]
        with pytest.raises(anyio.WouldBlock):
            scope.try_admit_nowait()
        for admission in held:
            admission.release()
        assert scope.statistics().backend_round_trips == 0


async def test_the_docs_example_shares_one_limit(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    path = ROOT / "docs" / "examples" / "shared_quota_redis.py"
    spec = importlib.util.spec_from_file_location("docs_example_shared_quota_redis", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    await module.main()
    printed = capsys.readouterr().out
    assert "50 prompts wanted to go; 30 calls went (limit: 30 a minute)" in printed
    assert printed.strip() in (ROOT / "docs" / "guides" / "shared-quotas.md").read_text()
