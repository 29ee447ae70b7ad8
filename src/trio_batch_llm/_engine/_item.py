"""One item's path: admit → attempt → classify → retry → account.

Shared by the processor's workers and the pool's callers. Each stage is a
small piece of :meth:`ItemRunner.run`; the hot path (admitted at once, first
attempt succeeds) allocates one tally and one result and checkpoints only
inside the strategy call.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, TypeVar

import anyio
import anyio.lowlevel

from .._values._categories import ErrorCategory
from .._values._errors import ItemDeadlineExceeded
from .._values._requests import LLMWorkItem
from .._values._results import ItemTiming, RetryState, WorkItemResult, add_usage, usage_total
from ._classify import Classification, classify

if TYPE_CHECKING:
    from .._admission import Admission, QuotaScope
    from .._core._host import ExecutorHost
    from .._observe._hooks import Hooks
    from .._values._config import ProcessorConfig

__all__ = ["AttemptTimedOut", "ItemRunner", "ItemStop", "ItemTally", "UserClassifier"]

TOutput = TypeVar("TOutput")
UserClassifier = Callable[[Exception], Any]

_NO_METADATA: Final[dict[str, Any]] = {}

_Phase = Literal["admission_wait", "execution", "backoff", "cooldown"]

_ITEM_DEADLINE: Final = "total_timeout_per_item"
"""What an item's deadline is called in its error: the setting that set it."""


class AttemptTimedOut(TimeoutError):
    """An attempt ran past ``attempt_timeout``; classified TIMEOUT and retried."""


class ItemTally:
    """What is known about an item so far; read when it is cut short from outside.

    Time is booked by phase: the item is always in exactly one of the
    :class:`ItemTiming` buckets, and :meth:`switch` books the time since the
    last switch to the phase it leaves. So whatever cuts an item short (its
    deadline in a cooldown, a stop in a backoff), the buckets add up to
    ``total``. The phases: ``admission_wait`` from the start (hooks before
    the item, preparing the strategy) and while waiting for a slot or a rate
    budget; ``cooldown`` while waiting out a cooldown; ``execution`` during a
    call; ``backoff`` from a failed call to the next admission (classifying
    it, its hooks, ``on_error()``, the backoff sleep).
    """

    __slots__ = ("attempts", "last_category", "last_error", "mark", "phase", "started", "timing", "usage")

    def __init__(self, started: float) -> None:
        self.attempts = 0
        self.usage: dict[str, int] = {}
        self.timing = ItemTiming()
        self.started = started
        self.mark = started
        self.phase: _Phase = "admission_wait"
        self.last_error: BaseException | None = None
        self.last_category: ErrorCategory | None = None

    def switch(self, phase: _Phase, now: float) -> None:
        """Book the time since the last switch to the current phase, then enter ``phase``."""
        timing = self.timing
        setattr(timing, self.phase, getattr(timing, self.phase) + (now - self.mark))
        self.mark = now
        self.phase = phase

    def settle(self, now: float) -> ItemTiming:
        """Book the time up to ``now`` and set ``total``: the item's timing, final."""
        self.switch(self.phase, now)
        self.timing.total = now - self.started
        return self.timing


class ItemStop:
    """What may cut an item short from outside: a deadline, and an explicit :meth:`cancel`.

    One per worker. The runner points ``scope`` at the running attempt's scope,
    so a stop cancels one scope per item in flight.
    """

    __slots__ = ("cancelled", "deadline", "reason", "scope")

    def __init__(self, deadline: float = math.inf) -> None:
        self.deadline = deadline
        self.cancelled = False
        self.reason: str | None = None
        self.scope: anyio.CancelScope | None = None

    def cancel(self, reason: str) -> None:
        if self.cancelled:
            return
        self.cancelled = True
        self.reason = reason
        if self.scope is not None:
            self.scope.cancel(reason)


