"""Async observers: each one fed through its own bounded queue and awaited in one task its owner runs.

The engine emits events synchronously from its workers; an ``async def``
observer cannot be awaited there without stalling them. So each async
observer gets an :class:`ObserverFeed`: :meth:`ObserverFeed.put` is a plain,
O(1) append the engine calls like any sync observer, and :meth:`ObserverFeed.run`
is the task (started by the owner, the processor or pool, with
:meth:`~._hooks.Hooks.start_observers`) that awaits the observer on each event,
one at a time, so one observer sees its events in emission order.

- **A slow observer never stalls the workers.** The queue holds
  :data:`OBSERVER_QUEUE_SIZE` events; when it is full the *oldest* queued event
  is dropped (back-pressure would make the workers wait for the observer).
  Drops are counted and logged once per observer.
- **Each call is bounded** by ``observer_timeout`` (``None``: unbounded). A call
  that times out is cancelled, logged once per observer, then counted; the
  next event is delivered. An observer that raises is logged once (with its
  traceback), then counted. Neither ever reaches the run.
- **Close** (:func:`close_feeds`, the owner's close step): no more events are
  taken; the feeds get ``observer_timeout`` seconds in all to deliver what is
  queued (so the terminal events and ``BatchFinished`` of an observer that
  keeps up arrive before the close returns), then what is left is dropped
  (counted, one warning) and the task is cancelled and awaited: no task
  outlives its owner.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, final

import anyio
import anyio.lowlevel

__all__ = ["OBSERVER_QUEUE_SIZE", "ObserverFeed", "ObserverFeedStatistics", "close_feeds"]

logger = logging.getLogger("trio_batch_llm.observers")

OBSERVER_QUEUE_SIZE: Final = 10_000
"""Events one async observer may have queued; past it the oldest queued event is dropped."""


@final
@dataclass(frozen=True, slots=True)
class ObserverFeedStatistics:
    name: str
    queued: int
    delivered: int
    failures: int
    timeouts: int
    dropped: int


@final
class ObserverFeed:
    """One async observer's queue and the loop that awaits it (see the module docstring)."""

    __slots__ = (
        "_call", "_cancelled", "_closed", "_counts", "_done", "_logged", "_queue", "_scope", "_started",
        "_timeout", "_wakeup", "name",
    )

    def __init__(self, call: Callable[[Any], Awaitable[object]], name: str, *, timeout: float | None,
                 capacity: int | None = None) -> None:
        self._call = call
        self.name = name
        self._timeout = math.inf if timeout is None else timeout
        self._queue: deque[Any] = deque(maxlen=OBSERVER_QUEUE_SIZE if capacity is None else capacity)
        self._wakeup: anyio.Event | None = None
        self._done: anyio.Event | None = None
        self._scope: anyio.CancelScope | None = None
        self._started = False
        self._closed = False
        self._cancelled = False
        self._logged: set[str] = set()
        self._counts = {"delivered": 0, "failures": 0, "timeouts": 0, "dropped": 0}

    # --- the engine's side: never blocks, never raises --------------------------------

    def put(self, event: Any) -> None:
        """Queue ``event``; when the queue is full the oldest queued event is dropped."""
        queue = self._queue
        if self._closed:
            self._counts["dropped"] += 1
            return
        if len(queue) == queue.maxlen:
            self._counts["dropped"] += 1
            self._log_once("dropped", "observer %s falls behind: its queue of %d events is full, so the "
                           "oldest are dropped (counted; further drops are not logged)", queue.maxlen)
        queue.append(event)  # a deque with maxlen drops its oldest entry itself
        wakeup = self._wakeup
        if wakeup is not None:
            self._wakeup = None
            wakeup.set()

    # --- the owner's task -----------------------------------------------------------------

    def starting(self) -> None:
        """The owner is about to start :meth:`run` (so a close waits for it)."""
        self._started = True
        self._done = anyio.Event()

    async def run(self) -> None:
        """Await the observer on each event in order until closed and empty, or cancelled."""
        done = self._done
        assert done is not None, "starting() first"
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                if self._cancelled:
                    scope.cancel("observer feed closed")
                queue = self._queue
                while True:
                    while not queue:
                        if self._closed:
                            return
                        self._wakeup = wakeup = anyio.Event()
                        await wakeup.wait()
                    await self._deliver(queue.popleft())
                    await anyio.lowlevel.checkpoint()  # an observer that never awaits still yields per event
        finally:
            self._scope = None
            done.set()

    async def _deliver(self, event: Any) -> None:
        with anyio.move_on_after(self._timeout) as scope:
            try:
                await self._call(event)
            except Exception:  # noqa: BLE001 - an observer never breaks the run; cancellation passes
                self._counts["failures"] += 1
                self._log_once("raised", "observer %s raised; further failures of it are not logged",
                               exc_info=True)
                return  # noqa: ASYNC910 - run() checkpoints after every delivery
        if scope.cancelled_caught:
            self._counts["timeouts"] += 1
            self._log_once("timed out", "observer %s timed out after %g s (observer_timeout); the event is "
                           "skipped, further timeouts of it are not logged", self._timeout)
        else:
            self._counts["delivered"] += 1

    # --- close ------------------------------------------------------------------------------

    def close(self) -> None:
        """Take no more events; :meth:`run` returns once the queue is empty."""
        self._closed = True
        wakeup = self._wakeup
        if wakeup is not None:
            self._wakeup = None
            wakeup.set()

    @property
    def finished(self) -> bool:
        return not self._started or (self._done is not None and self._done.is_set())

    async def wait_finished(self) -> None:
        if self._done is not None:
            await self._done.wait()
        else:
            await anyio.lowlevel.checkpoint()

    def abandon(self) -> None:
        """Drop what is still queued (counted, one warning) and cancel the task."""
        left = len(self._queue)
        self._queue.clear()
        self._counts["dropped"] += left
        self._cancelled = True
        if self._scope is not None:
            self._scope.cancel("observer feed closed")
        logger.warning("observer %s: closing with %d event(s) undelivered after the close's bound "
                       "(observer_timeout); they are dropped and the observer's task is cancelled",
                       self.name, left)

    def _log_once(self, kind: str, message: str, *args: object, exc_info: bool = False) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            logger.warning(message, self.name, *args, exc_info=exc_info)

    def statistics(self) -> ObserverFeedStatistics:
        counts = self._counts
        return ObserverFeedStatistics(name=self.name, queued=len(self._queue), delivered=counts["delivered"],
                                      failures=counts["failures"], timeouts=counts["timeouts"],
                                      dropped=counts["dropped"])


async def close_feeds(feeds: Sequence[ObserverFeed], bound: float | None) -> None:
    """Close every feed, give them ``bound`` seconds in all to deliver their queues, then cancel the rest."""
    for feed in feeds:
        feed.close()
    with anyio.move_on_after(math.inf if bound is None else bound):
        for feed in feeds:
            await feed.wait_finished()
    for feed in feeds:
        if not feed.finished:
            feed.abandon()
    for feed in feeds:
        await feed.wait_finished()
    await anyio.lowlevel.checkpoint()
