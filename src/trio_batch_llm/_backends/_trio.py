"""Trio specifics of cleanup deliveries. Only this module and ``_asyncio.py`` import a backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import final

import trio

from . import KI_PROTECTED

__all__ = [
    "TrioLoopHandle",
    "capture_loop_handle",
    "describe_wait_delivery",
    "protect_from_keyboard_interrupt",
]


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


def protect_from_keyboard_interrupt(fn: Callable[..., object]) -> None:
    # Marks fn's code object: Trio's SIGINT handler walks the interrupted
    # frames up to the task's root and obeys the first mark it finds, so
    # everything fn calls in its task is covered too (not other tasks).
    trio.lowlevel.enable_ki_protection(fn)


def _protect_registered() -> None:
    for fn in KI_PROTECTED:
        protect_from_keyboard_interrupt(fn)


_protect_registered()  # what was registered before this module was first imported
