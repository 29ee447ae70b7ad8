"""The only door to backend-native behaviour (DESIGN "One engine, two backends").

Core modules speak anyio. The few things anyio does not say in one neutral
way live behind the functions below; ``_trio.py`` and ``_asyncio.py`` are the
only modules of the package that import a backend, and each is imported
lazily, when the running event loop is of its kind.

What differs, in the engine's own vocabulary (CONTRACT C3):

- how a cancellation can reach a closer's *shielded* wait (shielded once the
  caller's own cancellation was counted): on asyncio a native
  ``Task.cancel()`` passes anyio's shields; on Trio nothing does;
- how a ``KeyboardInterrupt`` reaches that wait: Trio delivers a pending Ctrl+C
  to the main task's checkpoint even through shields; asyncio's runner turns
  the first Ctrl+C into a native cancel of the main task instead;
- what a native cancellation the closer re-raises needs in order to get past
  the caller's own cancelled scopes (asyncio: anyio must not take it for its
  own cancellation);
- how a thread asks the loop to run a callback soon, without blocking;
- what cancelling many scopes at once costs: anyio on asyncio writes the calling
  task's repr into every scope's cancel reason (about 10 µs a scope), so there a
  stop cancels its guards from a loop callback, outside any task;
- keeping a Ctrl+C out of the closer's own code: Trio raises
  ``KeyboardInterrupt`` wherever unprotected code runs, so the close is
  marked KI-protected and Trio holds the interrupt for its next checkpoint;
- where a ``KeyboardInterrupt`` or ``SystemExit`` raised in a child task goes:
  on Trio into its nursery like any exception; asyncio's ``Task`` re-raises
  them out of the event loop itself, past every owner (:func:`leaves_the_loop`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

import sniffio

if TYPE_CHECKING:
    import anyio

__all__ = [
    "Backend",
    "LoopHandle",
    "cancel_scopes",
    "capture_loop_handle",
    "current_backend",
    "describe_wait_delivery",
    "leaves_the_loop",
    "propagate_past_scopes",
    "protected_from_keyboard_interrupt",
]

Backend = Literal["asyncio", "trio"]

_F = TypeVar("_F", bound=Callable[..., object])

KI_PROTECTED: list[Callable[..., object]] = []
"""The functions :func:`protected_from_keyboard_interrupt` marked; ``_trio`` protects them on import."""


class LoopHandle(Protocol):
    """A thread-safe way back into one running event loop."""

    def run_sync_soon(self, fn: Callable[[], object]) -> bool:
        """Schedule ``fn()`` in the loop from any thread; ``False`` if the loop has finished."""
        ...


def current_backend() -> Backend:
    """The backend of the running event loop; ``RuntimeError`` outside one."""
    try:
        name = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        raise RuntimeError("no trio or asyncio event loop is running in this thread") from None
    if name == "trio":
        return "trio"
    if name == "asyncio":
        return "asyncio"
    raise RuntimeError(f"unsupported async library {name!r}: trio-batch-llm runs on trio or asyncio")


def capture_loop_handle() -> LoopHandle:
    """A handle to the running loop that a thread can use later (call from inside the loop)."""
    if current_backend() == "trio":
        from . import _trio

        return _trio.capture_loop_handle()
    from . import _asyncio

    return _asyncio.capture_loop_handle()


def cancel_scopes(scopes: Sequence[anyio.CancelScope], reason: str) -> None:
    """Cancel every scope of ``scopes`` (a stop cutting a thousand calls short), at least cost.

    On Trio at once. On asyncio from a callback the loop runs next, outside any task: anyio
    formats the calling task's repr into each scope's reason there (about 10 µs, a tenth of
    a deadline drain at N = 1,000), and none outside a task. The caller must treat the scopes
    as cancelled from now on (the guards record their stop first, and each worker checks it).
    """
    if current_backend() == "trio":
        for scope in scopes:
            scope.cancel(reason)
        return
    from . import _asyncio

    _asyncio.cancel_scopes_soon(scopes, reason)


def describe_wait_delivery(exc: BaseException) -> str:
    """Name, for logs and warnings, the delivery that raised ``exc`` at a closer's shielded wait."""
    if current_backend() == "trio":
        from . import _trio

        return _trio.describe_wait_delivery(exc)
    from . import _asyncio

    return _asyncio.describe_wait_delivery(exc)


def leaves_the_loop(exc: BaseException) -> bool:
    """Whether ``exc``, escaping a child task's coroutine, would leave the event loop itself.

    asyncio's ``Task`` re-raises ``KeyboardInterrupt`` and ``SystemExit`` out of
    ``run_until_complete`` (``asyncio.run`` raises it, the awaiting code never sees it,
    and owners close only as the runner cancels every task). So a task that catches one
    must hand it to its owner to re-raise (CONTRACT C6.4, C7). On Trio a task's
    exception, these included, travels through its nursery: ``False``.
    """
    if not isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return False
    return current_backend() == "asyncio"


def propagate_past_scopes(exc: BaseException) -> None:
    """Prepare ``exc``, an edge-triggered delivery the closer is re-raising, to reach the caller.

    Call it on the propagating exception (in the ``finally`` of the raise):
    a delivery that forced the close, or one deferred until teardown ended,
    must propagate past the caller's scopes even when one of them was
    cancelled first (CONTRACT C3.3).
    """
    if current_backend() == "trio":
        return  # nothing edge-triggered is re-raised on Trio: its cancellations are level-triggered
    from . import _asyncio

    _asyncio.propagate_past_scopes(exc)


def protected_from_keyboard_interrupt(fn: _F) -> _F:
    """Decorator: on Trio, a Ctrl+C that lands while ``fn`` (or what it calls in its task) runs is held.

    Trio raises ``KeyboardInterrupt`` inside whatever unprotected Python code
    is running when SIGINT arrives; in code marked this way it holds it for
    the task's next checkpoint instead (``trio.lowlevel.enable_ki_protection``),
    so a close counts it at its own wait rather than being broken off between
    two of its statements. The mark is applied when the Trio adapter is first
    imported (on the first Trio close), so importing this package does not
    import Trio. No effect on asyncio.
    """
    KI_PROTECTED.append(fn)
    trio_adapter = sys.modules.get(f"{__name__}._trio")
    if trio_adapter is not None:
        trio_adapter.protect_from_keyboard_interrupt(fn)
    return fn
