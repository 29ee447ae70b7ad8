"""Shared strategy leases (CONTRACT C5): one preparation per identity per event loop.

Overlapping owners that use strategies with the same ``lease_identity()``
share one ``prepare()``. Each acquisition is a :class:`Lease`, which
the owner registers as its own cleanup step in the ``"strategies"`` phase:

    lease = lease_registry().lease(strategy)     # sync; release() is a no-op so far
    ledger.add_step("strategies", lease.name, lease.release)
    await lease.acquire()                                # prepares, or shares a preparation

- The first acquirer prepares; concurrent acquirers of the same identity wait
  for that one preparation. A failed preparation propagates to all of them and
  leaves nothing held, so their releases stay no-ops (C5.1).
- A release that is not the last does not run ``cleanup()``; the last does.
  A failed or interrupted last cleanup keeps that lease, so a later close of
  its owner retries the cleanup, but only if it is still the last holder. A
  newcomer waits for a cleanup in progress and prepares again afterwards
  (C5.2). Preparation and cleanup of one identity never overlap.
- The registry is a per-event-loop ``RunVar``: two loops never share. Leases
  are held weakly: an abandoned lease is dropped by garbage collection, and
  nothing asynchronous is ever scheduled for it (C5.3).
"""

from __future__ import annotations

import enum
import itertools
import logging
import weakref
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Literal, Protocol, final

import anyio
import anyio.lowlevel

from ._per_loop import PerLoop

__all__ = [
    "LeaseRegistry",
    "LeaseRegistryStatistics",
    "LeaseState",
    "LeasedStrategy",
    "Lease",
    "lease_registry",
]

logger = logging.getLogger("trio_batch_llm.cleanup")


class LeasedStrategy(Protocol):
    """What a lease needs of a strategy (``LLMCallStrategy`` provides it)."""

    async def prepare(self) -> None: ...

    async def cleanup(self) -> None: ...

    def lease_identity(self) -> object: ...


class LeaseState(enum.StrEnum):
    UNACQUIRED = "unacquired"
    ACQUIRING = "acquiring"
    HELD = "held"
    FAILED = "failed"  # the acquisition raised: nothing is held, release() is a no-op
    RELEASED = "released"


@final
class _ByIdentity:
    """Key for an unhashable ``lease_identity()``: equal only to itself."""

    __slots__ = ("obj",)

    def __init__(self, obj: object) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ByIdentity) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)


def _key_of(strategy: LeasedStrategy) -> Hashable:
    # An identity a user returns may be unhashable (a dict of settings, say): it then shares
    # only by object identity (strategies returning that very object), rather than failing the lease.
    identity = strategy.lease_identity()
    try:
        hash(identity)
    except TypeError:
        return _ByIdentity(identity)
    return identity


@final
class _Operation:
    """A preparation or cleanup in progress; everyone else on the identity waits for it."""

    __slots__ = ("done", "error", "kind")

    def __init__(self, kind: Literal["prepare", "cleanup"]) -> None:
        self.kind = kind
        self.done = anyio.Event()
        self.error: Exception | None = None


@final
class _Entry:
    """The shared state of one identity in one event loop."""

    __slots__ = ("busy", "holders", "key", "needs_cleanup", "prepared", "strategy")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.strategy: LeasedStrategy | None = None  # the instance that was prepared
        self.prepared = False  # newcomers may share it without preparing
        self.needs_cleanup = False  # prepared once and not yet cleaned up
        self.holders: dict[int, weakref.finalize[..., Lease]] = {}
        self.busy: _Operation | None = None


@final
@dataclass(frozen=True, slots=True)
class LeaseRegistryStatistics:
    identities: int
    holders: int
    preparing: int
    cleaning: int


_tokens = itertools.count()


