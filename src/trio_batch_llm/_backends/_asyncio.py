"""asyncio specifics of cleanup deliveries. Only this module and ``_trio.py`` import a backend."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import final

__all__ = ["AsyncioLoopHandle", "capture_loop_handle", "describe_wait_delivery"]


@final
class AsyncioLoopHandle:
    """Re-enters one asyncio loop through ``call_soon_threadsafe`` (never blocks)."""

    __slots__ = ("_loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def run_sync_soon(self, fn: Callable[[], object]) -> bool:
        try:
            self._loop.call_soon_threadsafe(fn)
        except RuntimeError:  # the loop is closed
            return False
        return True


def capture_loop_handle() -> AsyncioLoopHandle:
    return AsyncioLoopHandle(asyncio.get_running_loop())


def describe_wait_delivery(exc: BaseException) -> str:
    # anyio's shields hold against anyio cancellations but not against a native
    # Task.cancel() (asyncio.timeout, Runner's first Ctrl+C, task.cancel()):
    # every CancelledError that reaches a shielded wait is one of those.
    if isinstance(exc, asyncio.CancelledError):
        return "native Task.cancel() of the closing task"
    if isinstance(exc, KeyboardInterrupt):
        return "KeyboardInterrupt at the closer's wait"
    return f"{type(exc).__name__} at the closer's wait"
