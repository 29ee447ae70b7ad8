"""When a batch stops, why, and what its unfinished items are told: a synchronous policy.

:class:`StopPolicy` holds every stop rule of :class:`~._processor.ParallelBatchProcessor`
and nothing else: it never awaits, owns no task and reads no clock, so it is tested
without an event loop. The first decision wins; each method that may decide a stop
returns the :class:`Stop` it just decided (``None`` otherwise), and the processor applies
it (cancel the calls in flight or not, close the input)::

    stop = policy.judge(result) or policy.charge(result)   # per finished item
    stop = policy.deadline_reached()                       # the batch deadline came
    stop = policy.request("interrupted", reason)           # request_stop(), a failing input
    if stop is not None:
        processor.apply(stop)

Each stop also says *why* in the shared vocabulary (:class:`StopReason`: from its kind, or
given with the request: a failing input is ``FAIL_FAST``, a pause ``PAUSE``), and names the
item whose result decided it (an abort, a spent budget): every item it leaves unfinished
carries that reason, and the termination names the item.

Budgets fail closed: a ``cost_function`` that raises or returns something that is not a
cost stops the batch as ``budget_exhausted``, since an unknown spend must not keep buying.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, final

from .._values._categories import ErrorCategory
from .._values._config import AbortMode, GuardrailConfig
from .._values._cost import InvalidCost
from .._values._results import BatchTermination, TerminationKind, WorkItemResult
from .._values._stats import RunCounters
from .._values._stop_reasons import StopReason

__all__ = ["REASON_OF_KIND", "Stop", "StopPolicy"]

logger = logging.getLogger("trio_batch_llm.engine")

REASON_OF_KIND: Final[Mapping[TerminationKind, StopReason]] = {
    "batch_deadline": StopReason.BATCH_DEADLINE,
    "budget_exhausted": StopReason.BUDGET,
    "aborted": StopReason.ABORT_CATEGORY,
    "interrupted": StopReason.SHUTDOWN,
    "provider_retired": StopReason.PROVIDER_RETIRED,
}
"""The stop reason of a stop of each kind, unless its request names another (``FAIL_FAST``, ``PAUSE``)."""


@final
@dataclass(frozen=True, slots=True)
class Stop:
    """A stop just decided: its kind and reason, and whether calls in flight are cut short."""

    kind: TerminationKind
    reason: str
    cancel_active: bool
    stop_reason: StopReason = StopReason.SHUTDOWN
    """Why, as every item the stop leaves unfinished says it."""
    item_id: str | None = None
    """The item whose result decided the stop (an abort, a spent budget)."""


@final
class StopPolicy:
    """The stop rules of one batch, from its :class:`GuardrailConfig`, over its counters.

    :meth:`charge` adds each result's tokens (and cost) to ``counters``: the budgets are
    checked against what this policy counted.
    """

    __slots__ = (
        "_abort_cancels",
        "_abort_on",
        "_cut_short",
        "_guard",
        "_max_cost",
        "_max_tokens",
        "_not_executed",
        "counters",
        "item_id",
        "kind",
        "reason",
        "stop_reason",
    )

    def __init__(self, guardrails: GuardrailConfig, counters: RunCounters | None = None) -> None:
        self._guard = guardrails
        self.counters = counters if counters is not None else RunCounters()
        self._abort_on = guardrails.abort_on_error_categories
        self._abort_cancels = guardrails.abort_mode is AbortMode.CANCEL_ACTIVE
        self._max_tokens = guardrails.max_total_tokens
        self._max_cost = guardrails.max_total_cost
        self.kind: TerminationKind | None = None
        self.reason: str | None = None
        self.stop_reason: StopReason | None = None
        """Why the batch stopped, as its unfinished items say it (``None``: no stop yet)."""
        self.item_id: str | None = None
        """The item whose result decided the stop, if one did."""
        # Fixed once stopped: every not-executed (cut-short) item of this stop shares them.
        self._not_executed: tuple[str, ErrorCategory] | None = None
        self._cut_short: tuple[ErrorCategory, str] | None = None

    # --- what the policy knows --------------------------------------------------

    @property
    def stopped(self) -> bool:
        return self.kind is not None

    @property
    def termination(self) -> BatchTermination:
        return BatchTermination(kind=self.kind or "completed", reason=self.reason, item_id=self.item_id)

    @property
    def cuts_calls(self) -> bool:
        """Whether a stop may cut calls in flight short: a batch deadline or a CANCEL_ACTIVE abort."""
        return self._guard.batch_timeout is not None or (bool(self._abort_on) and self._abort_cancels)

    def deadline(self, started_at: float) -> float:
        """The batch deadline of a batch started at ``started_at`` (``math.inf`` without one)."""
        timeout = self._guard.batch_timeout
        return math.inf if timeout is None else started_at + timeout

    # --- decisions --------------------------------------------------------------

    def request(
        self,
        kind: TerminationKind,
        reason: str,
        *,
        cancel_active: bool = False,
        stop_reason: StopReason | None = None,
        item_id: str | None = None,
    ) -> Stop | None:
        """Stop with ``kind`` and ``reason`` unless a stop was decided already (the first wins).

        ``stop_reason`` defaults to the kind's (:data:`REASON_OF_KIND`); ``item_id`` names
        the item whose result decided the stop.
        """
        if self.kind is not None:
            return None
        self.kind = kind
        self.reason = reason
        self.stop_reason = why = stop_reason if stop_reason is not None else REASON_OF_KIND[kind]
        self.item_id = item_id
        return Stop(kind, reason, cancel_active, why, item_id)

    def deadline_reached(self) -> Stop | None:
        """The batch deadline came: calls in flight are cut short."""
        return self.request(
            "batch_deadline", f"batch deadline ({self._guard.batch_timeout} s) reached", cancel_active=True
        )

    def judge(self, result: WorkItemResult[Any]) -> Stop | None:
        """Abort on a failure of a category in ``abort_on_error_categories``.

        A replayed failure is history: it never aborts the run that replays it.
        """
        category = result.error_category
        if result.success or category not in self._abort_on or result.replayed:
            return None
        assert category is not None
        return self.request(
            "aborted",
            f"{category.value} failure of item {result.item_id!r}",
            cancel_active=self._abort_cancels,
            item_id=result.item_id,
        )

    def charge(self, result: WorkItemResult[Any]) -> Stop | None:
        """Count the tokens (and cost) of a freshly executed result; stop at a spent budget.

        A budget is spent when its total reaches the cap, so the batch stops at the first
        item that reaches it: no total ever passes a cap by more than that item's charge.
        """
        counters = self.counters
        usage = result.token_usage
        counters.add_tokens(usage)
        guard = self._guard
        stop = None
        if self._max_tokens is not None and counters.total_tokens >= self._max_tokens:
            stop = self.request("budget_exhausted", f"max_total_tokens={self._max_tokens} reached",
                                item_id=result.item_id)
        if guard.cost_function is None:
            return stop
        try:
            counters.cost += guard.item_cost(usage)  # type: ignore[arg-type]
        except InvalidCost as exc:
            logger.warning("item %r: %s; stopping the batch", result.item_id, exc, exc_info=exc.__cause__)
            return stop or self.request(
                "budget_exhausted", f"item {result.item_id!r}: {exc}; the spend is unknown",
                item_id=result.item_id,
            )
        if self._max_cost is not None and counters.cost >= self._max_cost:
            return stop or self.request("budget_exhausted", f"max_total_cost={self._max_cost} reached",
                                        item_id=result.item_id)
        return stop

    # --- what unfinished items are told -----------------------------------------

    @property
    def unfinished_reason(self) -> StopReason:
        """The stop reason of every item this stop leaves unfinished (:meth:`not_executed`,
        :meth:`cut_short`): the batch deadline's when the deadline cut an item before the stop
        was recorded."""
        return self.stop_reason or StopReason.BATCH_DEADLINE

    def not_executed(self) -> tuple[str, ErrorCategory]:
        """The error and category of an item the stop left in the queue (``BUDGET`` for a budget)."""
        shared = self._not_executed
        if shared is None:
            category = ErrorCategory.BUDGET if self.kind == "budget_exhausted" else ErrorCategory.NOT_EXECUTED
            shared = self._not_executed = (f"not executed: {self.reason or self.kind}", category)
        return shared

    def cut_short(self) -> tuple[ErrorCategory, str]:
        """The category and error of an item the stop cut short in flight.

        ``DEADLINE`` for the batch deadline (also when the deadline cut the item before
        the stop was recorded), ``ABORTED`` for any other stop.
        """
        shared = self._cut_short
        if shared is None:
            kind = self.kind or "batch_deadline"
            category = ErrorCategory.DEADLINE if kind == "batch_deadline" else ErrorCategory.ABORTED
            shared = (category, f"cut short: {self.reason or 'batch deadline'}")
            if self.kind is not None:
                self._cut_short = shared
        return shared
