"""The one reader of a provider's ``Retry-After`` (OpenAI's ``retry-after-ms``, gateways'), for every path.

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
- **Gateways**: LiteLLM's proxy passes the upstream provider's headers on with an
  ``llm_provider-`` prefix, and on a provider's own 429 sends its ``retry-after`` only
  so (``llm_provider-retry-after``, ``llm_provider-retry-after-ms``). They are read the
  same way, after the unprefixed pair (the gateway's own word, when it gives one, is
  about the gateway, which is what the next call meets first).

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
    "MAX_HEADER_CHARS", "RETRY_AFTER_HEADERS", "WallClock", "decimal_number", "parse_retry_after",
    "retry_after_from_headers",
]

WallClock: TypeAlias = float | Callable[[], float] | None
"""Wall-clock seconds since the epoch, a function giving them (called at most once), or ``None``
for :func:`time.time`."""

MAX_HEADER_CHARS: Final = 256
"""A header value longer than this is not a number or a date."""
_DECIMAL: Final = frozenset("0123456789.")
_GATEWAY_PREFIX: Final = "llm_provider-"
RETRY_AFTER_HEADERS: Final = ("retry-after-ms", "retry-after", _GATEWAY_PREFIX + "retry-after-ms",
                              _GATEWAY_PREFIX + "retry-after")
"""The names read for a wait (lower case), the first that can be read winning."""
_RANK: Final = {name: rank for rank, name in enumerate(RETRY_AFTER_HEADERS)}
_LENGTHS: Final = frozenset(len(name) for name in RETRY_AFTER_HEADERS)


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
    """Seconds to wait from an answer's headers: ``retry-after-ms``, else ``Retry-After``, else the
    same two with LiteLLM's ``llm_provider-`` prefix (:data:`RETRY_AFTER_HEADERS`); else ``None``.

    ``headers`` is any mapping (names in any case) or an object with ``items()``
    such as httpx's ``Headers``; names and values may be ``bytes``. Anything else gives ``None``.
    """
    items = getattr(headers, "items", None)
    if items is None:
        return None
    found_by_rank: list[str | bytes | None] = [None] * len(RETRY_AFTER_HEADERS)
    try:
        for pair in items():
            if not isinstance(pair, tuple) or len(pair) != 2:
                continue
            name, found = pair
            if isinstance(name, bytes):
                name = name.decode("latin-1")
            if not isinstance(name, str) or not isinstance(found, (str, bytes)) or len(name) not in _LENGTHS:
                continue  # cheap: only names as long as one of RETRY_AFTER_HEADERS are looked up
            rank = _RANK.get(name.lower())
            if rank is not None:
                found_by_rank[rank] = found
    except Exception:  # noqa: BLE001 - headers that cannot be listed have no wait we can read
        return None
    for rank in range(0, len(found_by_rank), 2):  # each pair: milliseconds, then Retry-After
        millis, value = found_by_rank[rank], found_by_rank[rank + 1]
        if millis is not None:
            if isinstance(millis, bytes):
                millis = millis.decode("latin-1")
            seconds = decimal_number(millis.strip())
            if seconds is not None and math.isfinite(seconds):
                return seconds / 1000.0
        if value is not None and (seconds := parse_retry_after(value, now=now)) is not None:
            return seconds
    return None
