"""CONTRACT C5: shared strategy leases, on both backends.

Strategies here are scripted: ``prepare()`` and ``cleanup()`` can be held on
gates, fail, or be cancelled, and they count their calls. Sharing is by
``lease_identity()`` within one event loop.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from trio_batch_llm._core._leases import Lease, LeaseRegistry, LeaseState, lease_registry
from trio_batch_llm._core._ledger import CleanupLedger, LedgerState
from trio_batch_llm._strategies._base import LLMCallStrategy
from trio_batch_llm._values._errors import CleanupInterruptedError

pytestmark = pytest.mark.anyio


class Scripted(LLMCallStrategy[str]):
    """A strategy whose prepare/cleanup outcomes are scripted per call (ok/raise/gate/gate-raise/hang)."""

    def __init__(self, identity: object = "shared", *, prepare: list[str] | None = None,
                 cleanup: list[str] | None = None) -> None:
        self.identity = identity
        self.prepare_script = list(prepare or [])
        self.cleanup_script = list(cleanup or [])
        self.prepare_count = 0
        self.cleanup_count = 0
        self.events: list[str] = []
        self.gate = anyio.Event()
        self.entered = anyio.Event()

    def lease_identity(self) -> object:
        return self.identity

    async def _act(self, kind: str, script: list[str]) -> None:
        mode = script.pop(0) if script else "ok"
        self.events.append(f"{kind}:start")
        self.entered.set()
        try:
            if mode in ("gate", "gate-raise"):
                await self.gate.wait()
            elif mode == "hang":
                await anyio.sleep_forever()
            else:
                await anyio.lowlevel.checkpoint()
            if mode in ("raise", "gate-raise"):
                raise RuntimeError(f"{kind} failed")
        except anyio.get_cancelled_exc_class():
            self.events.append(f"{kind}:cancelled")
            raise
        self.events.append(f"{kind}:end")

    async def prepare(self) -> None:
        self.prepare_count += 1
        await self._act("prepare", self.prepare_script)

    async def cleanup(self) -> None:
        self.cleanup_count += 1
        await self._act("cleanup", self.cleanup_script)


async def test_c5_1_concurrent_acquirers_share_one_preparation() -> None:
    registry = LeaseRegistry()
    strategies = [Scripted(prepare=["gate"]), Scripted(), Scripted()]
    leases: list[Lease] = []

    async def acquire(strategy: Scripted) -> None:
        leases.append(await registry.acquire(strategy))

    async with anyio.create_task_group() as tg:
        tg.start_soon(acquire, strategies[0])
        await strategies[0].entered.wait()
        tg.start_soon(acquire, strategies[1])
        tg.start_soon(acquire, strategies[2])
        for _ in range(10):
            await anyio.lowlevel.checkpoint()
        assert registry.statistics().preparing == 1
        assert leases == []
        strategies[0].gate.set()
    assert [s.prepare_count for s in strategies] == [1, 0, 0]
    assert len(leases) == 3
    assert all(lease.held for lease in leases)
    assert registry.holders(strategies[1]) == 3


async def test_c5_1_only_the_last_release_cleans_up() -> None:
    registry = LeaseRegistry()
    strategy = Scripted()
    first, second = await registry.acquire(strategy), await registry.acquire(Scripted())
    await first.release()
    assert strategy.cleanup_count == 0
    assert first.state is LeaseState.RELEASED
    assert registry.holders(strategy) == 1
    await second.release()
    assert strategy.cleanup_count == 1  # the prepared instance is the one cleaned up
    assert registry.statistics().identities == 0
    await second.release()  # idempotent
    assert strategy.cleanup_count == 1


async def test_c5_1_different_identities_do_not_share() -> None:
    registry = LeaseRegistry()
    a, b = Scripted("a"), Scripted("b")
    lease_a, lease_b = await registry.acquire(a), await registry.acquire(b)
    assert (a.prepare_count, b.prepare_count) == (1, 1)
    await lease_a.release()
    assert (a.cleanup_count, b.cleanup_count) == (1, 0)
    await lease_b.release()
    assert b.cleanup_count == 1


async def test_c5_1_failed_preparation_propagates_to_waiters_and_holds_nothing() -> None:
    registry = LeaseRegistry()
    preparer, waiter = Scripted(prepare=["gate-raise"]), Scripted()
    errors: list[BaseException] = []
    leases = [registry.lease(preparer), registry.lease(waiter)]

    async def acquire(lease: Lease) -> None:
        try:
            await lease.acquire()
        except RuntimeError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(acquire, leases[0])
        await preparer.entered.wait()
        tg.start_soon(acquire, leases[1])
        for _ in range(5):
            await anyio.lowlevel.checkpoint()
        preparer.gate.set()
    assert len(errors) == 2
    assert errors[0] is errors[1]  # the one preparation's failure, for everyone who waited
    assert waiter.prepare_count == 0
    assert [lease.state for lease in leases] == [LeaseState.FAILED, LeaseState.FAILED]
    assert registry.statistics().identities == 0
    for lease in leases:
        await lease.release()  # the no-op release after a failed preparation
    assert preparer.cleanup_count == 0
    again = await registry.acquire(waiter)  # a later acquirer prepares afresh
    assert waiter.prepare_count == 1
    assert again.held


async def test_c5_1_lease_is_the_owners_step_and_noop_after_failed_preparation() -> None:
    registry = LeaseRegistry()
    strategy = Scripted(prepare=["raise"])
    ledger = CleanupLedger("host")
    lease = registry.lease(strategy)
    ledger.add_step("strategies", lease.name, lease.release)
    with pytest.raises(RuntimeError, match="prepare failed"):
        await lease.acquire()
    await ledger.aclose()
    assert ledger.state is LedgerState.CLOSED
    assert strategy.cleanup_count == 0


async def test_c5_2_failed_last_cleanup_keeps_the_lease_and_a_later_close_retries() -> None:
    registry = LeaseRegistry()
    strategy = Scripted(cleanup=["raise", "ok"])
    ledger = CleanupLedger("host")
    lease = await registry.acquire(strategy)
    ledger.add_step("strategies", lease.name, lease.release)
    with pytest.raises(RuntimeError, match="cleanup failed"):
        await ledger.aclose()
    assert lease.held
    assert registry.holders(strategy) == 1
    await ledger.aclose()
    assert strategy.cleanup_count == 2
    assert not lease.held
    assert ledger.state is LedgerState.CLOSED


async def test_c5_2_retry_runs_cleanup_only_if_still_the_last_owner() -> None:
    registry = LeaseRegistry()
    strategy = Scripted(cleanup=["raise"])
    old = await registry.acquire(strategy)
    with pytest.raises(RuntimeError):
        await old.release()
    newcomer_strategy = Scripted()
    newcomer = await registry.acquire(newcomer_strategy)
    assert newcomer_strategy.prepare_count == 1  # the failed cleanup left nothing to share
    await old.release()  # no longer the last holder: no cleanup
    assert (strategy.cleanup_count, newcomer_strategy.cleanup_count) == (1, 0)
    await newcomer.release()
    assert newcomer_strategy.cleanup_count == 1


async def test_c5_2_newcomer_waits_for_cleanup_in_progress_then_prepares_again() -> None:
    registry = LeaseRegistry()
    strategy = Scripted(cleanup=["gate"])
    newcomer_strategy = Scripted()
    lease = await registry.acquire(strategy)
    order: list[str] = []

    async def newcomer() -> None:
        await registry.acquire(newcomer_strategy)
        order.append("newcomer acquired")

    async with anyio.create_task_group() as tg:
        tg.start_soon(lease.release)
        await strategy.entered.wait()
        strategy.entered = anyio.Event()
        tg.start_soon(newcomer)
        for _ in range(10):
            await anyio.lowlevel.checkpoint()
        assert order == []
        assert registry.statistics().cleaning == 1
        order.append("cleanup released")
        strategy.gate.set()
    assert order == ["cleanup released", "newcomer acquired"]
    assert strategy.events == ["prepare:start", "prepare:end", "cleanup:start", "cleanup:end"]
    assert newcomer_strategy.prepare_count == 1


async def test_c5_2_interrupted_cleanup_keeps_the_lease() -> None:
    registry = LeaseRegistry()
    strategy = Scripted(cleanup=["hang", "ok"])
    ledger = CleanupLedger("host")
    lease = await registry.acquire(strategy)
    ledger.add_step("strategies", lease.name, lease.release)
    outcome: list[BaseException] = []

    async def close() -> None:
        try:
            await ledger.aclose()
        except CleanupInterruptedError as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(close)
        await strategy.entered.wait()
        for _ in range(3):
            await anyio.lowlevel.checkpoint()
        assert ledger.force_close()
    assert len(outcome) == 1
    assert strategy.events[-1] == "cleanup:cancelled"
    assert lease.held
    assert ledger.state is LedgerState.CLOSING
    await ledger.aclose()
    assert strategy.cleanup_count == 2
    assert ledger.state is LedgerState.CLOSED


async def test_c5_2_release_waits_for_a_preparation_in_progress() -> None:
    registry = LeaseRegistry()
    strategy = Scripted(cleanup=["raise", "ok"])
    old = await registry.acquire(strategy)
    with pytest.raises(RuntimeError):
        await old.release()  # failed: old still holds, nothing prepared
    newcomer_strategy = Scripted(prepare=["gate"])
    newcomer = registry.lease(newcomer_strategy)  # kept: an unreferenced lease is dropped (C5.3)
    async with anyio.create_task_group() as tg:
        tg.start_soon(newcomer.acquire)
        await newcomer_strategy.entered.wait()
        tg.start_soon(old.release)
        for _ in range(10):
            await anyio.lowlevel.checkpoint()
        assert old.held  # the preparation in progress is a barrier
        newcomer_strategy.gate.set()
    assert not old.held
    assert strategy.cleanup_count == 1  # not the last holder any more: no second cleanup
    assert registry.holders(strategy) == 1
    assert newcomer.held


async def test_c5_2_cancelled_preparer_hands_over_to_a_waiter() -> None:
    registry = LeaseRegistry()
    preparer, waiter = Scripted(prepare=["hang"]), Scripted()
    acquired: list[Lease] = []

    async def wait_and_acquire() -> None:
        acquired.append(await registry.acquire(waiter))

    lease = registry.lease(preparer)
    scope = anyio.CancelScope()

    async def prepare() -> None:
        with scope:
            await lease.acquire()

    async with anyio.create_task_group() as tg:
        tg.start_soon(prepare)
        await preparer.entered.wait()
        tg.start_soon(wait_and_acquire)
        for _ in range(5):
            await anyio.lowlevel.checkpoint()
        assert acquired == []  # waiting for the one preparation
        scope.cancel()
    assert lease.state is LeaseState.FAILED
    assert waiter.prepare_count == 1
    assert acquired[0].held


async def test_c5_3_abandoned_lease_is_dropped_without_async_cleanup(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Leases other tests abandoned are collected now, not inside this test's count below
    # (they failed it when the cleanup and delivery suites ran first in one process).
    gc.collect()
    caplog.clear()
    registry = LeaseRegistry()
    strategy = Scripted()
    tasks_before = len(anyio.get_running_tasks())
    lease = await registry.acquire(strategy)
    keeper = await registry.acquire(Scripted())
    del lease
    gc.collect()
    assert registry.holders(strategy) == 1  # dropped; the other lease still holds
    del keeper
    gc.collect()
    assert registry.statistics().identities == 0
    assert strategy.cleanup_count == 0  # nothing was scheduled
    assert len(anyio.get_running_tasks()) == tasks_before
    records = [r for r in caplog.records if r.name == "trio_batch_llm.cleanup"]
    assert len(records) == 1, [r.getMessage() for r in records]
    assert records[0].levelno == logging.WARNING
    assert "garbage-collected" in records[0].getMessage()
    assert repr(strategy) in records[0].getMessage()
    again = await registry.acquire(Scripted())
    assert again.held


def test_c5_3_one_registry_per_event_loop(anyio_backend: Any) -> None:
    seen: list[LeaseRegistry] = []

    async def main() -> None:
        seen.append(lease_registry())
        seen.append(lease_registry())
        await anyio.lowlevel.checkpoint()

    anyio.run(main, backend=anyio_backend)
    anyio.run(main, backend=anyio_backend)
    assert seen[0] is seen[1]
    assert seen[2] is seen[3]
    assert seen[0] is not seen[2]


async def test_unhashable_identity_shares_by_object_identity() -> None:
    registry = LeaseRegistry()
    key: list[int] = []  # unhashable
    a, b, c = Scripted(key), Scripted(key), Scripted([])
    leases = [await registry.acquire(s) for s in (a, b, c)]
    assert (a.prepare_count, b.prepare_count, c.prepare_count) == (1, 0, 1)
    assert registry.statistics().identities == 2
    for lease in leases:
        await lease.release()
    assert (a.cleanup_count, c.cleanup_count) == (1, 1)


async def test_lease_is_acquired_once() -> None:
    lease = await LeaseRegistry().acquire(Scripted())
    with pytest.raises(RuntimeError, match="acquired once"):
        await lease.acquire()
