"""Cancellation deliveries to one close call, counted explicitly (CONTRACT C3), and group unwrapping (C6.4).

A close call must tell the *first* delivery (the caller's context is
cancelled: deferred until teardown has finished) from a *second* one (a forced
abort). Nothing here reads ``Task.cancelling()``, calls ``uncancel()`` or looks
at exception attributes; the count is kept by hand:

- at entry, before any checkpoint: the caller passed the exception its
  ``__aexit__``/``finally`` is handling and it is a cancellation, or the
  caller's effective deadline is ``-inf`` (its scope is already cancelled);
- during the close, at the closer's shielded wait (:func:`wait_counting`):
  on asyncio a native ``Task.cancel()`` gets through anyio's shields and
  arrives here as ``CancelledError``; on Trio a pending Ctrl+C arrives here as
  ``KeyboardInterrupt`` (the backend adapters name them);
- after the shield: the caller's scope was cancelled while we were shielded
  (how Trio, and anyio on asyncio, show it: the effective deadline is ``-inf``).

A level-triggered cancellation is counted once however often the backend
would re-raise it: once counted, the closer only waits shielded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from types import TracebackType
from typing import final, overload

import anyio

from .._backends import describe_wait_delivery

__all__ = ["CatchDeliveries", "CloseCall", "is_cancellation", "unwrap_group", "wait_counting"]


@overload
def unwrap_group(exc: BaseException) -> BaseException: ...
@overload
def unwrap_group() -> AbstractContextManager[None]: ...
def unwrap_group(exc: BaseException | None = None) -> BaseException | AbstractContextManager[None]:
    """Unwrap single-exception groups at a public boundary (C6.4).

    ``unwrap_group(exc)`` returns the lone exception inside (nested)
    one-exception groups, else ``exc`` itself. ``with unwrap_group():``
    re-raises that lone exception when such a group escapes the block, so
    ``KeyboardInterrupt``, ``SystemExit(code)`` and the original exception
    instance come out of task groups as themselves. Groups of two or more stay
    groups.
    """
    if exc is None:
        return _unwrapping_groups()
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


@contextmanager
def _unwrapping_groups() -> Iterator[None]:
    try:
        yield
    except BaseExceptionGroup as group:
        inner = unwrap_group(group)
        if inner is group:
            raise
        # Same object; its __context__ stays what it was rather than the
        # group, which was only a wrapper.
        context = inner.__context__
        try:
            raise inner
        finally:
            inner.__context__ = context
            del inner, context, group


def is_cancellation(exc: BaseException | None) -> bool:
    """Whether ``exc`` is the backend's cancellation, or a group holding nothing else."""
    if exc is None:
        return False
    if isinstance(exc, BaseExceptionGroup):
        matched, rest = exc.split(anyio.get_cancelled_exc_class())
        return matched is not None and rest is None
    return isinstance(exc, anyio.get_cancelled_exc_class())


def caller_cancelled_now() -> bool:
    """Whether the calling context is cancelled; call it *outside* any shield of ours."""
    return anyio.current_effective_deadline() == -math.inf


@final
class CloseCall:
    """The delivery count of one ``aclose()`` call.

    ``body_exception`` is the exception the caller is already propagating
    (passed by an ``__aexit__``); it is never replaced by a cleanup error.
    ``native`` is the first cancellation caught at the shielded wait: being
    edge-triggered (asyncio would not deliver it again) it must be re-raised,
    even when the first delivery was noticed at entry. ``interrupt`` is a
    ``KeyboardInterrupt`` caught there. ``caller_cancelled`` records a
    level-triggered cancellation of the caller's scope, which the next
    checkpoint outside our shields raises again by itself.
    """

    __slots__ = ("body_exception", "caller_cancelled", "deliveries", "interrupt", "native", "on_count")

    def __init__(self, body_exception: BaseException | None, on_count: Callable[[], None]) -> None:
        self.body_exception = body_exception
        self.on_count = on_count
        self.deliveries = 0
        self.caller_cancelled = False
        self.native: BaseException | None = None
        self.interrupt: BaseException | None = None

    def _count(self) -> None:
        self.deliveries += 1
        self.on_count()

    def note_entry(self) -> None:
        """First delivery already at entry: call before the first checkpoint of the close."""
        if is_cancellation(self.body_exception) or caller_cancelled_now():
            self.caller_cancelled = True
            self._count()

    def note_exit(self) -> None:
        """After the shield: notice a caller cancellation that the shield kept out (Trio's way)."""
        if not self.caller_cancelled and caller_cancelled_now():
            self.caller_cancelled = True
            if self.deliveries == 0:
                self._count()

    def count_at_wait(self, exc: BaseException) -> bool:
        """Record a delivery caught at the shielded wait; ``True`` if it forces an abort."""
        self._count()
        if isinstance(exc, KeyboardInterrupt):
            # A Ctrl+C reaching the wait is always a second delivery (C3.3).
            if self.interrupt is None:
                self.interrupt = exc
            return True
        if self.native is None:
            self.native = exc  # edge-triggered: the close re-raises this object at the end
        return self.deliveries > 1  # the first delivery is deferred, a later one forces

    def release(self) -> None:
        """Drop the exceptions this call kept, so nothing outlives the call (C4.6)."""
        self.body_exception = None
        self.native = None
        self.interrupt = None


@final
class CatchDeliveries:
    """The closer's shielded wait: the one place (CONTRACT C3) that catches a
    cancellation without re-raising it at once.

    A cancellation or ``KeyboardInterrupt`` leaving the block is a delivery:
    it is counted in ``call`` (which keeps what must be re-raised later) and
    suppressed here; a second delivery calls ``force(description)``. Anything
    else passes through untouched.
    """

    __slots__ = ("call", "force")

    def __init__(self, call: CloseCall, force: Callable[[str], object]) -> None:
        self.call = call
        self.force = force

    def __enter__(self) -> CatchDeliveries:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if exc is None:
            return False
        if not isinstance(exc, KeyboardInterrupt | anyio.get_cancelled_exc_class()):
            return False
        if self.call.count_at_wait(exc):
            self.force(describe_wait_delivery(exc))
        return True


async def wait_counting(  # noqa: ASYNC910  (called only while `done` is unset: it awaits)
    done: anyio.Event,
    call: CloseCall,
    force: Callable[[str], object],
    *,
    slow_after: float | None = None,
    on_slow: Callable[[], None] | None = None,
) -> None:
    """Wait, shielded, until ``done`` is set, counting what is delivered meanwhile.

    A second delivery calls ``force(description)``; the wait goes on until
    ``done`` (the forced step must have exited). ``on_slow`` runs once if the
    wait outlasts ``slow_after`` seconds: a diagnostic, never a deadline (C2.7).
    """
    with anyio.CancelScope(shield=True):
        warn_at = None if slow_after is None else anyio.current_time() + slow_after
        while not done.is_set():
            with CatchDeliveries(call, force):
                if warn_at is None:
                    await done.wait()
                    continue
                with anyio.move_on_at(warn_at) as slow:
                    await done.wait()
                if slow.cancelled_caught:
                    warn_at = None
                    if on_slow is not None:
                        on_slow()
