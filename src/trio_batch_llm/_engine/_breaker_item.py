"""The circuit breaker at an item's admission: wait for its turn, and the result of a retired scope.

The item path's side of :mod:`._breaker_gate` (kept out of :mod:`._item`, which is long enough).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from .._values._categories import ErrorCategory
from .._values._stop_reasons import StopReason

if TYPE_CHECKING:
    from .._values._results import WorkItemResult
    from ._breaker_gate import BreakerGate, Retirement
    from ._item_run import ItemRun

__all__ = ["pass_gate", "retired_result"]

TOutput = TypeVar("TOutput")


async def pass_gate(gate: BreakerGate, run: ItemRun[Any]) -> bool:
    """Before an attempt's admission, when :meth:`BreakerGate.try_enter` said wait: wait for the
    breaker's turn (open, half-open, bounded or retired; no attempt is spent waiting).

    ``False`` when no attempt may start: the scope was retired, or the run's start limit came."""
    clock = gate.clock
    run.switch("admission_wait", clock())
    gated = await gate.enter()
    if gated is None or clock() >= run.start_limit:
        if gated is not None:
            gate.released(probe=gated)
        return False
    run.gate_passed(gated)  # told its outcome once: release_attempt(), else ItemRunner.drive's finally
    return True


def retired_result(run: ItemRun[TOutput],
                   stopped: Retirement | None = None) -> WorkItemResult[TOutput] | None:
    """The result of an item whose scope the breaker retired before its next attempt (``None`` if it
    was not): ``NOT_EXECUTED`` if it never ran, ``ABORTED`` after an attempt; ``PROVIDER_RETIRED``.
    ``stopped``: the owner's batch-stopping error (:meth:`Breakers.stop_batch`), breaker or none."""
    binding = run.binding
    gate = binding.breaker if binding is not None else None
    retirement = stopped if stopped is not None else gate.retirement if gate is not None else None
    if retirement is None:
        return None
    reason, now = retirement.reason, anyio.current_time() if gate is None else gate.clock()
    if run.attempts == 0:
        result = run.stopped(ErrorCategory.NOT_EXECUTED, f"not executed: {reason}", now)
    else:
        result = run.stopped(ErrorCategory.ABORTED, f"cut short: {reason}", now)
    result.stop_reason = StopReason.PROVIDER_RETIRED
    return result
