"""``with_cleanup``: run a body, then a bounded, shielded cleanup on every exit path (CONTRACT C1)."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import anyio

from .._values._errors import ConfigurationError

__all__ = ["CLEANUP_FAILED", "CLEANUP_TIMED_OUT", "with_cleanup"]

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
    with anyio.CancelScope(shield=True):
        with anyio.move_on_after(bound) as deadline:
            try:
                await cleanup()
            except Exception as exc:
                # Logged here, where the traceback is still at hand; the
                # caller decides whether a note or a record is the outcome.
                logger.debug("cleanup raised", exc_info=exc)
                problem = CLEANUP_FAILED
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
        problem = await _bounded_cleanup(cleanup, cleanup_timeout)
        if problem is not None:
            exc.add_note(problem)
        raise
    problem = await _bounded_cleanup(cleanup, cleanup_timeout)
    if problem is not None:
        logger.warning("%s after the body returned (cleanup_timeout=%s s)", problem, cleanup_timeout)
    return value
