"""Cancellation deliveries to one close call, counted explicitly (CONTRACT C3), and group unwrapping (C6.4).

A close call must tell the *first* delivery (deferred until teardown has
finished) from a *second* one (a forced abort). Nothing here reads
``Task.cancelling()``, calls ``uncancel()`` or looks at exception attributes;
the count is kept by hand, from where a delivery arrives:

- at entry, before any checkpoint: the caller passed the exception its
  ``__aexit__``/``finally`` is handling and it is a cancellation or a
  ``KeyboardInterrupt``, or the caller's effective deadline is ``-inf`` (its
  scope is already cancelled);
- during the close, at the closer's wait (:func:`wait_counting`). Until the
  caller's own cancellation has been counted the wait is *not* shielded, so
  that cancellation arrives there like any other delivery; a cancellation
  caught where the caller's context is cancelled is that one. From then on
  the wait is shielded, and what still gets through is a second source: on
  asyncio a native ``Task.cancel()`` (anyio's shields do not hold against
  it), on Trio a Ctrl+C, which Trio hands to the main task's checkpoint as
  ``KeyboardInterrupt`` whatever its scopes say (the backend adapters name
  them);
- after the wait: the caller's scope was cancelled in a way no wait saw (the
  effective deadline is ``-inf``).

A level-triggered cancellation is counted once however often the backend
would re-raise it: once counted, the closer only waits shielded. Each
``KeyboardInterrupt`` and each native cancellation is a delivery of its own.
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
    # The one neutral question both backends answer the same way: a cancelled enclosing scope
    # makes the effective deadline -inf. (Task.cancelling() is asyncio's alone, and a native
    # cancel does not show here: that is why it is counted where it arrives instead.)
    return anyio.current_effective_deadline() == -math.inf


@final
class CloseCall:
    """The delivery count of one ``aclose()`` call.

    ``body_exception`` is the exception the caller is already propagating
    (passed by an ``__aexit__``); it is never replaced by a cleanup error.
    ``native`` is the first edge-triggered cancellation the close caught (on
    asyncio, a native ``Task.cancel()``): asyncio will not deliver it again,
    so the close must re-raise that object, whatever the caller was already
    propagating. ``interrupt`` is the first ``KeyboardInterrupt`` that reached
    the close, re-raised once teardown ends (or at once, when it forces).
    ``caller_cancelled`` records the level-triggered cancellation of the
    caller's scope, which the next checkpoint outside our shields raises
    again by itself.
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
        # The delivery counter: the only thing that decides "defer" (the first) from "force"
        # (any later one). Kept by hand, per close call, because neither backend can say how
        # many times a closer was cancelled; the ledger's own total (on_count) is for statistics.
        self.deliveries += 1
        self.on_count()

    def note_entry(self) -> None:
        """First delivery already at entry: call before the first checkpoint of the close."""
        body = self.body_exception
        if is_cancellation(body) or caller_cancelled_now():
            self.caller_cancelled = True
            self._count()
        elif body is not None and isinstance(unwrap_group(body), KeyboardInterrupt):
            self._count()  # a Ctrl+C that unwound the caller's body into this close

    def note_exit(self) -> None:
        """After the wait: notice a caller cancellation that no wait saw."""
        if not self.caller_cancelled and caller_cancelled_now():
            self._note_caller_cancelled()

    def _note_caller_cancelled(self) -> None:
        # Counted once, and only as the first delivery: the caller's own
        # cancellation never forces a close that something else already began
        # to defer.
        self.caller_cancelled = True
        if self.deliveries == 0:
            self._count()

    def count_interrupt(self, exc: BaseException) -> bool:
        """Record a ``KeyboardInterrupt`` that reached the close; ``True`` if it forces an abort."""
        self._count()
        if self.interrupt is None:
            self.interrupt = exc
        return self.deliveries > 1

    def count_at_wait(self, exc: BaseException, *, shielded: bool) -> bool:
        """Record a delivery caught at the closer's wait; ``True`` if it forces an abort.

        ``shielded`` says whether the wait was shielded: a cancellation caught
        at an unshielded wait while the caller's context is cancelled is the
        caller's own (level-triggered) cancellation; anything else that gets
        through is edge-triggered.
        """
        if isinstance(exc, KeyboardInterrupt):
            return self.count_interrupt(exc)
        if not shielded and caller_cancelled_now():
            if not self.caller_cancelled:
                self._note_caller_cancelled()
            return False
        self._count()
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
    """The closer's wait: the one place (CONTRACT C3) that catches a
    cancellation without re-raising it at once.

    A cancellation or ``KeyboardInterrupt`` leaving the block is a delivery:
    it is counted in ``call`` (which keeps what must be re-raised later) and
    suppressed here; a second delivery calls ``force(description)``. Anything
    else passes through untouched. ``shielded`` says whether the block ran
    shielded from the caller's cancellation (see :meth:`CloseCall.count_at_wait`).
    """

    __slots__ = ("call", "force", "shielded")

    def __init__(self, call: CloseCall, force: Callable[[str], object], *, shielded: bool) -> None:
        self.call = call
        self.force = force
        self.shielded = shielded

    def __enter__(self) -> CatchDeliveries:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if exc is None:
            return False
        # A task group around the block wraps what leaves its body in a group of one.
        delivery = unwrap_group(exc)
        if not isinstance(delivery, KeyboardInterrupt | anyio.get_cancelled_exc_class()):
            return False
        if self.call.count_at_wait(delivery, shielded=self.shielded):
            self.force(describe_wait_delivery(delivery))
        return True


async def wait_counting(  # noqa: ASYNC910  (called only while `done` is unset: it awaits)
    done: anyio.Event,
    call: CloseCall,
    force: Callable[[str], object],
    *,
    slow_after: float | None = None,
    on_slow: Callable[[], None] | None = None,
) -> None:
    """Wait until ``done`` is set, counting what is delivered meanwhile.

    Unshielded until the caller's cancellation has been counted (so that it
    is seen when it happens, not after the close), shielded from then on. A
    second delivery calls ``force(description)``; the wait goes on until
    ``done`` (the forced step must have exited). ``on_slow`` runs once if the
    wait outlasts ``slow_after`` seconds: a diagnostic, never a deadline (C2.7).
    """
    warn_at = math.inf if slow_after is None else anyio.current_time() + slow_after
    # A loop, because one delivery ends one wait: it is counted and the wait starts again, shielded
    # once the caller's own cancellation was counted (it is level-triggered: unshielded, every
    # checkpoint would raise it again). A forcing delivery too: the forced step must still exit.
    while not done.is_set():
        shielded = call.caller_cancelled
        # One scope is both the shield and the slow warning's deadline: when its own
        # deadline cancels it, it catches that; a delivery passes through it.
        with CatchDeliveries(call, force, shielded=shielded):
            with anyio.CancelScope(shield=shielded, deadline=warn_at) as slow:
                await done.wait()
            if slow.cancelled_caught:
                warn_at = math.inf
                if on_slow is not None:
                    on_slow()
