"""What a provider says about its limits: rate-limit headers -> a :class:`RateLimitObservation`.

Pure functions: nothing here reads a clock (but see ``wall_time``) or raises
on what a server sends. A header that cannot be read is ignored, as if it
were absent; an answer with no readable rate-limit header gives ``None``.

Two dialects, the first one present wins:

- **OpenAI** (and the many servers that copy it): ``x-ratelimit-limit-requests``,
  ``x-ratelimit-remaining-requests``, ``x-ratelimit-reset-requests`` and the same
  three for ``-tokens``. Resets are durations in Go's notation (``6m0s``,
  ``1.5s``, ``20ms``, ``1h2m3.5s``, ``0s``); a bare number is seconds.
- **Anthropic**: ``anthropic-ratelimit-requests-limit`` / ``-remaining`` /
  ``-reset``, and the same for ``tokens``, ``input-tokens`` and
  ``output-tokens``; resets are RFC 3339 times. The observation's tokens are
  the ``tokens`` family (Anthropic's "most restrictive limit in effect"); the
  ``input-tokens`` and ``output-tokens`` families are budgets of their own
  (``input_tokens_*``, ``output_tokens_*``), paced apart: a call's input is
  held against the one, its output allowance against the other.

In both, ``retry-after-ms`` (milliseconds) wins over ``retry-after`` (seconds
or an HTTP date), read by :func:`~trio_batch_llm._values._retry_after.retry_after_from_headers`,
the one Retry-After reader every path shares.

Times: ``now`` is the caller's clock (the quota scope's monotonic clock) at the
moment the answer arrived, and every reset is placed on it (``reset_at = now +
duration``). Absolute times (Anthropic's resets, an HTTP-date Retry-After) are
measured from ``wall_time``, the wall clock (seconds since the epoch) at that
same moment; it defaults to :func:`time.time`, the one clock read here, and only
when an absolute time is present.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal, final

from .._values._retry_after import MAX_HEADER_CHARS as _MAX_HEADER_CHARS
from .._values._retry_after import RETRY_AFTER_HEADERS, retry_after_from_headers
from .._values._retry_after import decimal_number as _number

__all__ = [
    "RATE_LIMIT_METADATA_KEY",
    "RateLimitObservation",
    "parse_duration",
    "parse_rate_limit_headers",
    "rate_limit_headers",
]

RATE_LIMIT_METADATA_KEY: Final = "rate_limit"
"""The result-metadata key under which a strategy reports an answer's rate-limit headers."""

_PREFIXES: Final = ("x-ratelimit-", "anthropic-ratelimit-")
_RETRY_AFTER: Final = frozenset(RETRY_AFTER_HEADERS)  # LiteLLM's llm_provider- pair too
_UNIT_SECONDS: Final[Mapping[str, float]] = {
    "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ns": 1e-9,
}
_DURATION_PART: Final = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|h|m|s)")
_EPOCH_SECONDS: Final = 1e9  # a bare reset this large is a Unix time (2001 onwards), not a duration

Dialect = Literal["openai", "anthropic", "retry-after"]
_Budget = tuple[int | None, int | None, float | None]  # (limit, remaining, reset_at)
_NO_BUDGET: Final[_Budget] = (None, None, None)
_Budgets = tuple[_Budget, _Budget, _Budget, _Budget]  # requests, tokens, input tokens, output tokens


