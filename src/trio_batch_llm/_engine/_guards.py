"""What cuts an item short: a :class:`Guard` per worker, one :class:`DeadlineWatcher` per processor.

A cancel scope per attempt cost more than the rest of the item path together (on Trio
~15 µs to enter and leave, on asyncio a timer handle made and cancelled), although
almost no attempt ever reaches its deadline. So each worker keeps one long-lived cancel
scope, its guard, and the item path only writes down its current deadline: a float per
attempt. The watcher sleeps until the earliest deadline of any *armed* guard (or the
batch deadline), cancels the guards whose deadline has come, and sleeps again; a stop
cancels every armed guard at once. A caller without a watcher (a pool request) gets a
guard whose scope carries the deadline itself, from :meth:`Guard.arm` on.

What makes a long-lived scope safe:

- a guard is cancelled only while it is armed, that is while its worker runs the item
  path (``ItemRunner.drive``); between items (hooks, checkpoint writes, the result
  stream) nothing cancels it;
- when the item path returns but its guard was cancelled meanwhile (the call finished
  in the instant its deadline came), the worker leaves that scope before it awaits
  anything else and opens a new one (:meth:`Guard.renew`): a cancelled scope stays
  cancelled. The item keeps the result it got.

Which deadline fired is read off the clock afterwards, in the precedence nested scopes
had (``ItemRunner.cut``): the stop, then the item deadline, then the call-start deadline,
then the attempt's own. So there is at most one cancel scope per attempt, and none in
the common case: one per worker, one more each time a guard fires.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, final

import anyio

if TYPE_CHECKING:
    from ._item_run import ItemRun

__all__ = ["DeadlineWatcher", "Guard"]


@final
class Guard:
    """The cancel scope one worker (or one pool request) runs its item path in.

    ``deadline`` is the item's current deadline: the earliest of the item deadline,
    the batch deadline and, during a call, the attempt deadline (before a call, the
    call-start deadline too). ``run`` is the item in hand; it stays set while the
    guard is renewed, so the worker can go on with it.
    """

    __slots__ = ("_watcher", "armed", "deadline", "run", "scope", "stop_deadline", "stopped")

    scope: anyio.CancelScope
    """The scope to run in, made by :meth:`renew` (first of all)."""

    def __init__(self, watcher: DeadlineWatcher | None = None, *, stop_deadline: float = math.inf) -> None:
        self._watcher = watcher
        self.armed = False
        self.deadline = math.inf
        self.stop_deadline = stop_deadline
        self.stopped: str | None = None
        """The reason of a stop that cut items short; no item starts on this guard after it."""
        self.run: ItemRun[Any] | None = None

    def renew(self) -> anyio.CancelScope:
        """A fresh scope to run in (the previous one is left; it may have been cancelled).

        Without a deadline: :meth:`arm` gives it the run's. Not the deadline that fired:
        a scope entered past its deadline is cancelled on entry, and the retry of an
        attempt that timed out would be cut short at its first checkpoint (issue 31).
        """
        self.scope = anyio.CancelScope()
        return self.scope

    def arm(self, run: ItemRun[Any], deadline: float) -> None:
        """The worker enters the item path with ``run``: from now on a deadline or a stop cancels it."""
        self.run = run
        self.armed = True
        self.set_deadline(deadline)

    def disarm(self) -> None:
        self.armed = False

    def set_deadline(self, deadline: float) -> None:
        self.deadline = deadline
        watcher = self._watcher
        if watcher is None:
            self.scope.deadline = deadline
        elif deadline < watcher.wake_at:
            watcher.wake_by(deadline)

    def stop(self, reason: str) -> anyio.CancelScope | None:
        """A stop that cuts calls short: refuse every later item; the scope of the one in hand to
        cancel (the caller cancels every guard's at once: :func:`~.._backends.cancel_scopes`)."""
        if self.stopped is None:
            self.stopped = reason
        return self.scope if self.armed else None

    def fire(self) -> None:
        """The watcher saw this guard's deadline come (a stopped guard was cancelled already)."""
        if self.armed and self.stopped is None:
            # Not twice: on Trio each cancel() formats the calling task's repr for its reason, about
            # 2 µs, which a batch deadline (a stop, then every guard's own deadline) paid per worker.
            self.scope.cancel("deadline")


@final
class DeadlineWatcher:
    """One task that cancels guards at their deadlines and calls ``on_batch_deadline`` at the batch's.

    It wakes at the earliest deadline it knows of; a guard armed with an earlier one
    moves that wake-up forward (:meth:`wake_by`). Attempt deadlines only ever grow
    with the time their calls start, so in a batch that sets nothing but
    ``attempt_timeout`` the watcher wakes about once per ``attempt_timeout``.
    """

    __slots__ = (
        "_batch_deadline",
        "_clock",
        "_closed",
        "_guards",
        "_on_batch_deadline",
        "_scope",
        "_sleep",
        "wake_at",
    )

    def __init__(
        self,
        *,
        batch_deadline: float = math.inf,
        on_batch_deadline: Callable[[], None] | None = None,
        clock: Callable[[], float] = anyio.current_time,
    ) -> None:
        self._guards: list[Guard] = []
        self._batch_deadline = batch_deadline
        self._on_batch_deadline = on_batch_deadline
        self._clock = clock
        self._scope: anyio.CancelScope | None = None
        self._sleep: anyio.CancelScope | None = None
        self._closed = False
        self.wake_at = batch_deadline

    def guard(self, *, stop_deadline: float = math.inf) -> Guard:
        """A new guard this watcher keeps (one per worker)."""
        guard = Guard(self, stop_deadline=stop_deadline)
        self._guards.append(guard)
        return guard

    @property
    def guards(self) -> list[Guard]:
        return self._guards

    def set_batch_deadline(self, deadline: float) -> None:
        self._batch_deadline = deadline
        if deadline < self.wake_at:
            self.wake_by(deadline)

    def wake_by(self, deadline: float) -> None:
        self.wake_at = deadline
        if self._sleep is not None:
            self._sleep.deadline = deadline

    async def run(self) -> None:
        """Watch until :meth:`close`."""
        with anyio.CancelScope() as self._scope:
            if self._closed:
                self._scope.cancel("batch finished")
            while True:
                now = self._clock()
                if self._batch_deadline <= now:
                    self._batch_deadline = math.inf
                    if self._on_batch_deadline is not None:
                        self._on_batch_deadline()
                wake = self._batch_deadline
                for guard in self._guards:
                    if guard.armed:
                        deadline = guard.deadline
                        if deadline <= now:
                            guard.fire()
                        elif deadline < wake:
                            wake = deadline
                self.wake_at = wake
                with anyio.CancelScope(deadline=wake) as self._sleep:
                    await anyio.sleep_forever()
                self._sleep = None

    def close(self) -> None:
        """Stop watching (the batch finished); idempotent."""
        self._closed = True
        if self._scope is not None:
            self._scope.cancel("batch finished")
        self._batch_deadline = math.inf
