"""Call starts under a lease: each item's call is recorded as started, under the live lease, before it goes.

A driver that shares a run (``lease_seconds``) gives its processor one
middleware, :class:`CallStarts`: its ``before`` runs as a worker takes an item,
just before the call (the engine's cache lookup and admission wait come next),
and waits until the start is written (``repository.start_calls``). Starts made
at once share one transaction: a task of the segment (:meth:`CallStarts.run`)
writes whatever is waiting, then the next batch. What that buys:

* the run counts calls made twice (``reexecuted_after_lease_expiry``): an item
  whose call was started by a driver that then lost its lease counts when its
  call starts again, and an item such a driver only held does not. Never fewer
  than the calls made again; more only by starts whose request had not gone out
  yet when their driver died or was cut off (at most one per worker and lease);
* a driver whose lease died starts no call on an item it no longer holds (a
  frozen process that wakes, a database outage past the lease): the write is
  refused, the segment detaches (as when its results are refused), and the
  hook raises :class:`StartRefusedError` instead of returning, so the call never
  goes. The engine stops the segment's processor with it (a middleware's error
  does); as a :class:`ClaimLostError` it ends the segment without failing the
  run, and the driver's next segment takes a new lease.

The price: one small write per batch of starts, on the way of each call (a
millisecond or two on SQLite or a local PostgreSQL, against calls of a second).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, final

import anyio
import anyio.lowlevel

from .._values._errors import ArtifactStoreError
from .._values._requests import LLMWorkItem
from ._schema import ClaimLostError, LeaseLostError

__all__ = ["CallStarts", "StartRefusedError"]


class StartRefusedError(ClaimLostError):
    """A call's start was refused (this driver's lease is gone): its segment ends, the run does not."""


StartCalls = Callable[[list[str]], Awaitable[list[str]]]


@final
class _Ticket:
    """One item's start, waiting for its batch's write."""

    __slots__ = ("done", "held", "item_id")

    def __init__(self, item_id: str) -> None:
        self.item_id = item_id
        self.done = anyio.Event()
        self.held = False


@final
class CallStarts:
    """The middleware that records each item's call start under the segment's lease."""

    def __init__(self, start_calls: StartCalls, on_lost: Callable[[BaseException], None]) -> None:
        """``start_calls(ids)`` writes the starts and returns the ids the lease holds; ``on_lost``
        is told once the lease (or the database) is lost: it detaches the segment."""
        self._start_calls = start_calls
        self._on_lost = on_lost
        self._waiting: list[_Ticket] = []
        self._wake = anyio.Event()
        self._closed = False
        self._why = "the segment ended"

    async def before(self, item: LLMWorkItem[Any]) -> None:
        """The engine's middleware hook: return once the call may go; raise if it may not."""
        ticket = _Ticket(item.item_id)
        if self._closed:
            await anyio.lowlevel.checkpoint()
        else:
            self._waiting.append(ticket)
            self._wake.set()
            await ticket.done.wait()
        if not ticket.held:
            # Not this driver's item any more. Returning would let the call go (a detaching
            # segment's processor drains: items in hand still run), so the hook fails instead.
            raise StartRefusedError(f"the call of item {item.item_id!r} was not started: {self._why}")

    async def run(self) -> None:
        """Write the waiting starts, batch after batch, until the segment ends (a task of it)."""
        try:
            while True:
                if not self._waiting:
                    await self._wake.wait()
                    self._wake = anyio.Event()
                    continue
                batch, self._waiting = self._waiting, []
                held: set[str] = set()
                try:
                    if not self._closed:
                        held = set(await self._start_calls([ticket.item_id for ticket in batch]))
                        if len(held) < len(batch):  # the lease held them all, unless it ended meanwhile
                            raise LeaseLostError("an item of this lease went back to the pool")
                except (LeaseLostError, ArtifactStoreError) as exc:
                    self._closed = True
                    self._why = str(exc)
                    self._on_lost(exc)
                finally:  # (a cancelled write too: the segment is ending, its calls are refused)
                    for ticket in batch:
                        ticket.held = ticket.item_id in held and not self._closed
                        ticket.done.set()
        finally:
            # The segment ends: no start is written any more, and no waiting call may go.
            self._closed = True
            for ticket in self._waiting:
                ticket.done.set()
            self._waiting = []
