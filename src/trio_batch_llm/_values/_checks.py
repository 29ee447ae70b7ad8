"""Number checks for the configuration records: each raises :class:`ConfigurationError` naming the field."""

from __future__ import annotations

import math

from ._errors import ConfigurationError

__all__ = ["finite", "fraction", "non_negative", "positive", "whole"]


def finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def positive(name: str, value: float | None, *, allow_none: bool = True) -> None:
    if value is None:
        if not allow_none:
            raise ConfigurationError(name, value, "is required")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(name, value, "must be a number")
    if not finite(value) or value <= 0:
        raise ConfigurationError(name, value, "must be a finite number > 0")


def non_negative(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(name, value, "must be a number")
    if not finite(value) or value < 0:
        raise ConfigurationError(name, value, "must be a finite number >= 0")


def whole(name: str, value: int | None, *, minimum: int, allow_none: bool = True) -> None:
    if value is None:
        if not allow_none:
            raise ConfigurationError(name, value, "is required")
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(name, value, "must be a whole number")
    if value < minimum:
        raise ConfigurationError(name, value, f"must be >= {minimum}")


def fraction(name: str, value: float, *, low_open: bool, high: float, high_open: bool = False) -> None:
    """A number in the interval from 0 to ``high``, each end open or closed as asked."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigurationError(name, value, "must be a finite number")
    too_low = value <= 0 if low_open else value < 0
    too_high = value >= high if high_open else value > high
    if too_low or too_high:
        interval = f"{'(' if low_open else '['}0, {high:g}{')' if high_open else ']'}"
        raise ConfigurationError(name, value, f"must be in {interval}")
