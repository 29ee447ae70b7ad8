"""One worker thread at a time, counting the one a cancelled caller abandoned.

The synchronous post-processor runs in a worker thread under a timeout. A
caller that times out abandons its thread, but the thread runs on and is
still owned: the next call waits for it, and the owner's close waits for it
(:meth:`ThreadGate.wait_idle`), so no thread outlives its owner unnoticed.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, final

import anyio
import anyio.lowlevel
import anyio.to_thread

from .._backends import LoopHandle, capture_loop_handle

__all__ = ["ThreadGate"]


@final
class _Call:
    __slots__ = ("cancelled", "finished", "idle", "started")

    def __init__(self) -> None:
        self.idle = anyio.Event()
        self.started = False
        self.finished = False
        self.cancelled = False


@final
class ThreadGate:
    """One post-processor thread at a time, including one whose caller timed out.

    anyio hands back a thread limiter as soon as it abandons a thread, so the
    gate is ours: it opens when the thread itself reports back through the
    loop handle. A call cancelled before its thread started never runs.
    """

    __slots__ = ("_current", "_handle", "_limiter", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()  # makes "cancelled before it started" one decision
        self._current: _Call | None = None
        self._handle: LoopHandle | None = None
        self._limiter: anyio.CapacityLimiter | None = None

    @property
    def busy(self) -> bool:
        """Whether a thread is running (or a call waits for one), abandoned or not."""
        return self._current is not None

    def _release(self, call: _Call) -> None:
        if self._current is call:
            self._current = None
        call.idle.set()

    async def run(self, fn: Callable[[Any], Any], arg: Any) -> Any:
        """``fn(arg)`` in a worker thread, once the previous thread (abandoned or not) has returned."""
        while self._current is not None:
            await self._current.idle.wait()
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(1)
            self._handle = capture_loop_handle()
        handle = self._handle
        assert handle is not None
        call = self._current = _Call()

        def in_thread() -> Any:
            with self._lock:
                if call.cancelled:
                    return None
                call.started = True
            try:
                return fn(arg)
            finally:
                call.finished = True
                handle.run_sync_soon(functools.partial(self._release, call))

        try:
            value = await anyio.to_thread.run_sync(in_thread, abandon_on_cancel=True, limiter=self._limiter)
        except BaseException:
            with self._lock:
                call.cancelled = True
                running = call.started and not call.finished
            if not running:  # a running thread runs on and releases the gate itself when it returns
                self._release(call)
            raise
        self._release(call)
        return value

    async def wait_idle(self) -> None:
        """Return once no thread runs; checkpoints even when none does."""
        await anyio.lowlevel.checkpoint()
        while self._current is not None:
            await self._current.idle.wait()
