"""Keeping Python's cyclic garbage collector out of a stop's drain.

A stop that cuts every call short, then reports a queue of thousands as not executed, is
a burst of allocations that all survive (results, their dicts, the cut calls' exceptions):
a collection inside it can free little, yet a full one walks the whole heap. Measured on
the deadline drain at N = 1,000 (1,000 calls cut, 10,000 queued, Trio): a full collection
landed inside the drain in most runs and cost 20-35 ms of its 85-95 ms; with the collector
held off it took 56-61 ms. The switch is process-wide, so each pause is bounded: the
collector runs again when the drain is over, or after :data:`MAX_PAUSE_SECONDS` at most,
and a collector the application disabled stays disabled.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final, final

__all__ = ["MAX_PAUSE_SECONDS", "CollectorPause", "no_collection"]

MAX_PAUSE_SECONDS: Final = 1.0
"""The longest a stop's drain holds the collector off (real seconds): a drain that waits on a
slow store or a slow stream consumer must not leave cycles uncollected for that long."""


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
    """The collector held off from a stop until its drain ends (:meth:`end`), bounded in time."""

    __slots__ = ("_since",)

    def __init__(self) -> None:
        self._since: float | None = None  # real time the pause began; None: not paused by us

    @property
    def active(self) -> bool:
        return self._since is not None

    def begin(self) -> None:
        if self._since is None and gc.isenabled():
            gc.disable()
            self._since = time.perf_counter()

    def check(self) -> None:
        """End the pause if it has lasted :data:`MAX_PAUSE_SECONDS`."""
        since = self._since
        if since is not None and time.perf_counter() - since >= MAX_PAUSE_SECONDS:
            self.end()

    def end(self) -> None:
        if self._since is not None:
            self._since = None
            gc.enable()
