"""The async side of a :class:`RunRepository`: every call in a worker thread, one at a time.

Calls go through ``anyio.to_thread.run_sync`` behind a ``CapacityLimiter(1)``
and a ``threading.Lock`` held for the whole call, so no repository call runs
on the event loop and two never overlap, even if a native asyncio
cancellation unwinds the task that started one. A call that has started in
its thread finishes there (the thread is not abandoned): a transaction is
either committed or not, never cut in half by a cancellation.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar, final

import anyio
import anyio.lowlevel

from .._schema import RunRepository, RunStateError

__all__ = ["RepositoryClient"]

P = ParamSpec("P")
R = TypeVar("R")


@final
class RepositoryClient:
    """Owns a repository: opens it, runs its calls off the loop, closes it. Create inside the loop."""

    def __init__(self, repository: RunRepository) -> None:
        self.repository = repository
        self._limiter = anyio.CapacityLimiter(1)
        self._lock = threading.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def _locked(self, fn: Callable[[], R]) -> R:
        with self._lock:
            return fn()

    async def call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        if self._closed:
            await anyio.lowlevel.checkpoint()
            raise RunStateError(f"{self.repository.location}: this run handle is closed")
        return await anyio.to_thread.run_sync(
            self._locked, functools.partial(fn, *args, **kwargs), limiter=self._limiter
        )

    async def aclose(self) -> None:
        """Close the repository (releasing its claims); idempotent; closes even when cancelled."""
        if self._closed:
            await anyio.lowlevel.checkpoint()
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            # Bounded: waits at most for the one call in flight, then a close.
            await anyio.to_thread.run_sync(self._locked, self.repository.close, limiter=self._limiter)
