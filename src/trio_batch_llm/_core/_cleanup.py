"""``with_cleanup``: run a body, then a bounded, shielded cleanup on every exit path (CONTRACT C1).

``CloseOnce`` is the same promise for a handle's own ``aclose()``: one shielded close, idempotent.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar, final

import anyio
import anyio.lowlevel

from .._values._errors import ConfigurationError

__all__ = ["CLEANUP_FAILED", "CLEANUP_TIMED_OUT", "CloseOnce", "with_cleanup"]

T = TypeVar("T")

CLEANUP_TIMED_OUT: Final = "trio-batch-llm: cleanup timed out"
"""The note added to the body's exception when the bounded cleanup hit its deadline."""
CLEANUP_FAILED: Final = "trio-batch-llm: cleanup failed"
"""The note added to the body's exception when the bounded cleanup raised."""

logger = logging.getLogger("trio_batch_llm.cleanup")


async def _bounded_cleanup(cleanup: Callable[[], Awaitable[None]], bound: float) -> str | None:
    """Run ``cleanup`` shielded from the caller and bounded by ``bound`` seconds.

    Returns ``None`` on success, else the note that describes the problem.
    Only ``Exception`` is caught: a ``KeyboardInterrupt``, ``SystemExit`` or a
    cancellation that is not our own deadline's keeps propagating.
    """
    problem: str | None = None
    # The shield is outside the bound, not the other way round: the shield keeps the caller's
    # cancellation (often the very reason we are cleaning up) from cutting the cleanup short,
    # and the bound inside it is the only thing left that can. Swapped, the shield would also
    # hold off our own deadline and a hanging cleanup would hang the caller.
    with anyio.CancelScope(shield=True):
        with anyio.move_on_after(bound) as deadline:
            try:
                await cleanup()
            except Exception as exc:
                # Logged here, where the traceback is still at hand; the
                # caller decides whether a note or a record is the outcome.
                logger.debug("cleanup raised", exc_info=exc)
                problem = CLEANUP_FAILED
    # Our own bound's cancellation ends at its scope and never reaches the except above: the scope
    # says whether it was the one, and that is a timeout, not a failure.
    if deadline.cancelled_caught:
        problem = CLEANUP_TIMED_OUT
    return problem  # noqa: ASYNC910  (await cleanup() ran on every path)


async def with_cleanup(
    body: Callable[[], Awaitable[T]],
    cleanup: Callable[[], Awaitable[None]],
    *,
    cleanup_timeout: float,
) -> T:
    """Await ``body()``, then ``cleanup()`` exactly once, whatever happened.

    The cleanup runs shielded from the caller's cancellation and bounded by
    ``cleanup_timeout`` seconds; past the bound it is cancelled and has exited
    before this returns. If the body raised (or was cancelled), that exception
    propagates unchanged, with one note (:data:`CLEANUP_TIMED_OUT` or
    :data:`CLEANUP_FAILED`) when the cleanup misbehaved. If the body returned,
    its value is returned and a cleanup problem is logged, never raised.
    """
    if (
        isinstance(cleanup_timeout, bool)
        or not isinstance(cleanup_timeout, (int, float))
        or not math.isfinite(cleanup_timeout)
        or cleanup_timeout <= 0
    ):
        raise ConfigurationError("cleanup_timeout", cleanup_timeout, "must be a finite number > 0")
    try:
        value = await body()
    except BaseException as exc:
        # The body's exception (a cancellation included) is what the caller must see: a cleanup
        # problem rides along as a note instead of replacing it (CONTRACT C1).
        problem = await _bounded_cleanup(cleanup, cleanup_timeout)
        if problem is not None:
            exc.add_note(problem)
        raise
    problem = await _bounded_cleanup(cleanup, cleanup_timeout)
    if problem is not None:
        logger.warning("%s after the body returned (cleanup_timeout=%s s)", problem, cleanup_timeout)
    return value


@final
class CloseOnce:
    """The ``aclose()`` of a handle that holds connections or threads: idempotent, closes even when cancelled.

    ``await close_once(close)`` runs ``close()`` the first time only; ``closed`` turns true before it
    starts, so a call arriving meanwhile is refused rather than queued behind the close.
    """

    __slots__ = ("closed",)

    def __init__(self) -> None:
        self.closed = False

    async def __call__(self, close: Callable[[], Awaitable[object]]) -> None:
        if self.closed:
            # Later calls still checkpoint: aclose() is a checkpoint on every path.
            await anyio.lowlevel.checkpoint()
            return
        self.closed = True
        # Shielded: the caller's cancellation (often why it is closing) must not leave the
        # connections or the thread behind; each close is bounded by what it waits for.
        with anyio.CancelScope(shield=True):
            await close()
