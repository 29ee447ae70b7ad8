"""Leases, at the repository: many drivers on one run, on SQLite and on PostgreSQL.

Time is a fake clock injected into each repository (no wall-clock sleeps):
expiry, renewal, fencing of late results and of late call starts, the count of
calls made again after an expiry, and returning items when a driver stops. Two repository objects on
one store stand for two driver processes.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from trio_batch_llm import AdmissionClosedError, ArtifactIdentity, ProcessorConfig
from trio_batch_llm._runs import RunRepository, iter_run_results, open_run
from trio_batch_llm._runs._schema import LeaseLostError, NewItem, NewResult, RunSpec, SourceCheckpoint
from trio_batch_llm._runs.repository._postgres import PostgresRunRepository
from trio_batch_llm._runs.repository._sqlite import SqliteRunRepository

from .._runs_child import IDENTITY, CountingStrategy, prompts

LEASE = 30.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        url: str = request.getfixturevalue("postgres_url")
        return url
    return str(tmp_path / "runs.sqlite")


def _repo(store: str, clock: FakeClock) -> RunRepository:
    repo: RunRepository
    if store.startswith("postgresql://"):
        repo = PostgresRunRepository(store, clock=clock)
    else:
        repo = SqliteRunRepository(store, clock=clock)
    repo.open()
    return repo


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def pair(store: str, clock: FakeClock) -> Iterator[tuple[RunRepository, RunRepository]]:
    a, b = _repo(store, clock), _repo(store, clock)
    a.attach(RunSpec("r", "live", ArtifactIdentity("m", "p"), {}))
    items = [NewItem(f"i{n}", f"p{n}", None, "f") for n in range(10)]
    a.ingest("r", items, SourceCheckpoint(position=10, exhausted=True))
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _result(item_id: str) -> NewResult:
    return NewResult(item_id, True, None, json.dumps({"item_id": item_id}), 1, 1, 2)


def _ids(items: list[object]) -> list[str]:
    return [item.item_id for item in items]  # type: ignore[attr-defined]


def test_two_drivers_lease_disjoint_slices_and_record_only_their_own(
    pair: tuple[RunRepository, RunRepository]
) -> None:
    a, b = pair
    ta, tb = a.open_lease("r", "A", lease_seconds=LEASE), b.open_lease("r", "B", lease_seconds=LEASE)
    assert tb > ta  # fencing tokens only grow
    got_a, got_b = a.lease_items("r", ta, limit=4), b.lease_items("r", tb, limit=4)
    assert _ids(got_a) == ["i0", "i1", "i2", "i3"] and _ids(got_b) == ["i4", "i5", "i6", "i7"]
    # B's token cannot record A's items: skipped, never a result.
    snap = b.record("r", [_result("i0"), _result("i4")], lease=tb)
    assert (snap.done, snap.last_sequence) == (1, 1)
    snap = a.record("r", [_result("i0"), _result("i0"), _result("i1")], lease=ta)
    assert (snap.done, snap.last_sequence) == (3, 3)
    report = a.lease_report("r")
    assert [(d.driver_id, d.items_done, d.state) for d in report.drivers] == [("A", 2, "active"),
                                                                               ("B", 1, "active")]
    assert (report.reexecuted, report.leased, report.active) == (0, 5, 2)


def test_an_expired_lease_goes_back_to_the_pool_and_its_late_results_are_refused(
    pair: tuple[RunRepository, RunRepository], clock: FakeClock
) -> None:
    a, b = pair
    ta = a.open_lease("r", "A", lease_seconds=LEASE)
    assert _ids(a.lease_items("r", ta, limit=3)) == ["i0", "i1", "i2"]
    assert a.start_calls("r", ta, ["i0", "i1"]) == ["i0", "i1"]  # A calls i0 and i1, not yet i2
    a.record("r", [_result("i0")], lease=ta)
    clock.now += LEASE - 1
    assert a.renew_lease("r", ta)  # a heartbeat in time extends it
    clock.now += LEASE - 1
    tb = b.open_lease("r", "B", lease_seconds=LEASE)
    assert _ids(b.lease_items("r", tb, limit=10)) == [f"i{n}" for n in range(3, 10)]  # A is still alive
    clock.now += 2  # A (frozen: no heartbeat) is now past its lease
    assert _ids(b.lease_items("r", tb, limit=10)) == ["i1", "i2"]  # expired: back to the pool
    with pytest.raises(LeaseLostError, match="expired"):
        a.record("r", [_result("i1")], lease=ta)  # A wakes: refused, nothing written
    assert not a.renew_lease("r", ta)  # and a late heartbeat does not revive it
    with pytest.raises(LeaseLostError):
        a.lease_items("r", ta, limit=1)
    with pytest.raises(LeaseLostError):  # nor start a call (a frozen driver that wakes: the fence)
        a.start_calls("r", ta, ["i2"])
    assert b.lease_report("r").reexecuted == 0  # nothing is called twice yet
    assert b.start_calls("r", tb, ["i0", "i1", "i2"]) == ["i1", "i2"]  # i0 is done: not B's
    snap = b.record("r", [_result(f"i{n}") for n in range(1, 10)], lease=tb)
    assert (snap.done, snap.last_sequence, snap.pending) == (10, 10, 0)
    assert a.complete("r")[0]
    report = b.lease_report("r")
    assert report.reexecuted == 1  # i1, called by A then by B; i2 only A held, B called it first
    assert {d.driver_id: (d.state, d.items_done) for d in report.drivers} == {"A": ("expired", 1),
                                                                               "B": ("active", 9)}
    results = a.results("r", after_sequence=0, limit=None)
    assert Counter(r.item_id for r in results) == Counter(f"i{n}" for n in range(10))


def test_a_call_start_replayed_after_a_lost_answer_is_counted_once(
    pair: tuple[RunRepository, RunRepository], clock: FakeClock
) -> None:
    # A start whose commit answer was lost is written again by the client's retry: a no-op.
    a, b = pair
    ta = a.open_lease("r", "A", lease_seconds=LEASE)
    a.lease_items("r", ta, limit=2)
    assert a.start_calls("r", ta, ["i0", "i1"]) == ["i0", "i1"]
    assert a.start_calls("r", ta, ["i0", "i1"]) == ["i0", "i1"]  # the replay
    assert a.lease_report("r").reexecuted == 0
    clock.now += LEASE + 1  # A dies with both calls in flight
    tb = b.open_lease("r", "B", lease_seconds=LEASE)
    assert _ids(b.lease_items("r", tb, limit=2)) == ["i0", "i1"]
    assert b.start_calls("r", tb, ["i0"]) == ["i0"]
    assert b.start_calls("r", tb, ["i0", "i1"]) == ["i0", "i1"]  # i0 replayed, i1 new
    assert b.lease_report("r").reexecuted == 2  # i0 and i1, once each


def test_an_expiry_exactly_at_the_deadline_is_not_yet_expired(
    pair: tuple[RunRepository, RunRepository], clock: FakeClock
) -> None:
    a, b = pair
    ta = a.open_lease("r", "A", lease_seconds=LEASE)
    a.lease_items("r", ta, limit=1)
    clock.now += LEASE
    tb = b.open_lease("r", "B", lease_seconds=LEASE)
    assert "i0" not in _ids(b.lease_items("r", tb, limit=10))
    a.record("r", [_result("i0")], lease=ta)  # still accepted at the deadline itself
    assert a.snapshot("r").done == 1


def test_closing_a_lease_returns_its_unrecorded_items_uncounted(
    pair: tuple[RunRepository, RunRepository]
) -> None:
    a, b = pair
    ta = a.open_lease("r", "A", lease_seconds=LEASE)
    a.lease_items("r", ta, limit=5)
    a.record("r", [_result("i0"), _result("i1")], lease=ta)
    assert a.close_lease("r", ta) == 3
    with pytest.raises(LeaseLostError, match="ended"):
        a.record("r", [_result("i2")], lease=ta)
    tb = b.open_lease("r", "B", lease_seconds=LEASE)
    assert _ids(b.lease_items("r", tb, limit=10)) == [f"i{n}" for n in range(2, 10)]
    assert b.lease_report("r").reexecuted == 0


def test_drivers_leasing_at_once_never_share_an_item(store: str, clock: FakeClock) -> None:
    setup = _repo(store, clock)
    setup.attach(RunSpec("r", "live", ArtifactIdentity("m", "p"), {}))
    items = [NewItem(f"i{n}", "p", None, "f") for n in range(200)]
    setup.ingest("r", items, SourceCheckpoint(200, exhausted=True))
    setup.close()
    taken: dict[str, list[str]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def driver(name: str) -> None:
        repo = _repo(store, clock)
        try:
            token = repo.open_lease("r", name, lease_seconds=LEASE)
            barrier.wait()
            mine: list[str] = []
            while page := repo.lease_items("r", token, limit=7):
                mine += _ids(page)
                repo.record("r", [_result(i) for i in _ids(page)], lease=token)
            taken[name] = mine
        except BaseException as exc:  # reported below
            errors.append(exc)
            raise
        finally:
            repo.close()

    threads = [threading.Thread(target=driver, args=(f"d{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    everything = [i for mine in taken.values() for i in mine]
    assert sorted(everything) == sorted(f"i{n}" for n in range(200))  # each leased exactly once
    check = _repo(store, clock)
    try:
        snap = check.snapshot("r")
        assert (snap.done, snap.last_sequence) == (200, 200)
        assert [r.sequence for r in check.results("r", after_sequence=0, limit=None)] == list(range(1, 201))
    finally:
        check.close()


# --- drivers: several handles (as several processes would) on one run ---------------------------


async def _drive_together(store: str, n_handles: int, n_items: int, strategy: CountingStrategy) -> list[Any]:
    config = ProcessorConfig(concurrency=3)
    async with contextlib.AsyncExitStack() as stack:
        runs = [
            await stack.enter_async_context(await open_run(
                store, "run", strategy, prompts(n_items), identity=IDENTITY, config=config,
                lease_seconds=LEASE, slice_items=8, poll_interval=0.02,
            ))
            for _ in range(n_handles)
        ]
        snaps: list[Any] = [None] * n_handles

        async def drive(k: int) -> None:
            snaps[k] = await runs[k].wait(timeout=60)

        async with anyio.create_task_group() as tg:
            for k in range(n_handles):
                tg.start_soon(drive, k)
    return snaps


@pytest.mark.anyio
async def test_three_handles_drive_one_run_to_exactly_one_result_per_item(store: str) -> None:
    strategy = CountingStrategy()
    snaps = await _drive_together(store, 3, 90, strategy)
    assert [s.status for s in snaps] == ["completed"] * 3
    assert strategy.calls == Counter(prompts(90))  # no lease expired: every call exactly once
    results = list(iter_run_results(store, "run"))
    assert [r.sequence for r in results] == list(range(1, 91))
    assert Counter(r.item_id for r in results) == Counter(f"item-{i}" for i in range(90))
    repo = _repo(store, FakeClock())
    try:
        report = repo.lease_report("run")
    finally:
        repo.close()
    assert sum(d.items_done for d in report.drivers) == 90
    assert {d.state for d in report.drivers} == {"stopped"}  # each gave its lease back
    assert (report.reexecuted, report.leased, report.active) == (0, 0, 0)


@pytest.mark.anyio
async def test_a_pause_from_one_handle_stops_every_driver_and_a_resume_finishes(store: str) -> None:
    strategy = CountingStrategy(signal_at_call=20, latency=0.005)
    config = ProcessorConfig(concurrency=2)
    async with contextlib.AsyncExitStack() as stack:
        runs = [
            await stack.enter_async_context(await open_run(
                store, "run", strategy, prompts(60), identity=IDENTITY, config=config,
                lease_seconds=LEASE, slice_items=8, poll_interval=0.02,
            ))
            for _ in range(2)
        ]
        controller = await stack.enter_async_context(
            await open_run(store, "run", strategy, None, identity=IDENTITY))
        async with anyio.create_task_group() as tg:
            for run in runs:
                tg.start_soon(run.wait, 60)
            await strategy.reached.wait()
            await controller.pause()
            with anyio.fail_after(30):
                while (await anyio.to_thread.run_sync(_report, store)).leased:  # noqa: ASYNC110 - another store
                    await anyio.sleep(0.02)
            calls_at_pause = strategy.total
            assert calls_at_pause < 60
            await anyio.sleep(0.2)
            assert strategy.total == calls_at_pause  # nobody starts a call while paused
            await controller.resume()
    async with await open_run(store, "run", strategy, prompts(60), identity=IDENTITY,
                              lease_seconds=LEASE, poll_interval=0.02) as run:
        snap = await run.wait(timeout=60)
    assert (snap.status, snap.done) == ("completed", 60)
    stored = Counter(r.item_id for r in iter_run_results(store, "run"))
    assert stored == Counter(f"item-{i}" for i in range(60))


def _report(store: str) -> Any:
    repo = _repo(store, FakeClock())
    try:
        return repo.lease_report("run")
    finally:
        repo.close()


@pytest.mark.anyio
async def test_a_pause_landing_as_the_feeder_is_refused_is_caught_by_the_feeder() -> None:
    # The shape of Driver._feed_leased: a stop cancels the feeder's scope from outside its task
    # group at the moment add_work() raises AdmissionClosedError. On Trio the ingest task's
    # Cancelled rides in the group beside it until that scope strips it, so the unwrapping must
    # sit outside the scope, or a one-exception group slips past ``except AdmissionClosedError``
    # (seen once in CI: the pause test above failed with it). The same two context managers in
    # the order the driver now uses them:
    import inspect

    import trio_batch_llm._runs._live_drive as drive_module
    from trio_batch_llm._core._deliveries import unwrap_group

    feeding = inspect.getsource(drive_module.LiveSegmentDriver._feed_leased)
    assert "with unwrap_group(), seg.feeder_scope:" in feeding
    feeder_scope = anyio.CancelScope()
    caught = False
    try:
        with unwrap_group(), feeder_scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(anyio.sleep_forever)  # the ingest task
                await anyio.lowlevel.checkpoint()
                feeder_scope.cancel("paused")
                raise AdmissionClosedError("the batch stopped")
    except AdmissionClosedError:
        caught = True
    assert caught
