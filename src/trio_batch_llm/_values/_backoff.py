"""Retry backoff arithmetic: exponential growth to a ceiling, full jitter, and the provider's Retry-After.

Pure functions of a :class:`RetryConfig`'s settings (read through
:class:`BackoffSettings`, so this module needs no config record); the record's
``backoff_ceiling``, ``backoff`` and ``wait_before_retry`` delegate here.

Full jitter (a wait drawn from ``uniform(0, ceiling)``) rather than a fixed
wait: workers that failed together (one 5xx storm) would otherwise retry
together and meet the same storm again.
"""

from __future__ import annotations

import random
from typing import Protocol

__all__ = ["BackoffSettings", "backoff", "backoff_ceiling", "wait_before_retry"]


class BackoffSettings(Protocol):
    """What the arithmetic reads of a :class:`~trio_batch_llm.RetryConfig`."""

    @property
    def initial_wait(self) -> float: ...
    @property
    def max_wait(self) -> float: ...
    @property
    def exponential_base(self) -> float: ...
    @property
    def jitter(self) -> bool: ...
    @property
    def respect_retry_after(self) -> bool: ...


def backoff_ceiling(settings: BackoffSettings, retry_number: int) -> float:
    """The largest wait before retry ``retry_number`` (0 for the first retry)."""
    try:
        raw = settings.initial_wait * settings.exponential_base**retry_number
    except OverflowError:  # a float power past 1e308 raises instead of giving inf: the cap it is
        return settings.max_wait
    return min(settings.max_wait, raw)


def backoff(settings: BackoffSettings, retry_number: int, rng: random.Random | None = None) -> float:
    """The wait before retry ``retry_number``: ``uniform(0, ceiling)`` with jitter."""
    ceiling = backoff_ceiling(settings, retry_number)
    if not settings.jitter:
        return ceiling
    return (rng or random).uniform(0.0, ceiling)


def wait_before_retry(
    settings: BackoffSettings, retry_number: int, retry_after: float | None, rng: random.Random | None = None
) -> float:
    """Backoff for ``retry_number``, raised to ``retry_after`` when that is larger."""
    wait = backoff(settings, retry_number, rng)
    if settings.respect_retry_after and retry_after is not None and retry_after > wait:
        return retry_after
    return wait
