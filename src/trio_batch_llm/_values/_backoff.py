"""Retry backoff arithmetic: exponential growth to a ceiling, full jitter, and the provider's Retry-After.

Pure functions of plain numbers; :class:`~trio_batch_llm.RetryConfig`'s
``backoff_ceiling``, ``backoff`` and ``wait_before_retry`` delegate here with
their settings.

Full jitter (a wait drawn from ``uniform(0, ceiling)``) rather than a fixed
wait: workers that failed together (one 5xx storm) would otherwise retry
together and meet the same storm again.
"""

from __future__ import annotations

import random

__all__ = ["at_least", "ceiling", "jittered"]


def ceiling(retry_number: int, *, initial_wait: float, exponential_base: float, max_wait: float) -> float:
    """The largest wait before retry ``retry_number`` (0 for the first retry):
    ``initial_wait * exponential_base ** retry_number``, capped at ``max_wait``."""
    try:
        raw = initial_wait * exponential_base**retry_number
    except OverflowError:  # a float power past 1e308 raises instead of giving inf: the cap it is
        return max_wait
    return min(max_wait, raw)


def jittered(top: float, *, jitter: bool, rng: random.Random | None) -> float:
    """``uniform(0, top)`` with ``jitter`` (from ``rng``, else the module's generator), else ``top``."""
    if not jitter:
        return top
    return (rng or random).uniform(0.0, top)


def at_least(wait: float, retry_after: float | None) -> float:
    """``wait``, raised to the provider's ``retry_after`` when that is larger."""
    if retry_after is not None and retry_after > wait:
        return retry_after
    return wait