@final
@dataclass(frozen=True, slots=True)
class RateLimitObservation:
    """What one answer said about the provider's limits, at ``at`` on the caller's clock.

    ``None`` fields were not reported (or could not be read). ``*_remaining``
    counts what is left *after* the answered call was counted; ``*_reset_at``
    is when that budget is whole again, on the same clock as ``at``.
    """

    dialect: Dialect
    at: float
    requests_limit: int | None = None
    requests_remaining: int | None = None
    requests_reset_at: float | None = None
    tokens_limit: int | None = None
    tokens_remaining: int | None = None
    tokens_reset_at: float | None = None
    retry_after: float | None = None
    """Seconds the provider asked the caller to wait (``retry-after-ms`` or ``retry-after``)."""
    input_tokens_limit: int | None = None
    input_tokens_remaining: int | None = None
    input_tokens_reset_at: float | None = None
    output_tokens_limit: int | None = None
    output_tokens_remaining: int | None = None
    output_tokens_reset_at: float | None = None
    """Anthropic's input- and output-token budgets, reported beside (or instead of) ``tokens``."""

    @property
    def reports_budget(self) -> bool:
        """Whether any request or token budget was reported (not just a Retry-After)."""
        return (self.requests_remaining is not None or self.tokens_remaining is not None
                or self.input_tokens_remaining is not None or self.output_tokens_remaining is not None)

    @property
    def capacity_remains(self) -> bool:
        """The request budget and a token budget were reported, and every budget reported has
        something left.

        A 429 that says so was not refused for the limits these headers
        describe: a transient blip for that one call, not a reason to pause a scope.
        """
        requests = self.requests_remaining
        tokens = (self.tokens_remaining, self.input_tokens_remaining, self.output_tokens_remaining)
        if requests is None or requests <= 0 or all(t is None for t in tokens):
            return False
        return all(t is None or t > 0 for t in tokens)


def rate_limit_headers(headers: Any) -> dict[str, str]:
    """The rate-limit headers of an answer, as a strategy reports them in ``metadata["rate_limit"]``.

    Keeps the names starting ``x-ratelimit-`` or ``anthropic-ratelimit-`` and
    ``retry-after`` / ``retry-after-ms`` (also with LiteLLM's ``llm_provider-`` prefix),
    lower-cased, with ``str`` values.
    ``headers`` is any mapping, or an object with ``items()`` such as httpx's
    ``Headers``; anything else gives ``{}``.
    """
    found: dict[str, str] = {}
    for name, value in _pairs(headers):
        if name in _RETRY_AFTER or name.startswith(_PREFIXES):
            found[name] = value
    return found


def parse_rate_limit_headers(
    headers: Mapping[str, str], now: float, *, wall_time: float | None = None
) -> RateLimitObservation | None:
    """Read the rate-limit headers of one answer; ``None`` when it has none that can be read.

    ``headers`` may use any case and may hold other headers too (see the module docstring for
    ``now`` and ``wall_time``). Never raises on header contents.
    """
    values = {name: value for name, value in _pairs(headers)
              if name in _RETRY_AFTER or name.startswith(_PREFIXES)}
    if not values:
        return None
    clock = _WallClock(wall_time)
    retry_after = retry_after_from_headers(values, now=clock)
    budgets = _openai(values, now, clock)
    dialect: Dialect = "openai"
    if budgets is None:
        budgets, dialect = _anthropic(values, now, clock), "anthropic"
    if budgets is not None:
        requests, tokens, inputs, outputs = budgets
        return RateLimitObservation(
            dialect, now, requests_limit=requests[0], requests_remaining=requests[1],
            requests_reset_at=requests[2], tokens_limit=tokens[0], tokens_remaining=tokens[1],
            tokens_reset_at=tokens[2], retry_after=retry_after,
            input_tokens_limit=inputs[0], input_tokens_remaining=inputs[1], input_tokens_reset_at=inputs[2],
            output_tokens_limit=outputs[0], output_tokens_remaining=outputs[1],
            output_tokens_reset_at=outputs[2],
        )
    if retry_after is not None:
        return RateLimitObservation("retry-after", now, retry_after=retry_after)
    return None


# -- values ---------------------------------------------------------------------------------------


