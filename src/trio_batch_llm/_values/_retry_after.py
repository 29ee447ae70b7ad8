"""The one reader of a provider's ``Retry-After`` (and OpenAI's ``retry-after-ms``), for every path.

The engine's classifier (an exception's ``retry_after`` text or its response's
headers), the OpenAI dialects' error answers and the quota scope's rate-limit
observations all read the wait here, so a header means the same wherever it
arrives. Pure functions: the wall clock is read only for an HTTP date, and only
when the caller gave no ``now``. Nothing here raises on what a server sends.

What is read (RFC 9110 §10.2.3 and §5.6.7, with the one leniency providers need):

- **delta-seconds**: ASCII digits, with a decimal fraction too (``"1.5"``: some
  providers send one), surrounding whitespace ignored. No sign, exponent,
  underscore, ``inf`` or ``nan``: they are not HTTP, and Python's ``float()``
  would otherwise take them. A huge number is returned as it is (the engine's own
  caps bound the wait); one too long to be a number (over 256 characters) is not read.
- **HTTP-date**, in the three forms HTTP allows: IMF-fixdate
  (``Sun, 06 Nov 1994 08:49:37 GMT``), the obsolete RFC 850
  (``Sunday, 06-Nov-94 08:49:37 GMT``) and asctime (``Sun Nov  6 08:49:37 1994``)
  forms. HTTP dates are GMT: a date without a zone, or with ``-0000`` ("UTC, no
  claim about local time"), is UTC, never local time; an explicit other offset is
  honoured. Measured from ``now`` (wall-clock seconds since the epoch) and 0 when past.
- ``retry-after-ms``: a decimal number of milliseconds, as above; it wins over
  ``Retry-After`` when it can be read, and is ignored (``Retry-After`` decides) when not.

Anything else is ``None``: no wait was asked for.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Callable
from datetime import UTC
from typing import Final, TypeAlias

__all__ = [
    "MAX_HEADER_CHARS", "WallClock", "decimal_number", "parse_retry_after", "retry_after_from_headers",
]

WallClock: TypeAlias = float | Callable[[], float] | None
"""Wall-clock seconds since the epoch, a function giving them (called at most once), or ``None``
for :func:`time.time`."""

MAX_HEADER_CHARS: Final = 256
"""A header value longer than this is not a number or a date."""
_DECIMAL: Final = frozenset("0123456789.")


def decimal_number(text: str) -> float | None:
    """A finite, non-negative decimal number (digits and at most one ``.``; no sign, no exponent)."""
    if not text or len(text) > MAX_HEADER_CHARS or not _DECIMAL.issuperset(text) or text.count(".") > 1 \
            or text == ".":
        return None
    return float(text)


def parse_retry_after(value: str | bytes, *, now: WallClock = None) -> float | None:
    """Seconds to wait from one ``Retry-After`` value, or ``None`` if it is not one (module docstring)."""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    text = value.strip()
    seconds = decimal_number(text)
    if seconds is not None:
        return seconds if math.isfinite(seconds) else None
    if not text or len(text) > MAX_HEADER_CHARS:
        return None
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # no zone (asctime) or "-0000": HTTP dates are GMT, never local time
        when = when.replace(tzinfo=UTC)
    reference = time.time() if now is None else now if isinstance(now, (int, float)) else now()
    try:
        return max(0.0, when.timestamp() - reference)
    except (OverflowError, OSError, ValueError):
        return None


def retry_after_from_headers(headers: object, *, now: WallClock = None) -> float | None:
    """Seconds to wait from an answer's headers: ``retry-after-ms``, else ``Retry-After``; else ``None``.

    ``headers`` is any mapping (names in any case) or an object with ``items()``
    such as httpx's ``Headers``; names and values may be ``bytes``. Anything else gives ``None``.
    """
    items = getattr(headers, "items", None)
    if items is None:
        return None
    millis: str | bytes | None = None
    value: str | bytes | None = None
    try:
        for pair in items():
            if not isinstance(pair, tuple) or len(pair) != 2:
                continue
            name, found = pair
            if isinstance(name, bytes):
                name = name.decode("latin-1")
            if not isinstance(name, str) or not isinstance(found, (str, bytes)) or len(name) not in (11, 14):
                continue  # only "retry-after" (11) and "retry-after-ms" (14) are read
            name = name.lower()
            if name == "retry-after-ms":
                millis = found
            elif name == "retry-after":
                value = found
    except Exception:  # noqa: BLE001 - headers that cannot be listed have no wait we can read
        return None
    if millis is not None:
        if isinstance(millis, bytes):
            millis = millis.decode("latin-1")
        seconds = decimal_number(millis.strip())
        if seconds is not None and math.isfinite(seconds):
            return seconds / 1000.0
    return None if value is None else parse_retry_after(value, now=now)
