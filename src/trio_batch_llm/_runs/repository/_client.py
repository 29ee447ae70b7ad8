"""The async side of a :class:`RunRepository`: every call in a worker thread, one at a time.

Calls go through the same :class:`WorkerGate` the artifact stores use: a
worker thread behind a ``CapacityLimiter(1)`` and a lock held for the whole
call, so no repository call runs on the event loop and two never overlap, even
if a native asyncio cancellation unwinds the task that started one. A call
that has started in its thread finishes there (the thread is not abandoned):
a transaction is either committed or not, never cut in half by a cancellation.

Outages: once the repository is open, a call that fails with
:class:`DatabaseUnavailableError` (the server down or restarting, the network
cut) is tried again after 0.1 s, 0.2 s, ... (at most 2 s apart; each try
reconnects) until the database has been unreachable for ``unreachable_timeout``
seconds, counted from the first failure in a row of *any* call of this client;
past that the call raises :class:`DatabaseUnavailableError` saying so, and
every call after it fails at its first failure until one succeeds. A retry is
safe because every call is one transaction that either committed or not, and
each write is refused or is a no-op when it is replayed after a commit whose
answer was lost (a result for an item already done, a lease that ended, a
slice already ingested). Opening is tried once: a database that cannot be
reached at all when a handle opens is reported at once (a wrong host or port
looks exactly like that). The sleeps are anyio's: cancellable, and virtual
under a test clock.

:class:`RunBound` is the base of what works on one run through a client (the
drivers, the batch submitter).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, ParamSpec, TypeVar, final

import anyio
import anyio.lowlevel

from ..._backends._worker_gate import WorkerGate
from ..._core._cleanup import CloseOnce
from ..._values._errors import DatabaseUnavailableError
from .._schema import RunSnapshot, RunStateError
from ._protocol import RunRepository

__all__ = ["DEFAULT_UNREACHABLE_TIMEOUT", "RepositoryClient", "RunBound"]

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_UNREACHABLE_TIMEOUT: Final = 60.0
_FIRST_RETRY: Final = 0.1
_MAX_RETRY: Final = 2.0


@final
class RepositoryClient:
    """Owns a repository: opens it, runs its calls off the loop, closes it. Create inside the loop."""

    def __init__(self, repository: RunRepository, *,
                 unreachable_timeout: float = DEFAULT_UNREACHABLE_TIMEOUT) -> None:
        self.repository = repository
        self.unreachable_timeout = unreachable_timeout
        self._gate = WorkerGate()
        self._close_once = CloseOnce()
        self._down_since: float | None = None  # when the current run of unreachable failures began

    @property
    def closed(self) -> bool:
        return self._close_once.closed

    async def open(self) -> None:
        """Open the repository: tried once (see the module docstring)."""
        await self.call_once(self.repository.open)

    async def call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """``fn(*args, **kwargs)`` in the worker thread, retried through an outage (module docstring)."""
        pause = _FIRST_RETRY
        while True:
            try:
                result = await self.call_once(fn, *args, **kwargs)
            except DatabaseUnavailableError as exc:
                now = anyio.current_time()
                if self._down_since is None:
                    self._down_since = now
                left = self._down_since + self.unreachable_timeout - now
                if left <= 0:
                    raise DatabaseUnavailableError(
                        f"{exc} (the database was unreachable for {self.unreachable_timeout:g} s"
                        " (unreachable_timeout); the run's stored state is as it was: it continues"
                        " when the database is back)"
                    ) from None
                await anyio.sleep(min(pause, left))
                pause = min(pause * 2, _MAX_RETRY)
            else:
                self._down_since = None
                return result

    async def call_once(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """``fn(*args, **kwargs)`` in the worker thread, tried once."""
        if self._close_once.closed:
            await anyio.lowlevel.checkpoint()
            raise RunStateError(f"{self.repository.location}: this run handle is closed")
        return await self._gate.run(fn, *args, **kwargs)

    async def aclose(self) -> None:
        """Close the repository (releasing its claims); idempotent; closes even when cancelled."""
        # Bounded: waits at most for the one call in flight, then a close.
        await self._close_once(lambda: self._gate.run(self.repository.close))


class RunBound:
    """What works on one run through a client: the client, its repository and the run's id, held once.

    The drive segment's drivers and its batch submitter are bound to one run for their whole
    life. The :class:`Run` handle spells its three out: its reference page shows its bases.
    """

    def __init__(self, *, db: RepositoryClient, run_id: str) -> None:
        self._db = db
        self._repo = db.repository
        self._run_id = run_id

    async def _snapshot(self) -> RunSnapshot:
        """The run as stored now (through the client: retried over an outage like every call)."""
        return await self._db.call(self._repo.snapshot, self._run_id)
