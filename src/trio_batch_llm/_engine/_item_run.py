"""An :class:`ItemRun`: one item on its way, the one record of its state, and the results built from it.

No awaits. The stages (:mod:`._item`) change it only through its methods. Long because
an item's state, the booking of its time and every result built from it share one class's
slots (the response cache's claim and key joined them); what a strategy is to the path is in
:mod:`._binding`, what a call's answer gives back in :mod:`._account`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, TypeAlias, TypeVar, final

from .._values._categories import ErrorCategory
from .._values._errors import ItemDeadlineExceeded
from .._values._requests import LLMWorkItem
from .._values._results import ItemTiming, RetryState, TokenUsage, WorkItemResult, add_usage
from .._values._stop_reasons import StopReason

if TYPE_CHECKING:
    from .._admission import Admission
    from .._cache._flight import Claim
    from ._binding import Binding
    from ._classify import Classification

__all__ = ["THROTTLED_BY_429S", "CallUsage", "Failure", "ItemRun", "Retries", "Usage", "start_deadline"]

TOutput = TypeVar("TOutput")
Usage: TypeAlias = Mapping[str, int] | None
"""A call's token usage, checked (:func:`~._account.as_triple`): counts by ``TokenUsage`` key, or unknown."""
CallUsage: TypeAlias = tuple[dict[str, int], str | None, Callable[[TokenUsage], float] | None]
"""What a call in flight reported: its usage, its model, what prices it (its AttemptTiming record's)."""

_Phase = Literal["admission_wait", "execution", "backoff", "cooldown"]
THROTTLED_BY_429S: Final = "throttled by 429s"
"""What the error of a result a deadline (a stop) cut short while throttled says, with the seconds."""


@final
class Failure:
    """A failed attempt: its exception, how it is treated, and this item's own wait before a retry."""

    __slots__ = ("exc", "parse_stage", "verdict", "wait")

    def __init__(self, exc: Exception, verdict: Classification, wait: float = 0.0, *,
                 parse_stage: bool = False) -> None:
        self.exc = exc
        self.verdict = verdict
        self.parse_stage = parse_stage
        """The call answered but its answer did not parse: retried without backoff."""
        self.wait = wait
        """Non-zero for a 429 that said capacity remains (a blip): only this item waits, not its scope."""


@final
class Retries:
    """Per-item retry bookkeeping, made at the item's first failure."""

    __slots__ = ("failures", "rate_limited", "rng", "state")

    def __init__(self) -> None:
        self.failures = 0
        self.rate_limited = 0
        self.rng: random.Random | None = None
        self.state: RetryState | None = None


def _metadata(meta: object) -> dict[str, Any]:
    if meta is None:
        return {}
    if isinstance(meta, dict):
        return meta
    return {"strategy": meta}


