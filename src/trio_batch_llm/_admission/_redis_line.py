"""This process's line of waiters for a share kept in Redis: FIFO, and one of them asks for all.

Both shares a scope keeps in Redis are waited for the same way: its RPM/TPM units
(:mod:`._redis_quota`) and its leases on calls in flight (:mod:`._redis_inflight`).
:class:`WaitingLine` is that way, once; each share says only how one round trip asks
(:meth:`WaitingLine._ask`) and how a grant nobody takes goes back
(:meth:`WaitingLine._give_back`).

**One leader, no task.** Waiters queue here in order. The first that finds no
leader becomes it and, in its own task, asks Redis for everyone queued at once;
the others sleep on an event of their own. A waiter the leader's round trip
served is woken at once. When the leader's own request is granted (or it is
cancelled) it hands the lead to the head of the line. So a process makes one
round trip for a hundred waiters, not a hundred, and spawns nothing: every
waiter's wait lives in its own task, which its caller owns.

**Polling, not pub/sub.** A leader whose request Redis could not grant asks
again after a pause that starts at ``poll_first`` and doubles up to
``poll_max`` while nothing local changes; a local release sets the leader's
wake event, which ends the pause at once (its release rides on that round trip,
and may free what the leader waits for). Each share shapes the pause
(the quota's is capped by the ready time Redis reports; the leases' is jittered,
so that waiting processes do not ask in step).

**A waiter that leaves.** Cancelled or closed, a waiter marks itself gone and
leaves the line; anything it was granted goes back (:meth:`WaitingLine._give_back`),
and a round trip under way that grants it something later finds it gone and
gives that back too. Cancellation is never swallowed: the cleanup runs and the
exception goes on.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Final, Generic, TypeVar

import anyio
import anyio.lowlevel

from .._values._errors import AdmissionClosedError

if TYPE_CHECKING:
    from ._redis_link import RedisLink

__all__ = ["WaitingLine", "Want"]

G = TypeVar("G")

_CLOSED: Final = "quota scope is closed"


class Want(Generic[G]):
    """One waiter in a :class:`WaitingLine`: what it was granted (``None``: nothing yet)."""

    __slots__ = ("event", "gone", "grant")

    def __init__(self) -> None:
        self.grant: G | None = None
        self.event: anyio.Event | None = None  # set when it should look again (served, or now the leader)
        self.gone = False  # it left the line: a grant that reaches it later goes back


def _granted(want: Want[G]) -> bool:
    # A call, so that type checkers do not carry a narrowed `want.grant` across the round trip.
    return want.grant is not None


class WaitingLine(Generic[G]):
    """The waiters of one share (see the module docstring); the share subclasses it."""

    __slots__ = ("_leader", "_link", "_poll_first", "_poll_max", "_queue", "_wake", "closed")

    def __init__(self, link: RedisLink, poll_first: float, poll_max: float) -> None:
        self._link = link
        self._queue: deque[Want[G]] = deque()
        self._leader = False
        self._wake: anyio.Event | None = None  # the leader's pause; a local release sets it
        self._poll_first = poll_first
        self._poll_max = poll_max
        self.closed = False

    # -- what a share says -------------------------------------------------------

    async def _ask(self) -> float:
        """One round trip for every waiter queued now, granting what it can (:meth:`_hand`); return
        the longest the leader may wait before it asks again (``math.inf``: only the pause bounds it).
        """
        raise NotImplementedError

    def _paused(self, pause: float) -> float:
        """The pause the leader takes when ``pause`` is due (a share may jitter it)."""
        return pause

    def _give_back(self, grant: G) -> None:
        """``grant`` reached a waiter that had left, or one leaving now: it goes back."""
        raise NotImplementedError

    def _line_empty(self) -> None:
        """Nobody here waits any more and nobody leads (a share that keeps a place in Redis's own line
        leaves it)."""

    # -- the line ------------------------------------------------------------------

    async def _wait_in_line(self, want: Want[G]) -> G:
        """Queue ``want`` and wait until it is granted: lead when nobody does, else sleep until woken."""
        await anyio.lowlevel.checkpoint_if_cancelled()  # a cancelled caller does not even queue
        self._queue.append(want)
        try:
            while want.grant is None:
                if self.closed:
                    raise AdmissionClosedError(_CLOSED)
                if not self._leader:
                    await self._lead(want)
                else:
                    want.event = anyio.Event()
                    await want.event.wait()
        except BaseException:
            # Cancelled or closed: leave, give back anything granted meanwhile, and let the next
            # waiter lead (it would otherwise sleep with nobody asking for it).
            want.gone = True
            self._leave(want)
            if want.grant is not None:
                self._give_back(want.grant)
            self._pass_lead()
            raise
        return want.grant

    def _leave(self, want: Want[G]) -> None:
        try:
            self._queue.remove(want)
        except ValueError:
            pass  # already out: served, or served from spares

    def _hand(self, want: Want[G], grant: G) -> bool:
        """Give ``grant`` to ``want`` and wake it; ``False`` (the grant is the caller's to give back):
        it left the line, or was served meanwhile."""
        if want.gone or want.grant is not None:
            return False
        want.grant = grant
        self._leave(want)
        if want.event is not None:
            want.event.set()
        return True

    def _pass_lead(self) -> None:
        if self._leader:
            return
        if self._queue:
            event = self._queue[0].event
            if event is not None:
                event.set()  # the head leads next
        else:
            self._line_empty()

    async def _lead(self, own: Want[G]) -> None:
        self._leader = True
        pause = self._poll_first
        try:
            await anyio.lowlevel.checkpoint_if_cancelled()
            while own.grant is None and not self.closed:
                wait = await self._ask()
                if _granted(own):
                    break
                wake = self._wake = anyio.Event()
                with anyio.move_on_after(min(wait, self._paused(pause))):
                    await wake.wait()
                # Something local changed: ask again soon. Nothing did: back off, up to poll_max.
                pause = self._poll_first if wake.is_set() else min(pause * 2, self._poll_max)
        finally:
            self._leader = False
            self._wake = None
            self._pass_lead()

    def _kick(self) -> None:
        """A local release: the leader asks again at once (its round trip carries the release, and may
        now be granted); with no leader, the link's flusher sends it a few milliseconds later."""
        wake = self._wake
        if wake is not None:
            wake.set()
        else:
            self._link.want_flush()

    def _close_line(self) -> None:
        """Wake every waiter and the leader: each finds the line closed."""
        self.closed = True
        for want in self._queue:
            if want.event is not None:
                want.event.set()
        wake = self._wake
        if wake is not None:
            wake.set()
