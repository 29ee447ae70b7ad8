"""The async side of a :class:`RunRepository`: every call in a worker thread, one at a time.

Calls go through the same :class:`WorkerGate` the artifact stores use: a
worker thread behind a ``CapacityLimiter(1)`` and a lock held for the whole
call, so no repository call runs on the event loop and two never overlap, even
if a native asyncio cancellation unwinds the task that started one. A call
that has started in its thread finishes there (the thread is not abandoned):
a transaction is either committed or not, never cut in half by a cancellation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar, final

import anyio
import anyio.lowlevel

from ..._artifacts._worker_gate import WorkerGate
from .._schema import RunStateError
from ._protocol import RunRepository

__all__ = ["RepositoryClient"]

P = ParamSpec("P")
R = TypeVar("R")


@final
class RepositoryClient:
    """Owns a repository: opens it, runs its calls off the loop, closes it. Create inside the loop."""

    def __init__(self, repository: RunRepository) -> None:
        self.repository = repository
        self._gate = WorkerGate()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    async def call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        if self._closed:
            await anyio.lowlevel.checkpoint()
            raise RunStateError(f"{self.repository.location}: this run handle is closed")
        return await self._gate.run(fn, *args, **kwargs)

    async def aclose(self) -> None:
        """Close the repository (releasing its claims); idempotent; closes even when cancelled."""
        if self._closed:
            await anyio.lowlevel.checkpoint()
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            # Bounded: waits at most for the one call in flight, then a close.
            await self._gate.run(self.repository.close)
