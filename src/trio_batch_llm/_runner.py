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
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

import anyio

from ._classify import Classification, classify
from ._errors import ErrorCategory, ItemDeadlineExceeded
from ._results import ItemTiming, LLMWorkItem, RetryState, WorkItemResult, add_usage, usage_total

if TYPE_CHECKING:
    from ._admission import Admission, QuotaScope
    from ._config import ProcessorConfig
    from ._host import ExecutorHost
    from ._observers import Hooks

__all__ = ["AttemptTimedOut", "ItemRunner", "ItemTally", "UserClassifier"]

TOutput = TypeVar("TOutput")
UserClassifier = Callable[[Exception], Any]

_NO_METADATA: Final[dict[str, Any]] = {}


class AttemptTimedOut(TimeoutError):
    """An attempt ran past ``attempt_timeout``; classified TIMEOUT and retried."""


class ItemTally:
    """What is known about an item so far; read when it is cut short from outside."""

    __slots__ = ("attempts", "last_category", "last_error", "started", "timing", "usage")

    def __init__(self, started: float) -> None:
        self.attempts = 0
        self.usage: dict[str, int] = {}
        self.timing = ItemTiming()
        self.started = started
        self.last_error: BaseException | None = None
        self.last_category: ErrorCategory | None = None


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
        timeout_reason: str = "item deadline",
    ) -> WorkItemResult[TOutput]:
        """Run ``item`` to its one result. Cancellation from outside propagates untouched.

        ``timeout`` (seconds) overrides ``total_timeout_per_item`` for this item.
        """
        if tally is None:
            tally = ItemTally(self._clock())
        limit = timeout if timeout is not None else self._item_timeout
        if limit is None:
            return await self._attempts(item, tally, math.inf, limit)
        deadline = tally.started + limit
        with anyio.CancelScope(deadline=deadline) as item_scope:
            return await self._attempts(item, tally, deadline, limit)
        # Only reached when the item's own deadline cancelled it.
        assert item_scope.cancelled_caught
        return self.deadline_result(item, tally, reason=f"{timeout_reason} of {limit} s")

    async def _attempts(
        self, item: LLMWorkItem[TOutput], tally: ItemTally, deadline: float, limit: float | None
    ) -> WorkItemResult[TOutput]:
        strategy = item.strategy
        host = self._host
        clock = self._clock
        await host.ensure_prepared(strategy)
        scope = host.quota_scope(strategy)
        tokens = self._config.estimate_tokens(item.prompt) if self._needs_tokens else 0
        timeout = self._attempt_timeout
        timing = tally.timing
        state: RetryState | None = None
        rng: random.Random | None = None
        failures = 0
        rate_limited = 0
        while True:
            tally.attempts += 1
            attempt = tally.attempts
            admission = await self._admit(scope, tokens, timing)
            started = clock()
            try:
                if timeout is None:
                    output, usage, meta = await strategy.execute(item.prompt, attempt, None, state)
                else:
                    with anyio.CancelScope(deadline=started + timeout) as attempt_scope:
                        output, usage, meta = await strategy.execute(item.prompt, attempt, timeout, state)
                    if attempt_scope.cancelled_caught:
                        raise AttemptTimedOut(f"attempt {attempt} timed out after {timeout} s")
            except Exception as exc:  # noqa: BLE001 - the one classification boundary
                timing.execution += clock() - started
                failed_usage = getattr(exc, "token_usage", None)
                add_usage(tally.usage, failed_usage)
                verdict = self._classify(exc, strategy)
                tally.last_error = exc
                tally.last_category = verdict.category
                if self._hooks is not None:
                    await self._hooks.on_attempt_error(item, exc, attempt, verdict.category)
                if verdict.category is ErrorCategory.RATE_LIMIT:
                    # Cooldown first, then the slot: no waiter slips in ahead of the cooldown.
                    admission.release_rate_limited(verdict.retry_after, usage_total(failed_usage))
                    rate_limited += 1
                    retry = rate_limited <= self._retry.max_rate_limit_retries
                    wait = 0.0  # the scope's cooldown holds this worker and every other one
                else:
                    admission.release(usage_total(failed_usage))
                    failures += 1
                    retry = verdict.category.retryable and failures < self._retry.max_attempts
                    wait = 0.0
                    if retry:
                        if rng is None:
                            rng = self._rng(item)
                        wait = self._retry.wait_before_retry(failures - 1, verdict.retry_after, rng)
                if not retry:
                    return self.failure_result(item, tally, exc, verdict.category)
                if clock() + wait >= deadline:
                    return self.deadline_result(
                        item,
                        tally,
                        reason=f"deadline of {limit} s leaves no room for a retry after {wait:.3g} s",
                    )
                if state is None:
                    state = RetryState()
                state.attempt = attempt
                state.last_error = exc
                state.last_category = verdict.category
                await strategy.on_error(exc, attempt, state)
                if wait > 0:
                    await anyio.sleep(wait)
                    timing.backoff += wait
                continue
            except BaseException:
                admission.release(None)  # cut short: real usage unknown, the reservation stands
                raise
            elapsed = clock() - started
            timing.execution += elapsed
            if usage:
                add_usage(tally.usage, usage)
            admission.release(usage_total(usage))
            timing.total = clock() - tally.started
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

    async def _admit(self, scope: QuotaScope, tokens: int, timing: ItemTiming) -> Admission:
        try:
            return scope.try_admit_nowait(tokens)  # noqa: ASYNC910 - hot path; execute() checkpoints
        except anyio.WouldBlock:
            pass
        clock = self._clock
        began = clock()
        cooling = scope.statistics().cooldown_remaining > 0
        admission = await scope.admit(tokens)
        waited = clock() - began
        if cooling:
            timing.cooldown += waited
        else:
            timing.admission_wait += waited
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
        tally.timing.total = self._clock() - tally.started
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
        tally.timing.total = self._clock() - tally.started
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