class _Unscoped:
    """Stands in for a cancel scope where nothing can cut an attempt short."""

    __slots__ = ()
    cancelled_caught: bool = False

    def __enter__(self) -> _Unscoped:
        return self

    def __exit__(self, *exc_info: object) -> bool:
        return self.cancelled_caught  # never: nothing to catch


_UNSCOPED: Final = _Unscoped()


def _timed_out(attempt: int, timeout: float | None) -> AttemptTimedOut:
    return AttemptTimedOut(f"attempt {attempt} timed out after {timeout} s")


def _metadata(meta: Any) -> dict[str, Any]:
    if meta is None:
        return {}
    if isinstance(meta, dict):
        return meta
    return {"strategy": meta}


class ItemRunner(Generic[TOutput]):
    """Runs items with one host's quotas, leases, config and classifier."""

    __slots__ = (
        "_attempt_timeout",
        "_classifier",
        "_clock",
        "_config",
        "_hooks",
        "_host",
        "_item_timeout",
        "_needs_tokens",
        "_retry",
    )

    def __init__(
        self,
        host: ExecutorHost,
        config: ProcessorConfig,
        *,
        classifier: UserClassifier | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        self._hooks = hooks if hooks is not None and hooks.active else None
        self._host = host
        self._config = config
        self._retry = config.retry
        self._classifier = classifier
        self._attempt_timeout = config.attempt_timeout
        self._item_timeout = config.guardrails.total_timeout_per_item
        self._needs_tokens = config.max_tokens_per_minute is not None
        self._clock = anyio.current_time

    async def run(
        self,
        item: LLMWorkItem[TOutput],
        tally: ItemTally | None = None,
        *,
        timeout: float | None = None,
        timeout_reason: str = _ITEM_DEADLINE,
    ) -> WorkItemResult[TOutput]:
        """Run ``item`` to its one result. Cancellation from outside propagates untouched.

        ``timeout`` (seconds) overrides ``total_timeout_per_item`` for this item;
        ``timeout_reason`` names it in the result's error (only when ``timeout`` is given).
        """
        result = await self.execute_item(
            item, tally if tally is not None else ItemTally(self._clock()), None,
            timeout=timeout, timeout_reason=timeout_reason,
        )
        assert result is not None, "only a stop cuts an item short without a result"
        return result

    async def execute_item(
        self,
        item: LLMWorkItem[TOutput],
        tally: ItemTally,
        stop: ItemStop | None,
        *,
        timeout: float | None = None,
        timeout_reason: str = _ITEM_DEADLINE,
    ) -> WorkItemResult[TOutput] | None:
        """Run ``item``; ``None`` when ``stop`` cut it short (the caller builds that result).

        Cancel scopes: at most one per attempt. When an item deadline or a stop
        applies, one scope per attempt covers the whole attempt (the previous
        attempt's failure handling and backoff, admission, the call) with the
        earliest of the item deadline, the stop's deadline and, during the call,
        the attempt deadline; the stop cancels it. Otherwise only the call runs
        under a scope, and only when ``attempt_timeout`` is set. Which deadline
        fired is read off the clock, in the precedence nested scopes had (the
        outermost cancelled scope catches): the stop, then the item deadline,
        then the attempt's own.
        """
        limit = timeout if timeout is not None else self._item_timeout
        if timeout is None:
            timeout_reason = _ITEM_DEADLINE  # no deadline of the caller's: any deadline is this setting's
        item_deadline = tally.started + limit if limit is not None else math.inf
        outer = item_deadline if stop is None else min(item_deadline, stop.deadline)
        bounded = stop is not None or outer != math.inf
        attempt_timeout = self._attempt_timeout
        strategy = item.strategy
        host = self._host
        hooks = self._hooks
        clock = self._clock
        quota: QuotaScope | None = None
        tokens = 0
        state: RetryState | None = None
        rng: random.Random | None = None
        failures = 0
        rate_limited = 0
        attempt = 0
        started = 0.0
        # The previous attempt's failure and its token usage: handled at the top of the next
        # iteration, under that attempt's scope, so the item deadline and the stop bound the
        # hooks, on_error() and the backoff too.
        failed: tuple[Exception, Any] | None = None
        held: Admission | None = None  # released exactly once; cut short -> release(None)
        try:
            while True:
                scope: anyio.CancelScope | None = None
                if bounded:
                    scope = anyio.CancelScope(deadline=outer)
                    if stop is not None:
                        stop.scope = scope
                        if stop.cancelled:
                            scope.cancel(stop.reason)
                with scope or _UNSCOPED:
                    if failed is not None:
                        exc, failed_usage = failed
                        failed = None
                        verdict = self._classify(exc, strategy)
                        tally.last_error = exc
                        tally.last_category = verdict.category
                        if hooks is not None:
                            await hooks.on_attempt_error(item, exc, attempt, verdict.category)
                        assert held is not None
                        if verdict.category is ErrorCategory.RATE_LIMIT:
                            # Cooldown first, then the slot: no waiter slips in ahead of the cooldown.
                            held.release_rate_limited(verdict.retry_after, usage_total(failed_usage))
                            held = None
                            rate_limited += 1
                            retry = rate_limited <= self._retry.max_rate_limit_retries
                            wait = 0.0  # the scope's cooldown holds this worker and every other one
                        else:
                            held.release(usage_total(failed_usage))
                            held = None
                            failures += 1
                            retry = verdict.category.retryable and failures < self._retry.max_attempts
                            wait = 0.0
                            if retry:
                                if rng is None:
                                    rng = self._rng(item)
                                wait = self._retry.wait_before_retry(failures - 1, verdict.retry_after, rng)
                        # (No checkpoint needed: the failed attempt's execute() was one.)
                        if not retry:
                            return self.failure_result(item, tally, exc, verdict.category)  # noqa: ASYNC910
                        if clock() + wait >= item_deadline:
                            return self.deadline_result(  # noqa: ASYNC910
                                item,
                                tally,
                                reason=f"{timeout_reason} of {limit} s leaves no room for a retry"
                                f" after {wait:.3g} s",
                            )
                        if state is None:
                            state = RetryState()
                        state.attempt = attempt
                        state.last_error = exc
                        state.last_category = verdict.category
                        await strategy.on_error(exc, attempt, state)
                        if wait > 0:
                            await anyio.sleep(wait)
                    if quota is None:
                        await host.ensure_prepared(strategy)
                        quota = host.quota_scope(strategy)
                        tokens = self._config.estimate_tokens(item.prompt) if self._needs_tokens else 0
                    tally.attempts += 1
                    attempt = tally.attempts
                    held = await self._admit(quota, tokens, tally)
                    started = clock()
                    tally.switch("execution", started)
                    attempt_scope: anyio.CancelScope | _Unscoped = _UNSCOPED
                    if attempt_timeout is not None:
                        if scope is None:
                            attempt_scope = anyio.CancelScope(deadline=started + attempt_timeout)
                        elif started + attempt_timeout < outer:
                            scope.deadline = started + attempt_timeout
                    try:
                        with attempt_scope:
                            output, usage, meta = await strategy.execute(
                                item.prompt, attempt, attempt_timeout, state
                            )
                    except Exception as exc:  # noqa: BLE001 - the one classification boundary
                        tally.switch("backoff", clock())
                        failed_usage = getattr(exc, "token_usage", None)
                        add_usage(tally.usage, failed_usage)
                        failed = (exc, failed_usage)
                        continue
                    if attempt_scope.cancelled_caught:
                        tally.switch("backoff", clock())
                        failed = (_timed_out(attempt, attempt_timeout), None)
                        continue
                    timing = tally.settle(clock())
                    if usage:
                        add_usage(tally.usage, usage)
                    held.release(usage_total(usage))
                    held = None
                    return WorkItemResult(
                        item_id=item.item_id,
                        success=True,
                        output=output,
                        attempts=attempt,
                        token_usage=tally.usage,
                        timing=timing,
                        context=item.context,
                        metadata=_metadata(meta),
                    )
                # Only reached when this attempt's scope caught its own cancellation.
                now = clock()
                if stop is not None and (stop.cancelled or now >= stop.deadline):
                    return None
                if now >= item_deadline:
                    return self.deadline_result(item, tally, reason=f"{timeout_reason} of {limit} s")
                tally.switch("backoff", now)
                failed = (_timed_out(attempt, attempt_timeout), None)
        finally:
            if held is not None:
                held.release(None)  # cut short: real usage unknown, the reservation stands
            if stop is not None:
                stop.scope = None

    async def _admit(self, scope: QuotaScope, tokens: int, tally: ItemTally) -> Admission:
        try:
            return scope.try_admit_nowait(tokens)  # noqa: ASYNC910 - hot path; execute() checkpoints
        except anyio.WouldBlock:
            pass
        # Booked by phase, so a wait cut short (by the item deadline, a stop) is counted too.
        cooling = scope.statistics().cooldown_remaining > 0
        tally.switch("cooldown" if cooling else "admission_wait", self._clock())
        admission = await scope.admit(tokens)
        try:
            # Granted while this worker was being cancelled: the provider never sees the call,
            # so its RPM unit must come back now, not a window after a call that never was.
            await anyio.lowlevel.checkpoint_if_cancelled()
        except BaseException:
            admission.release_unused()
            raise
        return admission

    def _classify(self, exc: Exception, strategy: Any) -> Classification:
        return classify(exc, strategy_classifier=strategy.classify_error, user_classifier=self._classifier)

    def _rng(self, item: LLMWorkItem[TOutput]) -> random.Random:
        # Seeded per item, so a seeded run's backoffs do not depend on the
        # order in which items happen to fail.
        seed = self._retry.jitter_seed
        if seed is None:
            return random.Random()
        return random.Random(f"{seed}\x00{item.item_id}")

    def failure_result(
        self,
        item: LLMWorkItem[TOutput],
        tally: ItemTally,
        exc: BaseException,
        category: ErrorCategory,
    ) -> WorkItemResult[TOutput]:
        tally.settle(self._clock())
        return WorkItemResult(
            item_id=item.item_id,
            success=False,
            error=f"{type(exc).__name__}: {exc}",
            exception=exc,
            error_category=category,
            attempts=tally.attempts,
            token_usage=tally.usage,
            timing=tally.timing,
            context=item.context,
        )

    def deadline_result(
        self, item: LLMWorkItem[TOutput], tally: ItemTally, *, reason: str
    ) -> WorkItemResult[TOutput]:
        exc = ItemDeadlineExceeded(f"item {item.item_id!r}: {reason}")
        if tally.last_error is not None:
            exc.__context__ = tally.last_error
        return self.failure_result(item, tally, exc, ErrorCategory.DEADLINE)

    def stopped_result(
        self, item: LLMWorkItem[TOutput], tally: ItemTally | None, *, category: ErrorCategory, reason: str
    ) -> WorkItemResult[TOutput]:
        """A result for an item the batch stopped: cut short in flight, or never started.

        A deadline carries an :class:`ItemDeadlineExceeded`; an abort, a spent
        budget or an item that never ran carries no exception (none happened),
        only ``error`` saying why.
        """
        if tally is None:
            tally = ItemTally(self._clock())
        if category is ErrorCategory.DEADLINE:
            return self.failure_result(
                item, tally, ItemDeadlineExceeded(f"item {item.item_id!r}: {reason}"), category
            )
        tally.settle(self._clock())
        return WorkItemResult(
            item_id=item.item_id,
            success=False,
            error=reason,
            error_category=category,
            attempts=tally.attempts,
            token_usage=tally.usage,
            timing=tally.timing,
            context=item.context,
        )
