"""Leases: the count of calls made again after a driver lost its lease mid-call is the true one.

Two drivers on one run, on SQLite and on PostgreSQL, in this process (two
handles stand for two processes). The first is cut short while its calls are
in flight (its ``wait()``'s scope cancelled, as a deadline or Ctrl+C does) and
holds many more items leased than it started; the second finishes the run.
The strategies count every call they get, as a provider would: the run's
``reexecuted_after_lease_expiry`` must equal the calls made twice, not the
items the first driver held. ``test_runs_leases_kill.py`` does the same with
``kill -9`` and a lease that expires. And a call that outlasts many lease
lengths is not taken over: the driver's heartbeat renews its lease meanwhile.
"""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

from trio_batch_llm import ProcessorConfig
from trio_batch_llm._cli._render import status_json
from trio_batch_llm._runs import iter_run_results, open_run, read_run_snapshot
from trio_batch_llm._runs._reader import read_lease_report

from .._runs_child import IDENTITY, CountingStrategy, prompts

LEASE = 30.0
ITEMS = 40


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        url: str = request.getfixturevalue("postgres_url")
        return url
    return str(tmp_path / "runs.sqlite")


def repeated(*strategies: CountingStrategy) -> int:
    """Calls beyond the first of each prompt, over every driver: what a provider billed twice."""
    calls: Counter[str] = Counter()
    for strategy in strategies:
        calls.update(strategy.calls)
    return sum(count - 1 for count in calls.values())


def status(store: str) -> dict[str, Any]:
    return status_json(read_run_snapshot(store, "run"), read_lease_report(store, "run"))


@pytest.mark.anyio
async def test_a_driver_cut_short_mid_call_counts_the_calls_made_again_not_the_items_it_held(
    store: str,
) -> None:
    # The first driver's calls never answer: it is stopped with both in flight, holding (leased)
    # far more items than the two it started.
    first = CountingStrategy(hold_from_call=1, signal_at_call=2)
    second = CountingStrategy()
    config = ProcessorConfig(concurrency=2)
    async with await open_run(store, "run", first, prompts(ITEMS), identity=IDENTITY, config=config,
                              lease_seconds=LEASE, slice_items=ITEMS, poll_interval=0.02) as run:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run.wait)
                await first.reached.wait()
                tg.cancel_scope.cancel("the first driver is stopped mid-call")
    assert first.total == 2
    async with await open_run(store, "run", second, prompts(ITEMS), identity=IDENTITY, config=config,
                              lease_seconds=LEASE, poll_interval=0.02) as run:
        snap = await run.wait(timeout=60)
    assert (snap.status, snap.done) == ("completed", ITEMS)
    assert Counter(r.item_id for r in iter_run_results(store, "run")) == Counter(
        f"item-{i}" for i in range(ITEMS))
    assert repeated(first, second) == 2  # the two calls in flight, made again by the second driver
    assert status(store)["reexecuted_after_lease_expiry"] == 2


async def pause_after_reached(store: str, first: CountingStrategy, config: ProcessorConfig, *,
                              settle: float = 0.0) -> None:
    """A first driver that pauses the run once ``first`` reached its signal call (``settle`` later),
    then leaves."""
    async with await open_run(store, "run", first, prompts(ITEMS), identity=IDENTITY, config=config,
                              lease_seconds=LEASE, slice_items=ITEMS, poll_interval=0.02) as run:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run.wait)
                await first.reached.wait()
                if settle:
                    await anyio.sleep(settle)
                await run.pause()
                tg.cancel_scope.cancel("the first driver leaves after the pause")


@pytest.mark.anyio
async def test_a_pause_leaves_nothing_counted(store: str) -> None:
    # A pause drains: the calls in flight finish and are recorded, the items held but not started
    # go back uncalled. Nothing is called twice, and nothing is counted.
    first = CountingStrategy(signal_at_call=3, latency=0.01)
    second = CountingStrategy()
    config = ProcessorConfig(concurrency=2)
    await pause_after_reached(store, first, config)
    async with await open_run(store, "run", second, prompts(ITEMS), identity=IDENTITY, config=config,
                              lease_seconds=LEASE, poll_interval=0.02) as run:
        await run.resume()
        snap = await run.wait(timeout=60)
    assert (snap.status, snap.done) == ("completed", ITEMS)
    assert repeated(first, second) == 0
    assert status(store)["reexecuted_after_lease_expiry"] == 0


class FakeClock:
    """The repositories' clock (lease expiry), moved by the test; thread-safe enough for a float."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _repository(store: str, clock: FakeClock) -> Any:
    from trio_batch_llm._runs import PostgresRunRepository, SqliteRunRepository

    if store.startswith("postgresql://"):
        return PostgresRunRepository(store, clock=clock)
    return SqliteRunRepository(store, clock=clock)


def _heartbeat_of(store: str, driver_id: str) -> float:
    report = read_lease_report(store, "run")
    return max(d.last_heartbeat for d in report.drivers if d.driver_id == driver_id)


async def _until_renewed(store: str, driver_id: str, at: float) -> None:
    """Until the driver's heartbeat has renewed its lease at ``at`` (the database, polled)."""
    renewed = functools.partial(_heartbeat_of, store, driver_id)
    while await anyio.to_thread.run_sync(renewed) < at:  # noqa: ASYNC110 - another thread's writes
        await anyio.sleep(0.01)


