"""Keeping Python's full garbage collections out of a stop's drain.

A stop reports a queue of thousands as not executed and settles every call in flight,
cut short or finished: a burst of allocations that all survive (results, their dicts,
the cut calls' exceptions). A collection inside it frees little, yet a full one walks the
whole heap. Measured at N = 1,000 (10,000 queued, Trio): a full collection landed inside
the deadline drain in most runs and cost 20-35 ms of its 85-95 ms, and inside the graceful
drain in every run after the first, 25-28 ms of about 65 ms.

So from a stop until its drain is over, :class:`CollectorPause` defers full collections
only: the threshold of the oldest generation is raised, the young generations are collected
as usual, so short-lived cycles are still freed. The thresholds are process-wide, so each
pause is bounded: they are restored when the drain is over, or at the first item settled
after :data:`MAX_PAUSE_SECONDS`, and thresholds the application changed meanwhile (or a
collector it disabled) are left as they are. :func:`no_collection` pauses the collector
outright over one synchronous loop.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final, final

__all__ = ["MAX_PAUSE_SECONDS", "CollectorPause", "no_collection"]

MAX_PAUSE_SECONDS: Final = 1.0
"""The longest a stop's drain defers full collections (real seconds), checked as items settle:
a drain that waits on a slow store, a slow stream consumer or long calls must not keep old
cycles uncollected for that long."""

DEFERRED: Final = 1 << 30
"""The oldest generation's threshold during a pause: no full collection falls due."""


@contextmanager
def no_collection() -> Iterator[None]:
    """Pause the collector over a synchronous loop whose allocations all survive (no await inside)."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


@final
class CollectorPause:
    """Full collections deferred from a stop until its drain ends (:meth:`end`), bounded in time."""

    __slots__ = ("_saved", "_since")

    def __init__(self) -> None:
        self._since: float | None = None  # real time the pause began; None: not paused by us
        self._saved = (0, 0, 0)  # the thresholds found at begin()

    @property
    def active(self) -> bool:
        return self._since is not None

    def begin(self) -> None:
        if self._since is None and gc.isenabled():
            thresholds = gc.get_threshold()
            if thresholds[2] != DEFERRED:  # not inside another processor's pause
                self._saved = thresholds
                gc.set_threshold(thresholds[0], thresholds[1], DEFERRED)
                self._since = time.perf_counter()

    def check(self) -> None:
        """End the pause if it has lasted :data:`MAX_PAUSE_SECONDS`."""
        since = self._since
        if since is not None and time.perf_counter() - since >= MAX_PAUSE_SECONDS:
            self.end()

    def end(self) -> None:
        if self._since is not None:
            self._since = None
            young, middle, oldest = gc.get_threshold()
            if oldest == DEFERRED:  # still ours: the application set none meanwhile
                gc.set_threshold(young, middle, self._saved[2])
