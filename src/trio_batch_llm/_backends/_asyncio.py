"""asyncio specifics of cleanup deliveries. Only this module and ``_trio.py`` import a backend."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, final

if TYPE_CHECKING:
    import anyio

__all__ = [
    "AsyncioLoopHandle", "cancel_scopes_soon", "capture_loop_handle", "describe_wait_delivery",
    "propagate_past_scopes",
]


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


def cancel_scopes_soon(scopes: Sequence[anyio.CancelScope], reason: str) -> None:
    # A callback runs outside any task: anyio's cancel() then skips formatting the task into
    # its reason. A scope left (or cancelled) before the callback runs is not affected.
    asyncio.get_running_loop().call_soon(_cancel_all, list(scopes), reason)


def _cancel_all(scopes: list[anyio.CancelScope], reason: str) -> None:
    for scope in scopes:
        scope.cancel(reason)


def describe_wait_delivery(exc: BaseException) -> str:
    # anyio's shields hold against anyio cancellations but not against a native
    # Task.cancel() (asyncio.timeout, Runner's first Ctrl+C, task.cancel()):
    # every CancelledError that reaches a shielded wait is one of those.
    if isinstance(exc, asyncio.CancelledError):
        return "native Task.cancel() of the closing task"
    if isinstance(exc, KeyboardInterrupt):
        return "KeyboardInterrupt at the closer's wait"
    return f"{type(exc).__name__} at the closer's wait"


def propagate_past_scopes(exc: BaseException) -> None:
    # anyio's CancelScope.__exit__ swallows a CancelledError it takes for its
    # own: one whose message names a cancel scope, *or any CancelledError
    # along its __context__ chain* (anyio's is_anyio_cancellation; third-party
    # code re-raising a fresh CancelledError is why it looks there). A native
    # Task.cancel() caught while the caller's scope cancellation was being
    # handled -- the deferred first delivery -- was thrown in with that anyio
    # CancelledError as its __context__, so the caller's cancelled scope would
    # take the native one for its own and end it: the task would go on as if
    # never cancelled. Cutting that link is what lets it through. (anyio's
    # own safeguard, comparing Task.cancelling() at the scope's exit, is
    # fooled when child tasks of the scope were cancelled too: their pending
    # uncancel counts are handed up to the parent scope and uncancel the
    # host task.)
    if isinstance(exc, asyncio.CancelledError) and isinstance(exc.__context__, asyncio.CancelledError):
        exc.__context__ = None