@pytest.mark.anyio
async def test_a_call_longer_than_the_lease_is_not_made_again(store: str) -> None:
    # The lease is renewed by its driver's heartbeat for as long as the driver runs, not per call:
    # a call held for ten lease lengths (of the repositories' clock, moved by this test only once
    # the driver has renewed at the last step) is never taken by the other driver.
    lease = 0.3
    clock = FakeClock()
    slow = CountingStrategy(hold_from_call=1, signal_at_call=1)
    other = CountingStrategy()
    config = ProcessorConfig(concurrency=1)
    async with await open_run(_repository(store, clock), "run", slow, prompts(1), identity=IDENTITY,
                              config=config, lease_seconds=lease, poll_interval=0.02) as first, \
            await open_run(_repository(store, clock), "run", other, prompts(1), identity=IDENTITY,
                           config=config, lease_seconds=lease, poll_interval=0.02) as second:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(first.wait)
                await slow.reached.wait()  # its one call is in flight, and held
                tg.start_soon(second.wait)  # the other driver looks for work all along
                for _ in range(15):  # 15 x 0.2 s = 10 lease lengths
                    clock.now += 0.2
                    await _until_renewed(store, first.driver_id, clock.now)
                assert first.driver_id in await first.drivers()  # its lease is alive, ten lengths on
                slow.release.set()
    assert (slow.total, other.total) == (1, 0)  # called once, by the driver that held it
    assert status(store)["reexecuted_after_lease_expiry"] == 0


class HoldFirst(CountingStrategy):
    """Its first call waits for ``release``; the others answer at once."""

    async def execute(self, prompt: str, attempt: int, timeout: float | None,
                      state: Any = None) -> tuple[str, Any, Any]:
        if self.total == 0:
            self.calls[prompt] += 1
            self.reached.set()
            await self.release.wait()
            self.calls[prompt] -= 1  # counted once, below
        return await super().execute(prompt, attempt, timeout, state)


@pytest.mark.anyio
async def test_a_driver_that_wakes_after_its_lease_expired_has_its_repeated_call_counted(store: str) -> None:
    # A frozen driver's lease expires (the clock jumps past it) and another driver finishes its
    # items; when it wakes, its call answers (refused), and a start of an item it had queued
    # finds the lease dead: that call never goes. The count is the calls made again.
    lease = 0.3
    clock = FakeClock()
    frozen = HoldFirst(signal_at_call=1)  # (only the first: once its lease is gone it may drive again)
    other = CountingStrategy()
    config = ProcessorConfig(concurrency=1)
    async with await open_run(_repository(store, clock), "run", frozen, prompts(4), identity=IDENTITY,
                              config=config, lease_seconds=lease, poll_interval=0.02) as first:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(first.wait)
                await frozen.reached.wait()  # its first call is in flight; the others are queued
                clock.now += 10 * lease  # it is frozen, as far as the database can tell
                async with await open_run(_repository(store, clock), "run", other, prompts(4),
                                          identity=IDENTITY, config=config, lease_seconds=30.0,
                                          poll_interval=0.02) as second:
                    assert (await second.wait()).status == "completed"
                frozen.release.set()  # it wakes: its call answers, a start of its lease is refused
    assert set(frozen.calls + other.calls) == set(prompts(4))  # (it may have driven again after)
    assert frozen.calls["p0"] + other.calls["p0"] >= 2  # its lease expired mid-call: called again
    assert status(store)["reexecuted_after_lease_expiry"] == repeated(frozen, other)


@pytest.mark.anyio
async def test_a_pause_while_items_wait_for_an_rpm_unit_counts_none_of_them(store: str) -> None:
    # Their starts were written (the start is recorded before the admission wait), then the pause
    # ended them uncalled: the second driver's calls of them repeat nothing, so none is counted.
    first = CountingStrategy(signal_at_call=2)
    config = ProcessorConfig(concurrency=4, max_requests_per_minute=2)  # two calls, then a minute's wait
    await pause_after_reached(store, first, config, settle=0.2)  # the others reach the RPM wait
    second = CountingStrategy()
    async with await open_run(store, "run", second, prompts(ITEMS), identity=IDENTITY,
                              config=ProcessorConfig(concurrency=4), lease_seconds=LEASE,
                              poll_interval=0.02) as run:
        await run.resume()
        snap = await run.wait(timeout=60)
    assert (snap.status, snap.done) == ("completed", ITEMS)
    assert len(first.calls) == 2 and repeated(first, second) == 0
    assert status(store)["reexecuted_after_lease_expiry"] == 0
