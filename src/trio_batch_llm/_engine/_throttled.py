"""An item's time throttled by 429s: its bound, ``RetryConfig.max_rate_limit_wait``, and the result past it.

Throttled time (:meth:`ItemRun.throttled_for`) runs from a 429 of the item's own to
its next call's start (its scope's cooldown, its pacing, a blip's wait, its backoff),
and through an admission wait while its scope refuses every call (from the later of
the wait's start and the refusals' start). Past the bound the item fails ``RATE_LIMIT``
with the time and the 429s in its error. The bound is kept in three places: the 429's
decision (:func:`over_budget`, which also fails an item at once whose scope's cooldown
would outlast it), the admission wait (the scope gives the waiter up,
:class:`~.._admission._throttle.ThrottleBudgetSpent`: :func:`admit_within_budget`), and
nowhere else, since a backoff is decided (and bounded) before it is slept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._admission._throttle import ThrottleBudget, ThrottleBudgetSpent
from .._values._categories import ErrorCategory
from .._values._results import WorkItemResult
from ._item_run import ItemRun

if TYPE_CHECKING:
    from .._admission import Admission, QuotaScope
    from .._values._config import RetryConfig

__all__ = ["admit_within_budget", "over_budget", "rate_limit_wait_over", "spent"]


async def admit_within_budget(scope: QuotaScope, run: ItemRun[Any], tokens: int, config: RetryConfig
                              ) -> Admission | None:
    """``scope.admit(tokens)`` bounded by what ``run`` may still wait throttled; ``None`` past it
    (``run.throttle_spent`` says so). A wait while the scope refused starts the run's throttled time."""
    limit = config.max_rate_limit_wait
    budget = None if limit is None else ThrottleBudget(max(0.0, limit - run.throttled), run.throttled_since)
    try:
        admission = await scope.admit(tokens, throttle=budget)
    except ThrottleBudgetSpent as spent_:
        run.throttle_given_up(spent_.streak)
        return None  # noqa: ASYNC910 - admit() checkpointed before it gave up
    if run.throttled_since is None and (refusing := scope.throttle.refusing_since) is not None:
        run.throttled_from(max(refusing, run.mark))
    return admission


def over_budget(run: ItemRun[Any], category: ErrorCategory, wait: float, config: RetryConfig, now: float
                ) -> WorkItemResult[Any] | None:
    """After a failure of ``category`` to be retried in ``wait`` s: for a 429, the item's result if that
    passes ``max_rate_limit_wait``; else ``None``."""
    limit = config.max_rate_limit_wait
    if limit is None or category is not ErrorCategory.RATE_LIMIT:
        return None
    if run.throttled_since is None:
        run.throttled_from(now)  # throttled from its 429 to its next call
    assert run.binding is not None
    ahead = max(wait, run.binding.quota.statistics().cooldown_remaining)
    if run.throttled_for(now) + ahead >= limit:
        return rate_limit_wait_over(run, limit, now, ahead if ahead > wait else 0.0)
    return None


def spent(run: ItemRun[Any], config: RetryConfig, now: float) -> WorkItemResult[Any]:
    """The result of ``run``, whose scope gave its admission wait up (``run.throttle_spent``)."""
    return rate_limit_wait_over(run, config.max_rate_limit_wait or 0.0, now, streak=run.refused_streak)


def rate_limit_wait_over(run: ItemRun[Any], limit: float, now: float, ahead: float = 0.0, *,
                         streak: float | None = None) -> WorkItemResult[Any]:
    """``max_rate_limit_wait`` ran out (or the cooldown ``ahead`` would pass it): ``RATE_LIMIT``.

    ``streak``: the item gave up at once, behind a scope that had refused every call for that
    long already. Its exception is the item's last 429 (``None`` when it never got a call in)."""
    retries = run.retries
    refused = 0 if retries is None else retries.rate_limited
    waited = run.throttled_for(now)
    if streak is not None and not refused:
        text = f"rate limited: not tried: its scope has refused every call for {streak:.1f} s"
    elif refused:
        text = f"rate limited: waited {waited:.1f} s on 429s ({refused} 429s)"
    else:
        text = f"rate limited: waited {waited:.1f} s for admission while its scope refused every call"
    text += f", max_rate_limit_wait={limit:g} s"
    if ahead > 0:
        text += f"; the scope's cooldown has {ahead:.3g} s to run"
    last = run.last_error
    if last is not None:
        text += f"; last error: {type(last).__name__}: {last}"
    return WorkItemResult(
        item_id=run.item.item_id,
        success=False,
        error=text,
        exception=last if isinstance(last, Exception) else None,
        error_category=ErrorCategory.RATE_LIMIT,
        attempts=run.attempts,
        token_usage=run.usage,
        timing=run.settle(now),
        context=run.item.context,
    )
