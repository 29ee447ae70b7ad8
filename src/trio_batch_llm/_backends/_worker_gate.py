"""The worker-thread gate: blocking calls off the loop, one at a time, each thread owned until it returns.

Every blocking resource of the package goes through one :class:`WorkerGate`:
a store's file or database connection, a run repository, the response
cache's connections, and the synchronous post-processor. Each call runs in a
worker thread (``anyio.to_thread.run_sync``) behind the gate's
``CapacityLimiter(1)`` and under its ``threading.Lock``, which the thread
holds for the whole call. The limiter keeps the resource to one worker
thread; the lock is what keeps two calls from ever overlapping once a caller
has left while its thread still runs (the next call's thread then waits for
the lock). Two policies decide whether a caller may leave:

- ``abandon_on_cancel=False`` (the stores, repositories, caches): a call that
  has started is never abandoned. A cancelled caller waits for its thread, so
  a write or a transaction is either done or not, never half. Only a native
  asyncio ``Task.cancel()`` gets through anyio's shield and unwinds the
  caller early; its thread runs on, and the lock holds the next call back.
- ``abandon_on_cancel=True`` (the post-processor, run under a timeout): a
  caller that times out leaves its thread, which runs on and is still owned.
  anyio hands the limiter back as soon as it abandons a thread, so the gate
  keeps its own record of the call: the next call waits for that thread, and
  the owner's close waits for it too (:meth:`WorkerGate.wait_idle`), so no
  thread outlives its owner unnoticed. A call cancelled before its thread
  started never runs.

The gate owns no task and no thread; it binds to the event loop of its first call.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar, cast, final

import anyio
import anyio.lowlevel
import anyio.to_thread

from . import LoopHandle, capture_loop_handle

__all__ = ["WorkerGate"]

P = ParamSpec("P")
R = TypeVar("R")


@final
class _Call:
    """One call of an abandoning gate, until its thread has returned (or is known never to run)."""

    __slots__ = ("claim", "idle")

    def __init__(self) -> None:
        self.idle = anyio.Event()
        # Taken once, by whoever comes first: the thread (the call runs) or the caller that left
        # (it never will). A lock's non-blocking acquire is that one atomic decision, and the
        # loop never waits for it.
        self.claim = threading.Lock()


@final
class WorkerGate:
    """One blocking call at a time, each in a worker thread; see the module docstring."""

    __slots__ = ("_abandon", "_current", "_handle", "_limiter", "_lock")

    def __init__(self, *, abandon_on_cancel: bool = False) -> None:
        self._abandon = abandon_on_cancel
        self._lock = threading.Lock()
        self._limiter: anyio.CapacityLimiter | None = None
        self._handle: LoopHandle | None = None
        self._current: _Call | None = None

    @property
    def busy(self) -> bool:
        """Whether a thread of an abandoning gate runs (or a call waits for one), abandoned or not."""
        return self._current is not None

    async def run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """``fn(*args, **kwargs)`` in a worker thread, after every earlier call of this gate has ended."""
        call = functools.partial(fn, *args, **kwargs)
        if self._abandon:
            return await self._run_abandoning(call)
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(1)
        return await anyio.to_thread.run_sync(self._locked, call, limiter=self._limiter)

    def _locked(self, call: Callable[[], R]) -> R:
        with self._lock:
            return call()

    async def _run_abandoning(self, fn: Callable[[], R]) -> R:
        while self._current is not None:
            await self._current.idle.wait()
        if self._handle is None:
            self._limiter = anyio.CapacityLimiter(1)
            self._handle = capture_loop_handle()
        handle = self._handle
        call = self._current = _Call()

        def in_thread() -> R | None:
            try:
                if not call.claim.acquire(blocking=False):
                    return None  # its caller left before it started; nobody reads the value
                return self._locked(fn)
            finally:
                # Once the lock is free: the gate opens when the thread itself is done,
                # whether its caller still waits for it or left long ago.
                handle.run_sync_soon(functools.partial(self._release, call))

        try:
            value = await anyio.to_thread.run_sync(in_thread, abandon_on_cancel=True, limiter=self._limiter)
        except BaseException:
            if call.claim.acquire(blocking=False):
                self._release(call)  # its thread never started, and now never runs the call
            # Otherwise its thread runs on (or has just returned) and opens the gate itself.
            raise
        self._release(call)
        # The thread claimed the call (only a caller that left claims it first), so this is fn's value.
        return cast(R, value)

    def _release(self, call: _Call) -> None:
        if self._current is call:
            self._current = None
        call.idle.set()

    async def wait_idle(self) -> None:
        """Return once no thread of this gate runs; checkpoints even when none does."""
        await anyio.lowlevel.checkpoint()
        while self._current is not None:
            await self._current.idle.wait()
