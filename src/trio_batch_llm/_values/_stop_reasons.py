"""``StopReason``: why an item did not run to its own end, one vocabulary for every surface.

Its own module, as :mod:`._categories` is: results, the engine, the stores, the runs
and the export all speak it, and none of them should import another to do so.

An item that ran to its own end (it succeeded, or its last attempt failed and no
retry was left) has no stop reason. Every other result names what kept it from
its end: a stop of the whole batch, its own deadline, or its owner going away.
The error category still says *what* the result is (``deadline``, ``aborted``,
``budget``, ``not_executed``); the stop reason says *why*, so a batch deadline,
an abort, a full pool and a pause no longer share one text-only ``not_executed``.
"""

from __future__ import annotations

import enum
from typing import Any

__all__ = ["StopReason", "stop_reason_of"]


class StopReason(enum.StrEnum):
    """Why an item did not run to its own end (``WorkItemResult.stop_reason``)."""

    BATCH_DEADLINE = "batch_deadline"
    """The batch's deadline (``GuardrailConfig.batch_timeout``, ``--batch-timeout``) came."""
    ITEM_DEADLINE = "item_deadline"
    """The item's own deadline (``total_timeout_per_item``, a call-start deadline) came."""
    ABORT_CATEGORY = "abort_category"
    """Another item failed with a category in ``abort_on_error_categories``."""
    FAIL_FAST = "fail_fast"
    """The batch stopped because something outside the items failed (its input, a hook, a store)."""
    BUDGET = "budget"
    """A token or cost budget (``max_total_tokens``, ``max_total_cost``) was spent."""
    PAUSE = "pause"
    """The run was paused (``runs pause``); a resume runs the item."""
    SUBMITTER_CANCELLED = "submitter_cancelled"
    """The task that submitted the item (``call_result``, ``LLMCallPool.submit``) was cancelled."""
    POOL_FULL = "pool_full"
    """The pool was full (``max_pending``): ``submit_result`` refused the request at the door."""
    POOL_CLOSED = "pool_closed"
    """The pool (or its stream) was closed with the item still queued or refused at the door."""
    PROVIDER_RETIRED = "provider_retired"
    """The circuit breaker retired the scope's provider: the endpoint itself is unusable."""
    SHUTDOWN = "shutdown"
    """The batch was told to stop (``request_stop()``, Ctrl+C, the owner's cancellation)."""


def stop_reason_of(value: Any) -> StopReason | None:
    """A stored ``stop_reason``; one this version does not know (a newer writer's) reads as unknown."""
    if not value:
        return None
    try:
        return StopReason(value)
    except ValueError:
        return None