@final
class ItemRun(Generic[TOutput]):
    """One item on its way: what the stages read and write, and where its time went.

    Time is booked by phase: the item is always in exactly one of the
    :class:`ItemTiming` buckets, and :meth:`switch` books the time since the last
    switch to the phase it leaves. So whatever cuts an item short (its deadline in a
    cooldown, a stop in a backoff), the buckets add up to ``total``. The phases:
    ``admission_wait`` from the start (hooks before the item, binding the strategy)
    and while waiting for a slot or a rate budget; ``cooldown`` while waiting out a
    cooldown; ``execution`` during a call; ``backoff`` from a failed call to the next
    admission (classifying it, its hooks, ``on_error()``, the backoff sleep).
    """

    __slots__ = (
        "added",
        "attempts",
        "backoff_owed",
        "binding",
        "cache_key",
        "call_usage",
        "calling",
        "claim",
        "failed",
        "gated",
        "held",
        "item",
        "item_deadline",
        "last_error",
        "limit",
        "limit_name",
        "mark",
        "outer",
        "phase",
        "refused_streak",
        "result",
        "retries",
        "start_limit",
        "started",
        "throttle_spent",
        "throttled",
        "throttled_since",
        "timing",
        "usage",
        "waiting",
    )

    def __init__(
        self,
        item: LLMWorkItem[TOutput],
        started: float,
        *,
        limit: float | None,
        limit_name: str,
        stop_deadline: float,
        start_by: float,
    ) -> None:
        self.item = item
        """The item as it runs (middlewares may have rewritten it)."""
        self.added = item
        """The item as it was added: what its checkpoint fingerprints."""
        self.started = self.mark = started
        self.phase: _Phase = "admission_wait"
        self.timing = ItemTiming()
        self.usage: dict[str, int] = {}
        self.attempts = 0
        self.limit = limit
        self.limit_name = limit_name
        """The setting (or the caller's timeout) that set ``item_deadline``, for its error."""
        self.item_deadline = started + limit if limit is not None else math.inf
        self.outer = min(self.item_deadline, stop_deadline)
        """When a call in flight is cut short at the latest (before its own deadline)."""
        self.start_limit = min(self.outer, start_by)
        """No call of this item starts at or after it."""
        self.binding: Binding | None = None
        self.held: Admission | None = None  # released exactly once; cut short -> release(None)
        self.gated: bool | None = None  # let go by its breaker (True: the probe); told its outcome once
        self.calling = False
        self.waiting = False  # parked for its next call (admission, the breaker, a backoff): a stop ends it
        self.call_usage: CallUsage | None = None  # the call's (usage, model, pricer): its record's
        self.failed: Failure | None = None  # an attempt that timed out, handled when driven again
        self.backoff_owed = 0.0  # seconds of backoff decided and not yet slept (ItemRunner.wait_out_backoff)
        self.retries: Retries | None = None
        self.last_error: BaseException | None = None
        self.result: WorkItemResult[TOutput] | None = None  # kept while its worker renews its scope
        self.throttled = 0.0  # seconds of throttled waits that ended at a call (._throttled)
        self.throttled_since: float | None = None  # when the throttled wait under way began
        self.throttle_spent = False  # its scope gave its admission wait up: max_rate_limit_wait ran out
        self.refused_streak: float | None = None  # ... at once, behind refusals longer than its bound
        self.cache_key: str | None = None  # the response-cache key it was looked up under (a miss: claimed)
        self.claim: Claim | None = None  # held from a miss to the item's end; settled exactly once (._cached)

    def switch(self, phase: _Phase, now: float) -> None:
        """Book the time since the last switch to the current phase, then enter ``phase``."""
        timing = self.timing
        setattr(timing, self.phase, getattr(timing, self.phase) + (now - self.mark))
        if self.phase == "execution":  # the call ended: its record, with the usage it reported (if any)
            used, self.call_usage = self.call_usage, None
            timing.close_attempt(self.attempts, *(used or ()))
        elif phase == "execution" and self.throttled_since is not None:  # a call ends a throttled wait
            self.throttled += max(0.0, now - self.throttled_since)
            self.throttled_since = None
        self.mark = now
        self.phase = phase

    def throttled_for(self, now: float) -> float:
        """Seconds this item has waited throttled by 429s so far (:mod:`._throttled`), this wait included."""
        total = self.throttled
        since = self.throttled_since
        if since is not None:
            return total + max(0.0, now - since)
        binding = self.binding
        if binding is not None and self.phase in ("admission_wait", "cooldown"):
            refusing = binding.quota.throttle.refusing_since
            if refusing is not None:
                total += max(0.0, now - max(refusing, self.mark))
        return total

    # --- its own changes (the stages call these; nobody else sets its fields) -------------

    def use(self, item: LLMWorkItem[TOutput]) -> None:
        """Run ``item`` from now on: the item as its middlewares rewrote it (``added`` stays)."""
        self.item = item

    def bind(self, binding: Binding) -> int:
        """Run with ``binding`` (its strategy's); the tokens its request is admitted with."""
        self.binding = binding
        return binding.tokens(self.item.prompt, self.item.params)

    def looked_up(self, key: str, claim: Claim | None) -> None:
        """The response cache was asked under ``key``; a miss holds ``claim`` until the item ends."""
        self.cache_key = key
        self.claim = claim

    def take_claim(self) -> Claim | None:
        """Its claim (``None``: none held), given up to the caller, who settles it exactly once."""
        claim, self.claim = self.claim, None
        return claim

    def gate_passed(self, gated: bool | None) -> None:
        """Its breaker let its next attempt go (``True``: as the probe); ``None``: it must wait."""
        self.gated = gated

    def park(self) -> None:
        """It waits for its next call (admission, the breaker, a backoff): a stop may end the wait."""
        self.waiting = True

    def unpark(self) -> None:
        self.waiting = False

    def start_call(self, held: Admission, now: float) -> None:
        """Admitted with ``held``: its next attempt's call starts now."""
        self.held = held
        self.attempts += 1
        self.switch("execution", now)
        self.calling = True

    def call_answered(self, usage: Usage, meta: object, pricer: Callable[[TokenUsage], float] | None
                      ) -> bool | None:
        """Its call answered: what it used is the item's (and the attempt record's, priced by ``pricer``),
        and its admission is going back: as :meth:`released`, whose result it returns."""
        self.calling = False
        if usage:
            add_usage(self.usage, usage)
            if isinstance(usage, Mapping):  # as _call_used(), inline: once per call on the hot path
                model = meta.get("model") if isinstance(meta, Mapping) else None
                if not isinstance(model, str) and self.binding is not None:
                    model = self.binding.strategy.model_name
                self.call_usage = (dict(usage), model, pricer)
        gated, self.gated, self.held = self.gated, None, None
        return gated

    def call_failed(self, usage: Usage, pricer: Callable[[TokenUsage], float] | None, now: float) -> None:
        """Its call raised, having used ``usage`` (a failed but billed call): its backoff starts now."""
        self.calling = False
        if usage:  # a failed but billed call: its record carries what it used
            self._call_used(usage, None, pricer)
        self.switch("backoff", now)
        add_usage(self.usage, usage)

    def _call_used(self, usage: Usage, meta: object, pricer: Callable[[TokenUsage], float] | None) -> None:
        # The AttemptTiming record carries a copy, priced when read by the config's cost_function
        # (``pricer``), else by ``meta``'s model (else the strategy's).
        if isinstance(usage, Mapping):
            model = meta.get("model") if isinstance(meta, Mapping) else None
            if not isinstance(model, str) and self.binding is not None:
                model = self.binding.strategy.model_name
            self.call_usage = (dict(usage), model, pricer)

    def parse_failed(self, now: float) -> None:
        """Its call answered but the answer did not parse: the call ended now, as a raising call's."""
        self.switch("backoff", now)

    def released(self) -> bool | None:
        """Its admission is going back: no longer held. Returns what its breaker let go (``None``: nothing),
        for the caller to tell the breaker that attempt's outcome, once."""
        gated, self.gated, self.held = self.gated, None, None
        return gated

    def timed_out(self, failure: Failure, now: float) -> None:
        """Its call in flight hit the attempt's deadline: a failed attempt, handled when driven again."""
        self.calling = False
        self.switch("backoff", now)
        self.failed = failure

    def take_failure(self) -> Failure | None:
        """The attempt that timed out (:meth:`timed_out`), handed over once."""
        failed, self.failed = self.failed, None
        return failed

    def note_error(self, exc: BaseException) -> Retries:
        """A failed attempt's error, the item's last; its retry bookkeeping (made at the first failure)."""
        self.last_error = exc
        retries = self.retries
        if retries is None:
            retries = self.retries = Retries()
        return retries

    def owe_backoff(self, seconds: float) -> None:
        """Seconds of backoff decided and not yet slept: a cancellation leaves the rest owed."""
        self.backoff_owed = seconds

    def throttled_from(self, since: float) -> None:
        """A throttled wait began at ``since`` (a 429 of its own, or its scope refusing every call)."""
        self.throttled_since = since

    def throttle_given_up(self, streak: float | None) -> None:
        """Its scope gave its admission wait up: ``max_rate_limit_wait`` ran out (``streak``: at once,
        behind refusals longer than its bound)."""
        self.throttle_spent = True
        self.refused_streak = streak

    def keep(self, result: WorkItemResult[TOutput]) -> None:
        """Its result, kept while its worker renews its scope."""
        self.result = result

    def _throttled_note(self, now: float) -> str:
        throttled = self.throttled_for(now)
        return f" after {throttled:.1f} s {THROTTLED_BY_429S}" if throttled > 0 else ""

    def settle(self, now: float) -> ItemTiming:
        """Book the time up to ``now`` and set ``total``: the item's timing, final."""
        self.switch(self.phase, now)
        self.timing.total = now - self.started
        return self.timing

    # --- its result ----------------------------------------------------------------

    def succeeded(self, output: TOutput, meta: object, now: float) -> WorkItemResult[TOutput]:
        item = self.item
        return WorkItemResult(
            item_id=item.item_id,
            success=True,
            output=output,
            attempts=self.attempts,
            token_usage=self.usage,
            timing=self.settle(now),
            context=item.context,
            metadata=_metadata(meta),
            cache_key=self.cache_key,
        )

    def failed_with(self, exc: BaseException, category: ErrorCategory, now: float) -> WorkItemResult[TOutput]:
        return self._failure(f"{type(exc).__name__}: {exc}", category, now, exc)

    def _failure(self, error: str, category: ErrorCategory, now: float, exc: BaseException | None = None
                 ) -> WorkItemResult[TOutput]:
        return WorkItemResult(
            item_id=self.item.item_id,
            success=False,
            error=error,
            exception=exc,
            error_category=category,
            attempts=self.attempts,
            token_usage=self.usage,
            timing=self.settle(now),
            context=self.item.context,
            cache_key=self.cache_key,
        )

    def deadline_exceeded(self, reason: str, now: float) -> WorkItemResult[TOutput]:
        """The item's own deadline (or the caller's timeout) came; the last failure is the context."""
        exc = ItemDeadlineExceeded(f"item {self.item.item_id!r}: {reason}{self._throttled_note(now)}")
        if self.last_error is not None:
            exc.__context__ = self.last_error
        result = self.failed_with(exc, ErrorCategory.DEADLINE, now)
        result.stop_reason = StopReason.ITEM_DEADLINE
        return result

    def refused_start(self, now: float) -> WorkItemResult[TOutput]:
        """No call starts at or after ``call_start_deadline``: never started, or cut short before a retry."""
        if self.attempts == 0:
            reason = "not executed: call_start_deadline reached"
            result = self.stopped(ErrorCategory.NOT_EXECUTED, reason, now)
        else:
            reason = "cut short: call_start_deadline reached before a retry"
            result = self.stopped(ErrorCategory.ABORTED, reason, now)
        result.stop_reason = StopReason.ITEM_DEADLINE
        return result

    def stopped(self, category: ErrorCategory, reason: str, now: float) -> WorkItemResult[TOutput]:
        """A result for an item the batch stopped in flight (or refused to start).

        A deadline carries an :class:`ItemDeadlineExceeded`; an abort, a spent budget or
        a refused start carries no exception (none happened), only ``error`` saying why.
        """
        reason += self._throttled_note(now)  # a deadline (a stop) that cut a throttled wait says so
        if category is ErrorCategory.DEADLINE:
            exc = ItemDeadlineExceeded(f"item {self.item.item_id!r}: {reason}")
            return self.failed_with(exc, category, now)
        return self._failure(reason, category, now)


def start_deadline(value: float | None) -> float:
    """Check a ``call_start_deadline``: a time on ``anyio.current_time()``'s clock, or ``None``."""
    if value is None:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        from .._values._errors import ConfigurationError

        raise ConfigurationError("call_start_deadline", value, "must be a time of anyio.current_time()")
    return float(value)
