"""The retry rule: a failed attempt becomes the item's result, or the seconds to wait before its next one.

Separate budgets for rate limits (``max_rate_limit_retries``) and for other failures
(``max_attempts``); full jitter with Retry-After winning when larger
(:meth:`RetryConfig.wait_before_retry`); a parse failure is retried at once; a 429 past
``max_rate_limit_wait`` fails (:mod:`._throttled`); no retry that could not start before the
item's deadline or the call-start deadline. No awaits: the runner (:mod:`._item`) sleeps the wait.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from .._values._categories import ErrorCategory
from ._throttled import over_budget

if TYPE_CHECKING:
    from .._values._config import RetryConfig
    from .._values._results import WorkItemResult
    from ._item_run import Failure, ItemRun, Retries

__all__ = ["retry_or_result"]

TOutput = TypeVar("TOutput")


def retry_or_result(
    run: ItemRun[TOutput], retries: Retries, failure: Failure, config: RetryConfig, *, start_by: float,
    clock: Callable[[], float],
) -> WorkItemResult[TOutput] | float:
    """``failure`` (``run``'s latest, counted in ``retries``) -> the item's result, or the seconds to wait
    before its next attempt. A failure that stops the batch is the runner's, decided before this."""
    exc, verdict = failure.exc, failure.verdict
    category = verdict.category
    wait = 0.0
    if category is ErrorCategory.RATE_LIMIT:
        retries.rate_limited += 1
        retry = retries.rate_limited <= config.max_rate_limit_retries
        wait = failure.wait  # 0 but for a blip: the scope's cooldown (if any) holds everyone
    else:
        retries.failures += 1
        retry = category.retryable and retries.failures < config.max_attempts
        if retry:
            if retries.rng is None:
                retries.rng = _jitter_rng(config.jitter_seed, run.item.item_id)
            wait = 0.0 if failure.parse_stage else config.wait_before_retry(
                retries.failures - 1, verdict.retry_after, retries.rng)
    now = clock()
    if not retry or (over := over_budget(run, category, wait, config, now)) is not None:
        return run.failed_with(exc, category, now) if not retry or over is None else over
    if now + wait >= run.item_deadline:
        reason = f"{run.limit_name} of {run.limit} s leaves no room for a retry after {wait:.3g} s"
        return run.deadline_exceeded(reason, now)
    if now + wait >= start_by:
        return run.refused_start(now)
    return float(wait)  # a whole-number wait (initial_wait=0, retry_after=1) is still a wait


def _jitter_rng(seed: object, item_id: str) -> random.Random:
    # Seeded per item, so a seeded run's backoffs do not depend on the
    # order in which items happen to fail.
    if seed is None:
        return random.Random()
    return random.Random(f"{seed}\x00{item_id}")