@final
class Lease:
    """One owner's acquisition of a strategy; :meth:`release` is that owner's cleanup step."""

    __slots__ = ("__weakref__", "_entry", "_registry", "_settled", "_token", "name", "state", "strategy")

    def __init__(self, registry: LeaseRegistry, strategy: LeasedStrategy) -> None:
        self._registry = registry
        self.strategy = strategy
        self.state = LeaseState.UNACQUIRED
        self.name = f"strategy lease #{next(_tokens)} ({type(strategy).__name__})"
        self._entry: _Entry | None = None
        self._token = -1
        self._settled: anyio.Event | None = None

    @property
    def held(self) -> bool:
        return self.state is LeaseState.HELD

    async def acquire(self) -> None:
        """Prepare the strategy, or share the preparation of its identity. Once per lease."""
        if self.state is not LeaseState.UNACQUIRED:
            raise RuntimeError(f"{self.name} is {self.state}; a lease is acquired once")
        self.state = LeaseState.ACQUIRING
        settled = self._settled = anyio.Event()
        try:
            # Before touching the registry: a caller cancelled already leaves with nothing held,
            # and acquire() checkpoints on every path, the shared fast path included.
            await anyio.lowlevel.checkpoint()
            await self._registry._acquire_into(self)
        except BaseException:
            self.state = LeaseState.FAILED
            raise
        finally:
            settled.set()

    async def release(self) -> None:
        """Give the lease back; the last holder runs ``cleanup()``. A no-op unless held."""
        if self.state is LeaseState.ACQUIRING and self._settled is not None:
            await self._settled.wait()  # our own acquisition is a barrier (C2.3)
        if self.state is not LeaseState.HELD:
            await anyio.lowlevel.checkpoint()
            return
        await self._registry._release(self)

    def release_nowait(self) -> bool:
        """:meth:`release` when it needs no waiting; returns whether the lease is released now.

        A lease that was never acquired, or whose acquisition failed, is released already;
        a holder that is not the last one gives its share back. ``False`` while the
        acquisition or another operation on the identity is in progress, and for the last
        holder, whose release runs ``cleanup()``: :meth:`release` does those.
        """
        state = self.state
        if state is LeaseState.ACQUIRING:
            return False
        if state is not LeaseState.HELD:
            return True
        return self._registry._release_nowait(self)

    def __repr__(self) -> str:
        return f"<{self.name}: {self.state}>"


