"""Single flight in CacheGate: identical keys in flight wait for one leader, in this process and across."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_batch_llm import MemoryResponseCache, SqliteResponseCache
from trio_batch_llm._cache._flight import CacheGate, Claim
from trio_batch_llm._cache._key import request_key
from trio_batch_llm._cache._memory import MemoryCacheConnection
from trio_batch_llm._cache._open import open_cache
from trio_batch_llm._cache._records import CachedAnswer, CacheKey

from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio

virtual = pytest.mark.parametrize("anyio_backend", [pytest.param(trio_virtual_clock(), id="trio-virtual")])
virtual_threads = pytest.mark.parametrize(
    "anyio_backend", [pytest.param(trio_virtual_clock(threads=True), id="trio-virtual")])


def key(i: int) -> CacheKey:
    return request_key({"provider": "fake", "model": "m", "prompt": f"p{i}"})


def answer(text: str) -> CachedAnswer:
    return CachedAnswer(output=text, usage={"input_tokens": 1}, created_at=1.0)


async def gather_lookups(gate: CacheGate, k: CacheKey, n: int, out: list[Any]) -> None:
    async def one() -> None:
        out.append(await gate.lookup(k))

    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(one)


async def test_identical_lookups_in_flight_wait_for_one_leader(anyio_backend: str) -> None:
    config = MemoryResponseCache()
    gate = CacheGate(MemoryCacheConnection(config), config, "read-write")
    first = await gate.lookup(key(1))
    assert isinstance(first, Claim)
    got: list[Any] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(gather_lookups, gate, key(1), 9, got)
        await anyio.wait_all_tasks_blocked()
        assert got == []  # all nine wait for the leader
        await gate.settle(first, answer("the one call"))
    assert [a.output for a in got] == ["the one call"] * 9
    assert gate.statistics().claims == 1 and gate.statistics().shared == 9
    assert (await gate.lookup(key(1))) == answer("the one call")  # a plain hit now


async def test_a_failed_leader_hands_over_to_exactly_one_waiter(anyio_backend: str) -> None:
    config = MemoryResponseCache()
    gate = CacheGate(MemoryCacheConnection(config), config, "read-write")
    first = await gate.lookup(key(1))
    assert isinstance(first, Claim)
    got: list[Any] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(gather_lookups, gate, key(1), 5, got)
        await anyio.wait_all_tasks_blocked()
        await gate.settle(first, None)  # the call failed: nothing written
        await anyio.wait_all_tasks_blocked()
        claims = [g for g in got if isinstance(g, Claim)]
        assert len(claims) == 1 and len(got) == 1
        await gate.settle(claims[0], answer("second try"))
    assert [g.output for g in got[1:]] == ["second try"] * 4
    assert gate.statistics().claims == 2


async def test_a_cancelled_leader_hands_over_and_a_cancelled_waiter_raises(anyio_backend: str) -> None:
    config = MemoryResponseCache()
    gate = CacheGate(MemoryCacheConnection(config), config, "read-write")
    calls: list[str] = []
    outcomes: dict[str, Any] = {}

    async def worker(name: str, scope_out: dict[str, anyio.CancelScope], hang: bool) -> None:
        with anyio.CancelScope() as scope:
            scope_out[name] = scope
            found = await gate.lookup(key(1))
            if not isinstance(found, Claim):
                outcomes[name] = found.output
                return
            calls.append(name)
            try:
                if hang:
                    await anyio.sleep_forever()
                outcomes[name] = f"made by {name}"
                await gate.settle(found, answer(f"made by {name}"))
            finally:
                with anyio.CancelScope(shield=True) as bound:
                    bound.deadline = anyio.current_time() + 5
                    await gate.settle(found, None)  # a no-op when settled above
        if scope.cancelled_caught:
            outcomes[name] = "cancelled"

    scopes: dict[str, anyio.CancelScope] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker, "leader", scopes, True)
        await anyio.wait_all_tasks_blocked()
        for name in ("w1", "w2", "w3"):
            tg.start_soon(worker, name, scopes, False)
        await anyio.wait_all_tasks_blocked()
        scopes["w3"].cancel()  # a waiter cancelled: it raises, nothing else changes
        await anyio.wait_all_tasks_blocked()
        assert outcomes == {"w3": "cancelled"}
        scopes["leader"].cancel()
    assert calls[0] == "leader" and calls[1:] in (["w1"], ["w2"])  # exactly one waiter took over
    made = f"made by {calls[1]}"
    assert outcomes == {"w3": "cancelled", "leader": "cancelled", "w1": made, "w2": made}
    assert gate._flight_map() == {}


async def test_gates_over_one_cache_share_flights_and_other_caches_do_not(anyio_backend: str) -> None:
    shared = MemoryResponseCache()
    other = MemoryResponseCache()
    a = CacheGate(MemoryCacheConnection(shared), shared, "read-write")
    b = CacheGate(MemoryCacheConnection(shared), shared, "read-write")  # another pool, same cache
    c = CacheGate(MemoryCacheConnection(other), other, "read-write")
    lead = await a.lookup(key(1))
    assert isinstance(lead, Claim)
    assert isinstance(await c.lookup(key(1)), Claim)  # another cache: its own call
    got: list[Any] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(gather_lookups, b, key(1), 3, got)
        await anyio.wait_all_tasks_blocked()
        assert got == []
        await a.settle(lead, answer("shared"))
    assert [g.output for g in got] == ["shared"] * 3


@pytest.mark.parametrize("mode", ["read-only", "write-only", "refresh"])
async def test_modes_without_single_flight_never_wait(anyio_backend: str, mode: Any) -> None:
    config = MemoryResponseCache()
    gate = CacheGate(MemoryCacheConnection(config), config, mode)
    first = await gate.lookup(key(1))
    second = await gate.lookup(key(1))  # not waiting for the first
    assert isinstance(first, Claim) and isinstance(second, Claim)
    await gate.settle(first, answer("one"))
    await gate.settle(second, answer("two"))
    written = await gate.connection.get(key(1))
    assert (written.output if written else None) == (None if mode == "read-only" else "two")
    if mode == "read-only":
        await MemoryCacheConnection(config).put(key(1), answer("there"))
        assert await gate.lookup(key(1)) == answer("there")
    else:
        assert isinstance(await gate.lookup(key(1)), Claim)  # never reads


async def test_settle_twice_is_a_no_op(anyio_backend: str) -> None:
    config = MemoryResponseCache()
    gate = CacheGate(MemoryCacheConnection(config), config, "read-write")
    claim = await gate.lookup(key(1))
    assert isinstance(claim, Claim)
    await gate.settle(claim, answer("a"))
    await gate.settle(claim, answer("b"))
    assert (await gate.lookup(key(1))) == answer("a")


# -- across processes (an isolated gate stands for another process) -----------------------


@virtual
async def test_another_process_polls_until_the_answer_is_written(anyio_backend: Any) -> None:
    config = MemoryResponseCache(lease_seconds=30)
    here = CacheGate(MemoryCacheConnection(config, clock=anyio.current_time), config, "read-write")
    there = CacheGate(MemoryCacheConnection(config, clock=anyio.current_time), config, "read-write",
                      isolated=True)
    lead = await here.lookup(key(1))
    assert isinstance(lead, Claim)
    start = anyio.current_time()
    got: list[Any] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(gather_lookups, there, key(1), 1, got)
        await anyio.sleep(1.0)
        assert got == []
        await here.settle(lead, answer("from the other process"))
    assert got == [answer("from the other process")]
    # Polls at 0.02, 0.06, 0.14, 0.30, 0.62, 1.12 s (pauses double up to 0.5 s): the first after
    # the write reads it.
    assert anyio.current_time() - start == pytest.approx(1.12)
    assert there.statistics().polls == 6 and there.statistics().claims == 0


@virtual
async def test_a_claim_whose_holder_died_lapses_and_is_taken_over(anyio_backend: Any) -> None:
    config = MemoryResponseCache(lease_seconds=5)
    dead = CacheGate(MemoryCacheConnection(config, clock=anyio.current_time), config, "read-write",
                     isolated=True)
    there = CacheGate(MemoryCacheConnection(config, clock=anyio.current_time), config, "read-write",
                      isolated=True)
    assert isinstance(await dead.lookup(key(1)), Claim)  # and never settled: its process died
    start = anyio.current_time()
    taken = await there.lookup(key(1))
    assert isinstance(taken, Claim)
    assert 5.0 <= anyio.current_time() - start <= 5.5


@virtual
async def test_a_write_between_miss_and_claim_is_read_not_called_again(anyio_backend: Any) -> None:
    config = MemoryResponseCache()
    conn = MemoryCacheConnection(config, clock=anyio.current_time)
    gate = CacheGate(conn, config, "read-write")
    real_get = conn.get
    gets = 0

    async def get_then_someone_writes(k: CacheKey) -> CachedAnswer | None:
        nonlocal gets
        gets += 1
        found = await real_get(k)
        if gets == 1:  # another process writes right after our miss
            await MemoryCacheConnection(config).put(k, answer("theirs"))
        return found

    conn.get = get_then_someone_writes  # type: ignore[method-assign]
    assert await gate.lookup(key(1)) == answer("theirs")
    assert gate.statistics().claims == 0
    assert await conn.claim(key(1), "someone else", 1)  # our claim was let go


@virtual_threads
async def test_two_processes_on_one_sqlite_file_make_each_call_once(
        anyio_backend: Any, tmp_path: Path) -> None:
    config = SqliteResponseCache(tmp_path / "c.sqlite3")
    calls: list[int] = []
    async with open_cache(config) as one, open_cache(config) as two:
        gates = [CacheGate(one, config, "read-write", isolated=True),
                 CacheGate(two, config, "read-write", isolated=True)]

        async def item(gate: CacheGate, i: int) -> None:
            found = await gate.lookup(key(i))
            if isinstance(found, Claim):
                calls.append(i)
                try:
                    await anyio.sleep(0.5)
                finally:
                    with anyio.CancelScope(shield=True):
                        await gate.settle(found, answer(f"a{i}"))

        async with anyio.create_task_group() as tg:
            for i in range(10):
                for gate in gates:
                    tg.start_soon(item, gate, i)
    assert sorted(calls) == list(range(10))


# -- the property -------------------------------------------------------------------------


@virtual
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    callers=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2),
                               st.sampled_from(["ok", "fail", "cancel"]), st.integers(0, 30)),
                     min_size=1, max_size=24),
    seed=st.integers(0, 2**16),
)
async def test_every_caller_gets_an_answer_or_a_claim_and_one_claim_per_key_at_a_time(
        anyio_backend: Any, callers: list[tuple[int, int, str, int]], seed: int) -> None:
    """Callers (key, gate, outcome, start tick) on three gates: two share this process, one stands for
    another process. Whatever leaders do, each caller ends with an answer or a claim (or its own
    cancellation), and no key ever has two claims outstanding."""
    rng = random.Random(seed)
    config = MemoryResponseCache(lease_seconds=1000)
    gates = [CacheGate(MemoryCacheConnection(config, clock=anyio.current_time), config, "read-write",
                       isolated=(g == 2)) for g in range(3)]
    outstanding = [0, 0, 0]
    peak = [0, 0, 0]
    ended: list[str] = []

    async def caller(k: int, g: int, outcome: str, tick: int) -> None:
        await anyio.sleep(tick / 10)
        with anyio.CancelScope() as scope:
            found = await gates[g].lookup(key(k))
            if not isinstance(found, Claim):
                assert found.output.startswith(f"k{k}:")
                ended.append("answer")
                return
            outstanding[k] += 1
            peak[k] = max(peak[k], outstanding[k])
            made: CachedAnswer | None = None
            try:
                await anyio.sleep(rng.random())
                if outcome == "cancel":
                    scope.cancel()
                    await anyio.lowlevel.checkpoint()
                if outcome == "ok":
                    made = answer(f"k{k}: by {g}")
            finally:
                outstanding[k] -= 1
                with anyio.CancelScope(shield=True) as bound:
                    bound.deadline = anyio.current_time() + 5
                    await gates[g].settle(found, made)
            ended.append("claim")
        if scope.cancelled_caught:
            ended.append("cancelled")

    with anyio.fail_after(3600):
        async with anyio.create_task_group() as tg:
            for k, g, outcome, tick in callers:
                tg.start_soon(caller, k, g, outcome, tick)
    assert max(peak) <= 1 and outstanding == [0, 0, 0]
    assert len(ended) == len(callers)
    for g in gates[:2]:
        assert g._flight_map() == {} and gates[2]._flight_map() == {}
