"""Trio specifics of cleanup deliveries. Only this module and ``_asyncio.py`` import a backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import final

import trio

__all__ = ["TrioLoopHandle", "capture_loop_handle", "describe_wait_delivery"]


@final
class TrioLoopHandle:
    """Re-enters one ``trio.run`` through its ``TrioToken`` (thread-safe, never blocks)."""

    __slots__ = ("_token",)

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self._token = token

    def run_sync_soon(self, fn: Callable[[], object]) -> bool:
        try:
            self._token.run_sync_soon(fn)
        except trio.RunFinishedError:
            return False
        return True


def capture_loop_handle() -> TrioLoopHandle:
    return TrioLoopHandle(trio.lowlevel.current_trio_token())


def describe_wait_delivery(exc: BaseException) -> str:
    # Trio shields stop every Trio cancellation, so the only thing that reaches
    # a shielded wait is a KeyboardInterrupt: Trio hands a pending Ctrl+C to
    # the main task's next checkpoint whatever its cancel scopes say.
    if isinstance(exc, KeyboardInterrupt):
        return "KeyboardInterrupt at the closer's wait (Ctrl+C)"
    if isinstance(exc, trio.Cancelled):
        return "Trio cancellation at a shielded wait"
    return f"{type(exc).__name__} at the closer's wait"
