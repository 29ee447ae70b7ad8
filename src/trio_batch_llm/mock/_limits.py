"""The mock server's own RPM/TPM limits: sliding windows, a schedule of changes, and the headers that tell.

A request is *served* when it fits both windows at its arrival; a refused one
uses no quota. With ``ratelimit_headers``, every completion answer carries
its dialect's rate-limit headers for the limits in force (only for the limits
that are set), computed from the same windows the server enforces; OpenAI's six:

- ``x-ratelimit-limit-requests`` / ``-tokens``: the limit in force;
- ``x-ratelimit-remaining-requests`` / ``-tokens``: what the window has left
  after this request (counted if it was served);
- ``x-ratelimit-reset-requests`` / ``-tokens``: the time until the window is
  empty if nothing more arrives, in Go's duration notation (``59.95s``,
  ``1m0s``, ``20ms``): "resets to its initial state", as OpenAI defines it.

A refused request's ``Retry-After`` (and ``retry-after-ms``) is the exact wait
until the window has room for it. Times are the app's clock; the schedule's
times count from the first completion request the app received.

A calendar-minute limit (``calendar_rpm_limit``) counts what was served since the
last whole minute of the *wall* clock (``floor(wall / 60)``), as gateways that
count per calendar minute do, and its refusals are silent: no wait, no headers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import final

from ._dialect import LimitState
from ._state import MockServerConfig, SlidingWindow

__all__ = ["CalendarMinute", "Decision", "ServerLimits", "go_duration"]


def go_duration(seconds: float) -> str:
    """``seconds`` in Go's notation, as OpenAI writes resets: ``20ms``, ``1.5s``, ``6m0s``, ``1h0m0s``."""
    seconds = max(0.0, seconds)
    if seconds < 1.0:
        millis = round(seconds * 1000)
        return "0s" if millis == 0 else f"{millis}ms"
    whole_minutes, rest = divmod(seconds, 60.0)
    hours, minutes = divmod(int(whole_minutes), 60)
    text = f"{round(rest, 3):g}s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    if minutes:
        return f"{minutes}m{text}"
    return text


@final
@dataclass(frozen=True, slots=True)
class Decision:
    """The limiter's verdict on one request: served, refused (with the wait), or too large to ever fit."""

    served: bool
    wait: float = 0.0
    too_large: bool = False
    silent: bool = False
    """Refused by the calendar-minute limit: the 429 carries no wait and no rate-limit headers."""


@final
class CalendarMinute:
    """Requests served in the current calendar minute of a wall clock; the count starts again at :00.

    Clock-free (callers pass the wall time), so exact under any injected clock. A
    time in an earlier minute than the last one counted reads as that last minute,
    so a wall clock stepped back never reopens a minute already spent.
    """

    def __init__(self) -> None:
        self._minute: int | None = None
        self._count = 0
        self.max_count = 0

    def served_in(self, wall: float) -> int:
        """What the minute holding ``wall`` has served so far."""
        minute = math.floor(wall / 60.0)
        return self._count if self._minute is not None and minute <= self._minute else 0

    def add(self, wall: float) -> None:
        minute = math.floor(wall / 60.0)
        if self._minute is None or minute > self._minute:
            self._minute, self._count = minute, 0
        self._count += 1
        self.max_count = max(self.max_count, self._count)


@final
class ServerLimits:
    """The windows, the limits in force (after the schedule) and their headers."""

    def __init__(self, config: MockServerConfig) -> None:
        self._config = config
        self.arrivals = SlidingWindow(config.limit_window)
        self.served = SlidingWindow(config.limit_window)
        self.served_tokens = SlidingWindow(config.limit_window)
        self.served_input = SlidingWindow(config.limit_window)
        self.served_output = SlidingWindow(config.limit_window)
        self.calendar = CalendarMinute()
        self._start: float | None = None

    def limits_at(self, now: float) -> tuple[int | None, int | None]:
        """``(rpm_limit, tpm_limit)`` in force at ``now`` (``None``: no such limit)."""
        config = self._config
        rpm, tpm = config.rpm_limit, config.tpm_limit
        start = self._start
        if start is not None:
            for at, new_rpm, new_tpm in config.limit_schedule:
                if now - start >= at:
                    rpm, tpm = new_rpm, new_tpm
        return rpm, tpm

    def arrive(self, now: float) -> None:
        if self._start is None:
            self._start = now
        self.arrivals.add(now)

    def admit(self, now: float, tokens: int, wall: float = 0.0, split: tuple[int, int] = (0, 0)) -> Decision:
        """Serve ``tokens`` at ``now`` if every window has room (and count it), else say how long to wait.

        ``wall`` is the wall clock's time, read only by the calendar-minute limit; ``split`` is
        ``(input tokens that count, output tokens)``, read by the input/output limits.
        """
        rpm, tpm = self.limits_at(now)
        apart = ((self._config.input_tpm_limit, self.served_input, split[0]),
                 (self._config.output_tpm_limit, self.served_output, split[1]))
        if (tpm is not None and tokens > tpm) or any(lim is not None and n > lim for lim, _, n in apart):
            return Decision(False, too_large=True)
        calendar = self._config.calendar_rpm_limit
        if calendar is not None and self.calendar.served_in(wall) >= calendar:
            return Decision(False, silent=True)
        wait = 0.0
        if rpm is not None:
            wait = self.served.wait_for_room(now, 1, rpm)
        if tpm is not None:
            wait = max(wait, self.served_tokens.wait_for_room(now, tokens, tpm))
        for limit, window, count in apart:
            if limit is not None:
                wait = max(wait, window.wait_for_room(now, count, limit))
        if wait > 0:
            return Decision(False, wait)
        self.served.add(now)
        self.served_tokens.add(now, tokens)
        for _, window, count in apart:
            window.add(now, count)
        if calendar is not None:
            self.calendar.add(wall)
        return Decision(True)

    def states(self, now: float) -> list[LimitState]:
        """The limits in force and their windows, for the dialect's rate-limit headers (none without
        ``ratelimit_headers``)."""
        if not self._config.ratelimit_headers:
            return []
        rpm, tpm = self.limits_at(now)
        out: list[LimitState] = []
        for kind, limit, window in (("requests", rpm, self.served), ("tokens", tpm, self.served_tokens),
                                    ("input-tokens", self._config.input_tpm_limit, self.served_input),
                                    ("output-tokens", self._config.output_tpm_limit, self.served_output)):
            if limit is None:
                continue
            held, newest = window.held_at(now)
            empty_in = 0.0 if newest is None else newest + window.length - now
            out.append(LimitState(kind, limit, max(0, limit - held), empty_in))
        return out