def parse_duration(text: str) -> float | None:
    """Seconds in a Go-style duration (``6m0s``, ``1.5s``, ``20ms``, ``1h2m3.5s``) or a bare number.

    ``None`` for anything else (negative, empty, unknown units, trailing garbage).
    """
    text = text.strip()
    if not text or len(text) > _MAX_HEADER_CHARS:
        return None
    bare = _number(text)
    if bare is not None:
        return bare
    total, position = 0.0, 0
    for part in _DURATION_PART.finditer(text):
        if part.start() != position:
            return None
        total += float(part.group(1)) * _UNIT_SECONDS[part.group(2)]
        position = part.end()
    if position != len(text) or position == 0 or not math.isfinite(total):
        return None
    return total


def _count(text: str | None) -> int | None:
    """A whole count (``"42"``; ``"42.0"`` too), or ``None``."""
    if text is None or len(text) > _MAX_HEADER_CHARS:
        return None
    value = _number(text.strip())
    if value is None or value != math.floor(value):
        return None
    return int(value)


def _pairs(headers: Any) -> Iterable[tuple[str, str]]:
    items = getattr(headers, "items", None)
    if items is None:
        return ()
    try:
        pairs = list(items())
    except Exception:  # noqa: BLE001 - a mapping that cannot be listed has no headers we can read
        return ()
    out: list[tuple[str, str]] = []
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2:
            continue
        name, value = pair
        if isinstance(name, bytes):
            name = name.decode("latin-1")
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        if isinstance(name, str) and isinstance(value, str):
            out.append((name.lower(), value))
    return out


@final
class _WallClock:
    """``time.time()`` read at most once, and only if an absolute time needs it."""

    __slots__ = ("_value",)

    def __init__(self, value: float | None) -> None:
        self._value = value

    def __call__(self) -> float:
        if self._value is None:
            self._value = time.time()
        return self._value


def _reset_at(text: str | None, now: float, wall: _WallClock) -> float | None:
    """An OpenAI-style reset on the caller's clock: ``now`` + a duration.

    A bare number too large to be a duration (some OpenAI-compatible servers
    send a Unix time there) is read as a Unix time in seconds, or milliseconds
    when larger still.
    """
    if text is None:
        return None
    seconds = parse_duration(text)
    if seconds is None:
        return None
    if seconds < _EPOCH_SECONDS or _number(text.strip()) is None:
        return now + seconds
    if seconds >= _EPOCH_SECONDS * 1000:
        seconds /= 1000.0
    return now + max(0.0, seconds - wall())


def _openai(values: Mapping[str, str], now: float, wall: _WallClock) -> _Budgets | None:
    requests, tokens = (
        (_count(values.get(f"x-ratelimit-limit-{kind}")), _count(values.get(f"x-ratelimit-remaining-{kind}")),
         _reset_at(values.get(f"x-ratelimit-reset-{kind}"), now, wall))
        for kind in ("requests", "tokens")
    )
    if requests == _NO_BUDGET and tokens == _NO_BUDGET:
        return None
    return requests, tokens, _NO_BUDGET, _NO_BUDGET


def _rfc3339(text: str | None, now: float, wall: _WallClock) -> float | None:
    if text is None or len(text) > _MAX_HEADER_CHARS:
        return None
    text = text.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:
        return now + max(0.0, when.timestamp() - wall())
    except (OverflowError, OSError, ValueError):
        return None


def _anthropic(values: Mapping[str, str], now: float, wall: _WallClock) -> _Budgets | None:
    families: dict[str, _Budget] = {}
    for kind in ("requests", "tokens", "input-tokens", "output-tokens"):
        prefix = f"anthropic-ratelimit-{kind}-"
        family = (_count(values.get(prefix + "limit")), _count(values.get(prefix + "remaining")),
                  _rfc3339(values.get(prefix + "reset"), now, wall))
        if any(f is not None for f in family):
            families[kind] = family
    if not families:
        return None
    return (families.get("requests", _NO_BUDGET), families.get("tokens", _NO_BUDGET),
            families.get("input-tokens", _NO_BUDGET), families.get("output-tokens", _NO_BUDGET))
