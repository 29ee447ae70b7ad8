"""Quota scopes shared through a real 3-node Redis Cluster (``RedisQuotaBackend(url, cluster=True)``).

Each "process" is a QuotaRegistry with its own connection, as in
test_quota_redis.py; the URL names the cluster's first node only (the seed), so
scopes whose hash slot lives elsewhere reach their node through the cluster's
layout, and through ``MOVED`` once a slot moved after the client read it.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator

import anyio
import pytest

from trio_batch_llm import ProcessorConfig, RedisQuotaBackend
from trio_batch_llm._admission import Admission, QuotaRegistry, QuotaScope
from trio_batch_llm._admission._redis_link import RedisLink
from trio_batch_llm._admission._redis_quota import RedisSharedQuota, _Want, scope_key

from .._servers.redis import PASSWORD
from .._servers.redis_cluster import RedisClusterServers
from .test_quota_redis import registries

pytestmark = pytest.mark.anyio

NAMESPACE = "trio-batch-llm"  # RedisQuotaBackend's default


@pytest.fixture(autouse=True)
def _coredis_cluster_layout_leak() -> Iterator[None]:
    # coredis 6.9's ClusterLayout never closes the memory streams it makes (its error stream): each
    # closed cluster client leaves a ResourceWarning for the garbage collector. Expected here, so it
    # is collected here, and only here, instead of failing whichever later test the collector runs in.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            yield
        finally:
            gc.collect()


def keys_of(scope: QuotaScope) -> list[str]:
    shared = scope._shared
    assert isinstance(shared, RedisSharedQuota)
    return list(shared._keys)


def link_of(registry: QuotaRegistry) -> RedisLink:
    link = registry._link
    assert link is not None
    return link


def quota_keys_by_node(cluster: RedisClusterServers) -> dict[int, tuple[str, int]]:
    """One ``quota_scope()`` key per node, ``{port: (key, slot)}``: a scope whose keys live on that node."""
    found: dict[int, tuple[str, int]] = {}
    for index in range(200):
        key = f"key-fingerprint-{index}"
        slot = cluster.keyslot("{" + scope_key(NAMESPACE, ("provider", key)) + "}:st")
        found.setdefault(cluster.owner(slot), (key, slot))
        if len(found) == len(cluster.ports):
            return found
    raise AssertionError(f"200 scope keys did not cover the {len(cluster.ports)} nodes")


async def admit_all(scopes: list[QuotaScope], tries: int, bound: float) -> list[Admission]:
    """``tries`` admissions racing in each scope, each given up after ``bound`` s; those that got through."""
    got: list[Admission] = []

    async def one(scope: QuotaScope) -> None:
        with anyio.move_on_after(bound):
            got.append(await scope.admit())

    async with anyio.create_task_group() as tg:
        for _ in range(tries):
            for scope in scopes:
                tg.start_soon(one, scope)
    return got


async def test_two_processes_share_one_rpm_limit_on_a_cluster(cluster_url: str) -> None:
    config = ProcessorConfig(concurrency=100, max_requests_per_minute=30,
                             quota_backend=RedisQuotaBackend(cluster_url, cluster=True, max_lease=0))
    async with registries(config) as made:
        a, b = (registry.scope_for(("provider", "key-fingerprint"), config) for registry in made)
        got = await admit_all([a, b], tries=25, bound=1.0)
        assert len(got) == 30  # 50 tried at once across both processes: exactly the limit went
        for scope in (a, b):
            with pytest.raises(anyio.WouldBlock):
                scope.try_admit_nowait()
        with anyio.move_on_after(0.3) as waited:
            await b.admit()
        assert waited.cancelled_caught  # the 31st waits in either process
        got.pop().release_unused()  # never reached the provider: its unit comes back at once
        with anyio.fail_after(5):
            got.append(await a.admit())
        for admission in got:
            admission.release()
        assert a.statistics().backend == "redis" and a.statistics().backend_round_trips >= 1


async def test_two_processes_share_one_tpm_limit_on_a_cluster(cluster_url: str) -> None:
    config = ProcessorConfig(concurrency=10, max_tokens_per_minute=100,
                             quota_backend=RedisQuotaBackend(cluster_url, cluster=True))
    async with registries(config) as made:
        a, b = (registry.scope_for(("provider", "key-fingerprint"), config) for registry in made)
        first = await a.admit(60)
        with anyio.move_on_after(0.3) as waited:
            await b.admit(50)
        assert waited.cancelled_caught  # 60 + 50 > 100
        second = await b.admit(40)  # 60 + 40 fits exactly
        with anyio.move_on_after(0.3) as waited:
            await a.admit(1)
        assert waited.cancelled_caught
        first.release(10)  # used 10 of its 60: 50 come back
        with anyio.fail_after(5):
            third = await b.admit(50)
        for admission in (second, third):
            admission.release_unused()


async def test_a_scopes_keys_share_one_slot_and_scopes_spread_over_the_nodes(
    cluster_url: str, redis_cluster: RedisClusterServers,
) -> None:
    by_node = quota_keys_by_node(redis_cluster)
    config = ProcessorConfig(concurrency=10, max_requests_per_minute=2, max_tokens_per_minute=1000,
                             quota_backend=RedisQuotaBackend(cluster_url, cluster=True))
    async with registries(config) as made:
        for port, (key, slot) in by_node.items():
            a, b = (registry.scope_for(("provider", key), config) for registry in made)
            names = keys_of(a)
            # Four counting keys and discovery's two tallies (:mod:`_redis_discovery`), one slot.
            assert len(names) == 6 and {redis_cluster.keyslot(name) for name in names} == {slot}
            with anyio.fail_after(5):  # on the seed node or not: each scope reaches its own node
                held = [await a.admit(10), await b.admit(10)]
            with anyio.move_on_after(0.3) as waited:
                await a.admit(10)
            assert waited.cancelled_caught  # that node counts both processes' admissions
            assert set(names[:4]) <= redis_cluster.keys(port)  # the counting keys, on the slot node only
            for other in redis_cluster.ports:
                if other != port:
                    assert not set(names) & redis_cluster.keys(other)
            for admission in held:
                admission.release_unused()
    assert cluster_url.endswith(f":{redis_cluster.ports[0]}/0") and len(by_node) == 3


async def test_a_slot_moved_after_the_client_read_the_layout_is_followed(
    cluster_url: str, redis_cluster: RedisClusterServers,
) -> None:
    # The client learnt the layout at its start; the slot then moves: MOVED, and the script is
    # not yet loaded on its new node (NOSCRIPT). Neither may lose a count.
    key, slot = quota_keys_by_node(redis_cluster)[redis_cluster.ports[1]]
    target = redis_cluster.ports[2]
    config = ProcessorConfig(concurrency=10, max_requests_per_minute=3,
                             quota_backend=RedisQuotaBackend(cluster_url, cluster=True, max_lease=0))
    try:
        async with registries(config) as made:
            a, b = (registry.scope_for(("provider", key), config) for registry in made)
            held = [await a.admit(), await b.admit()]
            redis_cluster.move_slot(slot, target)
            assert set(keys_of(a)) & redis_cluster.keys(target)
            with anyio.fail_after(5):
                held.append(await a.admit())  # the third of 3, counted on the new node
            with anyio.move_on_after(0.3) as waited:
                await b.admit()
            assert waited.cancelled_caught  # the fourth waits: the moved count held
            assert link_of(made[0]).failures == 0 and link_of(made[1]).failures == 0
            for admission in held:
                admission.release_unused()
    finally:
        redis_cluster.move_slot(slot, redis_cluster.ports[1])


async def test_a_reshard_under_way_makes_admissions_wait_not_fail(
    cluster_url: str, redis_cluster: RedisClusterServers,
) -> None:
    # While a slot is migrating, a script whose keys are partly present (an RPM-only scope has
    # no token keys) gets TRYAGAIN until the move ends: a pause of the cluster, not an error.
    key, slot = quota_keys_by_node(redis_cluster)[redis_cluster.ports[1]]
    source, target = redis_cluster.ports[1], redis_cluster.ports[2]
    config = ProcessorConfig(concurrency=10, max_requests_per_minute=3,
                             quota_backend=RedisQuotaBackend(cluster_url, cluster=True, max_lease=0))
    migrating = False
    try:
        async with registries(config) as made:
            a, b = (registry.scope_for(("provider", key), config) for registry in made)
            held = [await a.admit(), await b.admit()]
            redis_cluster.begin_migration(slot, target)
            migrating = True
            async with anyio.create_task_group() as tg:

                async def third() -> None:
                    held.append(await a.admit())

                tg.start_soon(third)
                with anyio.fail_after(10):
                    while link_of(made[0]).failures == 0:  # noqa: ASYNC110 - a probe of the link's count
                        await anyio.sleep(0.01)
                assert len(held) == 2  # nothing admitted while the slot could not be asked
                redis_cluster.finish_migration(slot, target)
                migrating = False
            assert len(held) == 3
            with anyio.move_on_after(0.3) as waited:
                await b.admit()
            assert waited.cancelled_caught  # the count moved with the slot
            for admission in held:
                admission.release_unused()
    finally:
        if migrating:
            redis_cluster.finish_migration(slot, target)
        redis_cluster.move_slot(slot, source)


async def test_the_script_clock_reaches_every_node(
    cluster_url: str, redis_cluster: RedisClusterServers,
) -> None:
    # Tests' fake "now" travels as ARGV[1] to whichever node serves the scope: the window follows it.
    now = [1000.0]
    by_node = quota_keys_by_node(redis_cluster)
    async with anyio.create_task_group() as tg:
        link = RedisLink(RedisQuotaBackend(cluster_url, cluster=True), script_clock=lambda: now[0])
        tg.start_soon(link.serve)
        quotas = [RedisSharedQuota(link, scope_key(NAMESPACE, ("provider", key)), requests_per_minute=1,
                                   tokens_per_minute=None) for key, _ in by_node.values()]
        for quota in quotas:
            quota.hold = 0.0  # a unit counts a window from its admission
            assert (await quota._round_trip([_Want(0)])).units == ["1"]
            reply = await quota._round_trip([_Want(0)])
            assert reply.units == [] and reply.ready_at == pytest.approx(1060.0)
        now[0] += 61.0
        for quota in quotas:
            assert (await quota._round_trip([_Want(0)])).units == ["2"]
        await link.aclose()
    assert PASSWORD not in repr(link)


async def test_max_in_flight_holds_on_a_cluster_whichever_node_holds_the_scope(cluster_url: str) -> None:
    # With an RPM limit too, both scripts run in the scope's slot, on the node that owns it.
    config = ProcessorConfig(concurrency=10, max_requests_per_minute=1000, quota_backend=RedisQuotaBackend(
        cluster_url, cluster=True, max_in_flight=1, max_lease=0))
    async with registries(config) as made:
        for index in range(6):  # six scopes: their slots spread over the three nodes
            a, b = (registry.scope_for(("provider", f"key-{index}"), config) for registry in made)
            held = await a.admit()
            with anyio.move_on_after(0.3) as waited:
                await b.admit()
            assert waited.cancelled_caught  # max_in_flight=1 across both processes
            held.release()
            with anyio.fail_after(5):
                (await b.admit()).release()