@final
class LeaseRegistry:
    """Strategy preparations of one event loop, shared by identity."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, _Entry] = {}

    def lease(self, strategy: LeasedStrategy) -> Lease:
        """A new, not yet acquired lease (register its release, then acquire it)."""
        return Lease(self, strategy)

    async def acquire(self, strategy: LeasedStrategy) -> Lease:
        """``lease(strategy)`` then ``acquire()``; raises the preparation's failure."""
        lease = self.lease(strategy)
        await lease.acquire()
        return lease

    def holders(self, strategy: LeasedStrategy) -> int:
        """How many leases hold ``strategy``'s identity now."""
        entry = self._entries.get(_key_of(strategy))
        return 0 if entry is None else len(entry.holders)

    def statistics(self) -> LeaseRegistryStatistics:
        entries = list(self._entries.values())
        return LeaseRegistryStatistics(
            identities=len(entries),
            holders=sum(len(e.holders) for e in entries),
            preparing=sum(1 for e in entries if e.busy is not None and e.busy.kind == "prepare"),
            cleaning=sum(1 for e in entries if e.busy is not None and e.busy.kind == "cleanup"),
        )

    async def _acquire_into(self, lease: Lease) -> None:
        key = _key_of(lease.strategy)
        # Decide again after every wait: while we waited, the entry may have been prepared (share
        # it), cleaned up (prepare again, C5.2), dropped (make a new one), or its preparer may have
        # been cancelled (then we prepare). Only the one preparation's failure is everyone's.
        while True:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry(key)
            waiting_for = entry.busy
            if waiting_for is not None:
                await waiting_for.done.wait()
                if waiting_for.kind == "prepare" and waiting_for.error is not None:
                    raise waiting_for.error  # the one preparation failed for all who waited (C5.1)
                continue  # a cancelled preparer leaves the work to the next acquirer
            if entry.prepared:
                self._hold(entry, lease)
                return  # noqa: ASYNC910  (acquire() checkpointed before calling us)
            await self._prepare(entry, lease)
            return

    async def _prepare(self, entry: _Entry, lease: Lease) -> None:
        operation = entry.busy = _Operation("prepare")
        # The instance that prepares is the one whose cleanup() runs, whoever releases last:
        # holders that shared the preparation may be other instances of the same identity.
        entry.strategy = lease.strategy
        prepared = False
        try:
            await lease.strategy.prepare()
            prepared = True
        except Exception as exc:
            # Only an ordinary failure is handed to the waiters. A cancellation is this preparer's
            # own: the waiters wake to an unprepared entry and the next one prepares.
            operation.error = exc
            raise
        finally:
            entry.busy = None
            operation.done.set()
            if prepared:
                entry.prepared = entry.needs_cleanup = True
                self._hold(entry, lease)
            else:
                self._drop_if_unused(entry)

    def _release_nowait(self, lease: Lease) -> bool:
        entry = lease._entry
        assert entry is not None
        if entry.busy is not None:  # a preparation or cleanup in progress is a barrier
            return False
        if len(entry.holders) > 1 or not entry.needs_cleanup:
            self._unhold(entry, lease)  # not the last holder: no cleanup (C5.1)
            return True
        return False

    async def _release(self, lease: Lease) -> None:
        entry = lease._entry
        assert entry is not None
        while entry.busy is not None:
            await entry.busy.done.wait()
        if lease.state is not LeaseState.HELD or self._release_nowait(lease):
            await anyio.lowlevel.checkpoint()
            return
        # The last holder: no checkpoint of its own before cleanup(), which awaits (a close
        # runs this in a step's task, where a schedule point more is only a round more).
        # The handoff: from here the identity belongs to its cleanup. `busy` makes a newcomer
        # wait for it, and `prepared = False` makes that newcomer prepare afresh afterwards, so
        # a preparation and a cleanup of one identity never overlap (C5.2).
        operation = entry.busy = _Operation("cleanup")
        entry.prepared = False  # a newcomer from now on prepares again (C5.2)
        strategy = entry.strategy
        assert strategy is not None
        try:
            await strategy.cleanup()
        finally:
            # On failure or interruption the lease stays held: a later close of
            # this owner retries, if it is still the last holder then (C5.2).
            entry.busy = None
            operation.done.set()
        entry.needs_cleanup = False
        self._unhold(entry, lease)

    def _hold(self, entry: _Entry, lease: Lease) -> None:
        # The entry keeps a finalizer, not the lease: an owner that drops its lease unreleased
        # must not be kept alive by the registry (C5.3). The token names the holder without
        # referring to the lease; no finalizer runs at interpreter exit, where no loop is left.
        token = next(_tokens)
        finalizer = weakref.finalize(lease, _abandon, self, entry, token)
        finalizer.atexit = False
        entry.holders[token] = finalizer
        lease._entry, lease._token, lease.state = entry, token, LeaseState.HELD

    def _unhold(self, entry: _Entry, lease: Lease) -> None:
        finalizer = entry.holders.pop(lease._token, None)
        if finalizer is not None:
            finalizer.detach()
        lease._entry, lease.state = None, LeaseState.RELEASED
        self._drop_if_unused(entry)

    def _drop_if_unused(self, entry: _Entry) -> None:
        if not entry.holders and entry.busy is None and self._entries.get(entry.key) is entry:
            del self._entries[entry.key]


def _abandon(registry: LeaseRegistry, entry: _Entry, token: int) -> None:
    # Runs inside garbage collection: synchronous bookkeeping only, never a
    # scheduled cleanup (C5.3). The strategy's cleanup() does not run.
    entry.holders.pop(token, None)
    if not entry.holders and entry.busy is None:
        if entry.needs_cleanup:
            logger.warning(
                "the last lease of %r was garbage-collected without release; its cleanup() did not run",
                entry.strategy,
            )
        registry._drop_if_unused(entry)


_REGISTRY: PerLoop[LeaseRegistry] = PerLoop("trio_batch_llm.lease_registry", LeaseRegistry)


def lease_registry() -> LeaseRegistry:
    """The lease registry of the running event loop (created on first use; never shared across loops)."""
    return _REGISTRY.get()
