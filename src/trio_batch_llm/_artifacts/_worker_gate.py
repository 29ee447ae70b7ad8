"""The worker-thread gate of a blocking resource: its calls run off the loop, one at a time, never cut short.

A store's file or database connection, and a run repository, are used only
through :meth:`WorkerGate.run`: the call runs in a worker thread
(``anyio.to_thread.run_sync``) behind the gate's ``CapacityLimiter(1)`` *and*
under its ``threading.Lock``, held for the whole call. The limiter keeps the
resource to one worker thread; the lock is what keeps two calls from ever
overlapping, even when a native asyncio ``Task.cancel()`` unwinds the task
that started a call while its thread still runs (the next call's thread then
waits for the lock). A call that has started is never abandoned: it finishes
in its thread, so a write or a transaction is either done or not, never half.

The gate owns no task and no thread; create it inside the event loop that uses it.
(The post-processor's gate in ``_observe`` is the other kind: it abandons a
thread whose caller timed out, and counts it.)
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar, final

import anyio
import anyio.to_thread

__all__ = ["WorkerGate"]

P = ParamSpec("P")
R = TypeVar("R")


@final
class WorkerGate:
    """One blocking call at a time, each in a worker thread; see the module docstring."""

    __slots__ = ("_limiter", "_lock")

    def __init__(self) -> None:
        self._limiter = anyio.CapacityLimiter(1)
        self._lock = threading.Lock()

    async def run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """``fn(*args, **kwargs)`` in a worker thread, after every earlier call of this gate has ended."""
        return await anyio.to_thread.run_sync(
            self._locked, functools.partial(fn, *args, **kwargs), limiter=self._limiter
        )

    def _locked(self, call: Callable[[], R]) -> R:
        with self._lock:
            return call()
