"""A bound on calls in flight across processes (``RedisQuotaBackend(max_in_flight=...)``) on a real Redis.

Each "process" is a QuotaRegistry with its own connection, as in test_quota_redis; lease expiry is
driven by a fake script clock (``script_clock``), so nothing waits for a lease to expire in real time.
A "dead" process is one whose registry is never closed: its leases are neither released nor renewed.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from trio_batch_llm import ConfigurationError, ProcessorConfig, RedisQuotaBackend
from trio_batch_llm._admission import QuotaRegistry, QuotaScope
from trio_batch_llm._admission._redis_inflight import SharedInFlight
from trio_batch_llm._admission._redis_link import RedisLink

from .._servers.redis import PASSWORD

pytestmark = pytest.mark.anyio

KEY = ("provider", "key-fingerprint")


@contextlib.asynccontextmanager
async def processes(
    config: ProcessorConfig, now: list[float], count: int = 2
) -> AsyncIterator[list[tuple[QuotaScope, SharedInFlight]]]:
    """``count`` registries sharing the scope ``KEY``, their scripts on the fake clock ``now``."""
    async with anyio.create_task_group() as tg:
        made = [QuotaRegistry(backend=config.quota_backend, spawn=tg.start_soon) for _ in range(count)]
        try:
            pairs = []
            for registry in made:
                scope = registry.scope_for(KEY, config)
                assert registry._link is not None
                registry._link.script_clock = lambda: now[0]
                assert scope._shared is not None and scope._shared.inflight is not None
                pairs.append((scope, scope._shared.inflight))
            yield pairs
        finally:
            for registry in made:
                await registry.aclose()


async def trips_while_blocked(inflight: SharedInFlight, trips: int = 2) -> None:
    """Until ``inflight`` has asked Redis ``trips`` more times (so a grant would have come by then)."""
    start = inflight.round_trips
    with anyio.fail_after(10):
        while inflight.round_trips < start + trips:  # noqa: ASYNC110 - the leader signals nobody
            await anyio.sleep(0.005)


async def drained(inflight: SharedInFlight) -> None:
    with anyio.fail_after(5):
        while inflight.pending:  # noqa: ASYNC110 - the flusher signals nobody; this is a test's probe
            await anyio.sleep(0.001)
        await anyio.sleep(0.05)  # the round trip that carried them


def config_for(redis_url: str, bound: int, **knobs: Any) -> ProcessorConfig:
    return ProcessorConfig(concurrency=10, quota_backend=RedisQuotaBackend(redis_url, max_in_flight=bound,
                                                                           **knobs))


def test_max_in_flight_is_validated_and_kept() -> None:
    backend = RedisQuotaBackend(f"redis://:{PASSWORD}@127.0.0.1:6379/0", max_in_flight=4, in_flight_expiry=5)
    assert (backend.max_in_flight, backend.in_flight_expiry) == (4, 5.0)
    assert pickle.loads(pickle.dumps(backend)) == backend
    assert backend != RedisQuotaBackend(f"redis://:{PASSWORD}@127.0.0.1:6379/0", max_in_flight=5)
    assert "max_in_flight=4" in repr(backend) and PASSWORD not in repr(backend)
    assert RedisQuotaBackend("redis://h").max_in_flight is None
    for bad in (0, -1, True, 2.5, "4"):
        with pytest.raises(ConfigurationError, match="max_in_flight") as caught:
            RedisQuotaBackend("redis://h", max_in_flight=bad)  # type: ignore[arg-type]
        assert repr(bad) in str(caught.value)
    for bad_expiry in (0, -1.0, float("nan")):
        with pytest.raises(ConfigurationError, match="in_flight_expiry"):
            RedisQuotaBackend("redis://h", max_in_flight=2, in_flight_expiry=bad_expiry)


async def test_two_processes_share_one_bound_and_every_release_frees_a_slot(redis_url: str) -> None:
    now = [1000.0]
    config = config_for(redis_url, 3)
    async with processes(config, now) as [(a, a_leases), (b, b_leases)]:
        held = [await a.admit(), await a.admit(), await b.admit()]
        async with anyio.create_task_group() as tg:
            got: list[Any] = []

            async def wait_b() -> None:
                got.append(await b.admit())

            tg.start_soon(wait_b)
            await trips_while_blocked(b_leases)
            assert got == []  # 3 in flight across both processes: the fourth waits
            held.pop(0).release_unused()  # a's call never started: its slot goes to b
        assert len(got) == 1
        held.pop(0).release()  # ends normally
        got.pop().release(10)
        with anyio.fail_after(5):
            again = [await a.admit(), await a.admit()]  # two slots came back
        for admission in [*held, *again]:
            admission.release()
        await drained(a_leases)
        await drained(b_leases)
        assert a_leases.statistics() == (0, 0) and b_leases.statistics() == (0, 0)
        with anyio.fail_after(5):
            three = [await b.admit() for _ in range(3)]  # every slot is free again, in Redis too
        for admission in three:
            admission.release()
        limited = await a.admit()
        limited.release_rate_limited(retry_after=None)  # a 429 (it pauses both: checked last)
        assert a_leases.statistics() == (0, 0) and a_leases.pending
        await drained(a_leases)


async def test_a_cancelled_call_and_a_cancelled_waiter_give_their_slot_back(redis_url: str) -> None:
    now = [1000.0]
    async with processes(config_for(redis_url, 1), now) as [(a, _), (b, b_leases)]:
        first = await a.admit()
        with anyio.move_on_after(0.2):  # cancelled while waiting: leaves no lease and no place behind
            await b.admit()
        assert b_leases.statistics() == (0, 0)
        with anyio.CancelScope() as scope:
            scope.cancel()
            try:
                await anyio.sleep(1)  # the call, cancelled
            finally:
                first.release_unused()
        with anyio.fail_after(5):
            second = await b.admit()
        second.release()


async def test_a_dead_process_gives_its_slots_back_at_the_expiry_and_a_living_one_renews(
    redis_url: str,
) -> None:
    now = [1000.0]
    config = config_for(redis_url, 2, in_flight_expiry=30.0)
    async with anyio.create_task_group() as dead_group:
        # The dead process: its registry is abandoned, not closed; its link task is cancelled below.
        dead = QuotaRegistry(backend=config.quota_backend, spawn=dead_group.start_soon)
        dead_scope = dead.scope_for(KEY, config)
        assert dead._link is not None
        dead._link.script_clock = lambda: now[0]
        [await dead_scope.admit() for _ in range(2)]  # never released
        dead_group.cancel_scope.cancel()  # kill -9: no hand back, no renewal
    async with processes(config, now, count=2) as [(a, a_leases), (b, b_leases)]:
        async with anyio.create_task_group() as tg:
            got: list[Any] = []

            async def wait(scope: QuotaScope) -> None:
                got.append(await scope.admit())

            tg.start_soon(wait, a)
            await trips_while_blocked(a_leases)
            now[0] += 29.0
            await trips_while_blocked(a_leases)
            assert got == []  # the dead process's leases still count before their expiry
            now[0] += 1.5
            with anyio.fail_after(5):
                while not got:  # noqa: ASYNC110 - the waiter signals nobody
                    await anyio.sleep(0.005)
            # a now holds a lease granted at 1030.5; it renews at 1050 (before its expiry at 1060.5)
            now[0] += 19.5
            await a_leases.renew()
            tg.start_soon(wait, b)
            tg.start_soon(wait, b)
            with anyio.fail_after(5):
                while len(got) < 2:  # noqa: ASYNC110 - the waiter signals nobody
                    await anyio.sleep(0.005)
            now[0] += 25.0  # 55 s after its grant, 25 after its renewal: a's lease still holds
            await trips_while_blocked(b_leases)
            assert len(got) == 2
            got[0].release()
        assert len(got) == 3
        for admission in got[1:]:
            admission.release()


async def test_a_lease_renewed_too_late_is_reported_lost(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    now = [1000.0]
    async with processes(config_for(redis_url, 1, in_flight_expiry=10.0), now, count=1) as [(a, leases)]:
        admission = await a.admit()
        now[0] += 11.0
        with caplog.at_level("WARNING", logger="trio_batch_llm.admission"):
            await leases.renew()
        assert leases.lost == 1
        assert "lost their lease" in caplog.text and "in_flight_expiry=10" in caplog.text
        admission.release()


async def test_the_link_renews_leases_on_its_own(redis_url: str) -> None:
    now = [1000.0]
    # Renewals every 0.1 s of real time; the leases' expiry, 0.3 s, is read on the fake clock.
    config = config_for(redis_url, 1, in_flight_expiry=0.3)
    async with processes(config, now) as [(a, a_leases), (b, b_leases)]:
        admission = await a.admit()
        now[0] += 0.2
        await trips_while_blocked(a_leases, 1)  # a renewal by the link's task (a has no waiter)
        now[0] += 0.25  # past the first expiry, not the renewed one
        async with anyio.create_task_group() as tg:
            got: list[Any] = []

            async def wait_b() -> None:
                got.append(await b.admit())

            tg.start_soon(wait_b)
            await trips_while_blocked(b_leases)
            assert got == [] and a_leases.lost == 0
            admission.release()
        got[0].release()


async def test_slots_go_round_the_waiting_processes(redis_url: str) -> None:
    """A process that releases and asks again at once does not keep the slot from one already waiting."""
    now = [1000.0]
    async with processes(config_for(redis_url, 1), now) as [(a, a_leases), (b, b_leases)]:
        order: list[str] = []
        first = await a.admit()
        async with anyio.create_task_group() as tg:

            async def call(name: str, scope: QuotaScope) -> None:
                admission = await scope.admit()
                order.append(name)
                await anyio.sleep(0.01)
                admission.release()

            for _ in range(4):
                tg.start_soon(call, "a", a)
            await trips_while_blocked(a_leases)
            tg.start_soon(call, "b", b)
            await trips_while_blocked(b_leases)
            first.release()
        assert sorted(order) == ["a"] * 4 + ["b"]
        assert order.index("b") <= 1, order  # a was in line first; b next, not after all of a's




async def test_a_lease_released_while_its_renewal_is_on_the_way_is_not_reported_lost(
    redis_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    async with processes(config_for(redis_url, 2), now, count=1) as [(a, leases)]:
        admission = await a.admit()
        send = RedisLink.run_source
        renewals: list[Any] = []

        async def release_overtakes_renewal(link: RedisLink, source: str, keys: Any, args: Any) -> Any:
            if not renewals:  # the renewal, already holding the lease's id in its arguments
                renewals.append(args)
                admission.release()
                await leases.flush_idle()  # the release's own round trip gets there first
            return await send(link, source, keys, args)

        monkeypatch.setattr(RedisLink, "run_source", release_overtakes_renewal)
        with caplog.at_level("WARNING", logger="trio_batch_llm.admission"):
            reply = await leases._round_trip(-1, [], renew=True)
        assert len(reply.lost) == 1  # Redis no longer had it ...
        assert leases.lost == 0 and "lost their lease" not in caplog.text  # ... because it was released
