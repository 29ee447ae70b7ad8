"""Discovering a provider's request limit from its 429s alone (pure, like :mod:`._limits`).

Used by :class:`~._pacing.PacingCore` when the provider reports no budget.
The first 429 starts measuring (admissions and answers are counted from then
on, per second) and lets one call at a time go until one gets through. If at
least a call a second got through before it, it also sets the rate to that
count over a window: a provider's window is a minute, and pacing at it keeps
the next window from taking the same burst again (fewer calls say little of a
limit). After it, a 429 from a call admitted since the last decrease is a new
signal, and one per *generation* counts (a 429 from a call admitted before the
last decrease belongs to a storm already answered):

- **multiplicative decrease**: the rate becomes ``discovery_decrease`` times
  where it starts from: the rate in force, or the rate admitted since calls
  last flowed (since the last storm ended, at most a window back) if lower
  (a window holding a cooldown would measure the pause, not the rate); once a
  whole window of answers is counted, no more than what the provider served
  over the last window, which is about its limit (it refuses once its window
  is full and never serves more in one); never below ``discovery_min_rpm``;
  if a storm took part of that window, the climb back (below) goes to the rate
  served while calls flowed, not to the window's count;
- **additive increase**: each answer that is not a 429, if the rate held a
  call back since the previous answer, grows it for the time elapsed: back to
  where the decrease started (after a whole window: what was served over it)
  within ``discovery_recovery_seconds``, then past it by ``discovery_probe``
  of it per window (the limit is near there); a configured RPM caps it;
- **storm**: a new 429 with no other answer, to a call admitted since the
  last decrease (or the first 429), means the provider refuses everything (its window is full): the
  rate is left alone and calls go one at a time until an answer gets
  through: right after the scope's cooldown if the provider said when to
  come back, else each probe a doubling gap after the last (1 s, 2 s, ...
  at most a window), and never later than just after the next wall-clock minute
  (``:00``, :data:`MINUTE_SLACK` past it) when the scope knows the wall time
  (``wall_offset``): a provider counting per calendar minute has room again then.

Admissions are spread at the rate with :data:`~._limits.PACE_CREDIT` seconds of credit.

A 429 reaches these rules only when :mod:`._refusals` says it follows the rate
(a long enough run of refusals); random refusals are retried by their call alone.

A ``shared`` discovery neither paces nor learns: the scope's limit lives in
Redis, whose script applies these rules for every process (:mod:`._redis_discovery`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Final, final

from .._values._config import RateLimitConfig
from ._limits import NOW, PACE_CREDIT, WINDOW_SECONDS

__all__ = ["MINUTE_SLACK", "Discovery"]

MINUTE_SLACK: Final = 0.5
"""Seconds after a wall-clock minute's ``:00`` that a storm's probe goes (clocks differ a little)."""

_MIN_FIRST_ESTIMATE: Final = 60
"""Calls that must have got through before the first 429 for it to set the pace: fewer say little
(an isolated 429 after a few calls would otherwise pace the scope at a few calls a minute)."""
_STORM_SHARE: Final = 0.1
"""A window that lost less than this share of its time to a storm measures the limit by what it served."""
_MIN_FLOWING_SHARE: Final = 1 / 3
"""The share of a window that calls must have flowed for their rate to say anything of the limit: just
after a storm the provider's emptied window lets a burst through (a window's worth of calls in seconds),
and a rate measured over so short a span is that burst, far above the limit (calls a window)."""
_MIN_MEASURE_SPAN: Final = 0.05  # seconds: a rate measured over less is taken over this long


@final
class Discovery:
    """A request rate learnt from 429s alone: additive increase, multiplicative decrease (see above)."""

    __slots__ = (
        "_activated_at",
        "_admitted",
        "_answered",
        "_config",
        "_decreased_at",
        "_flowed",
        "_grown_at",
        "_limited_at",
        "_peak",
        "_probe_slope",
        "_probed_at",
        "_resumed_at",
        "_served",
        "_served_flowing",
        "_slope",
        "_storm",
        "_storm_gap",
        "_tat",
        "cap",
        "generation",
        "rate",
        "shared",
        "wall_offset",
    )

    def __init__(self, config: RateLimitConfig, requests_per_minute: float | None, *,
                 shared: bool = False) -> None:
        self._config = config
        self.shared = shared
        self.cap = math.inf if requests_per_minute is None else requests_per_minute / WINDOW_SECONDS
        self.rate: float | None = None  # requests per second; None: no limit discovered
        self.generation = 0
        self._activated_at: float | None = None  # the first 429: measuring begins
        self._resumed_at = NOW  # the end of the last storm: calls flow again from here
        self._decreased_at = NOW
        self._flowed = 0  # calls admitted since _resumed_at
        self._served_flowing = 0  # answers (not 429s) since _resumed_at
        self._answered = False  # an answer other than a 429 since the last decrease
        self._storm = False  # nothing gets through: one probe at a time, ...
        self._storm_gap = 0.0  # ... this far apart
        self._probed_at = NOW
        self._slope = 0.0
        self._peak = 0.0  # the rate the last decrease came from (requests per second)
        self._probe_slope = 0.0
        self._grown_at = NOW
        self._limited_at = NOW
        self._tat = NOW
        self._admitted = _Tally()
        self._served = _Tally()
        self.wall_offset: Callable[[], float] | None = None
        """Wall-clock seconds minus the scope's clock (a function, read only in a storm with no hint)."""

    def ready_at(self, in_flight: int, now: float) -> float:
        ready = NOW
        if self.rate is not None:
            ready = self._tat - PACE_CREDIT
            if ready > now:
                self._limited_at = now
        if self._storm:
            # One call at a time while the provider refuses everything: each probe costs at most
            # one 429, where a full rate would spend a 429 per call and, with some providers,
            # prolong the refusal. A probe in flight will answer first.
            probe = math.inf if in_flight else self._probed_at + self._storm_gap
            if self._storm_gap and self.wall_offset is not None and probe < math.inf:
                probe = min(probe, next_minute(self._probed_at, self.wall_offset()))
            if probe > ready:
                ready = probe
        return ready

    def commit(self, now: float) -> None:
        if self._activated_at is None:
            return
        self._admitted.add(now)
        self._flowed += 1
        self._probed_at = now
        rate = self.rate
        if rate is not None:
            # max(): idle time is not banked beyond PACE_CREDIT (ready_at), so a quiet scope does
            # not wake to a burst of a window's worth that the provider would refuse.
            self._tat = max(self._tat, now) + 1.0 / rate

    def answered(self, generation: int, now: float) -> None:
        """An answer that was not a 429: count it served, and grow the rate if it held anyone back.

        Only a call admitted since the last decrease (``generation``) shows that
        calls get through *now*, ending a storm.
        """
        if self._activated_at is None:
            return
        self._served.add(now)
        if generation >= self.generation:
            self._answered = True
            if self._storm:
                self._resumed_at, self._flowed, self._served_flowing = now, 0, 0
            self._storm, self._storm_gap = False, 0.0
        self._served_flowing += 1
        rate = self.rate
        if rate is None:
            return
        if self._limited_at >= self._grown_at:
            # Grown only when the rate held a call back since the last answer: a scope calling below
            # its rate proves nothing about a higher one, and would otherwise climb without limit.
            # Back to the rate the last decrease came from within the recovery time, then
            # beyond it only slowly: the limit is near there.
            elapsed = now - self._grown_at
            peak = self._peak
            if rate < peak:
                to_peak = (peak - rate) / self._slope if self._slope > 0 else 0.0
                if elapsed <= to_peak:
                    rate += self._slope * elapsed
                else:
                    rate = peak + self._probe_slope * (elapsed - to_peak)
            else:
                rate += self._probe_slope * elapsed
            self.rate = min(self.cap, rate)
        self._grown_at = now

    def rate_limited(self, generation: int, asked_to_wait: bool, now: float, served_before: int = 0) -> None:
        """A 429 that reported no budget (``generation``: its call's, at admission).

        The first one only starts measuring. After it, a 429 from a call
        admitted since the last decrease lowers the rate, unless nothing got
        through since that decrease: then the provider refuses everything, and
        either it said when to come back (``asked_to_wait``: the scope's
        cooldown waits for that) or one probe at a time goes, at a doubling
        gap (at most a window), until an answer gets through.
        """
        if self.shared:
            return  # learnt in Redis, for every process: never activated here, so never pacing
        if self._activated_at is None:
            # The first: measuring begins, and one call at a time goes until one gets through.
            # What got through before it is the first guess at a window's worth: pacing at it
            # from now on keeps the next window from taking the same burst again.
            self._activated_at = now
            self._flowed = self._served_flowing = 0
            self.generation += 1
            self._storm = True
            if served_before >= _MIN_FIRST_ESTIMATE:
                floor = self._config.discovery_min_rpm / WINDOW_SECONDS
                self.rate = self._peak = max(floor, min(self.cap, served_before / WINDOW_SECONDS))
                self._slope = self._probe_slope = self._config.discovery_probe * self.rate / WINDOW_SECONDS
                self._grown_at = now
            return
        if generation < self.generation:
            return  # admitted before the last decrease: that storm is already answered
        self.generation += 1
        if not self._answered:
            self._storm = True
            if not asked_to_wait:
                self._storm_gap = min(WINDOW_SECONDS, max(1.0, 2.0 * self._storm_gap))
            return
        config = self._config
        decrease = config.discovery_decrease
        if self.rate is not None and now - self._decreased_at < config.discovery_recovery_seconds:
            # Within the climb back from the last decrease, a 429 lowers the rate again only if a
            # whole window of answers shows the provider serving well below it: isolated 429s
            # (a provider that refuses a few calls at random) would otherwise ratchet it down
            # faster than it climbs, to a few calls a minute.
            full = now - self._activated_at >= WINDOW_SECONDS
            if not (full and self._served.count(now) / WINDOW_SECONDS < decrease * self.rate):
                return
        self._answered = False
        self._decreased_at = now
        # The rate admitted since calls last flowed (the first 429, or the end of the last storm),
        # within the last window: a window that holds a long storm (a cooldown) would measure the
        # pause, not the rate, and pin the scope far below the limit.
        flowing = now - max(self._activated_at, self._resumed_at)
        if flowing < WINDOW_SECONDS:
            measured = self._flowed / max(_MIN_MEASURE_SPAN, flowing)
        else:
            measured = self._admitted.count(now) / WINDOW_SECONDS
        current = min(self.cap, measured if self.rate is None else min(self.rate, measured))
        floor = config.discovery_min_rpm / WINDOW_SECONDS
        peak = current
        if now - self._activated_at >= WINDOW_SECONDS:
            # A whole window of answers counted. The provider refuses once its window is full and
            # never serves more than its limit in one, so what it served over the last window is
            # about its limit (or this scope's share of it): come down from it at once, not by
            # ``discovery_decrease`` per 429, and climb back to it, not to a pace already refused.
            served = max(floor, self._served.count(now) / WINDOW_SECONDS)
            current = min(current, served)
            peak = min(self.cap, served)
            if _MIN_FLOWING_SHARE * WINDOW_SECONDS <= flowing < (1.0 - _STORM_SHARE) * WINDOW_SECONDS:
                # The window held a storm that served nothing: what it served is less than the
                # limit by the storm's share. Come down to it (the provider may truly have lowered
                # its limit), but climb back to the rate served while calls flowed: a 429 that the
                # refusal rule took for the limit's (chance makes a run of random refusals now and
                # then) would otherwise leave the peak, and so the pace, far under the limit. Only
                # once calls flowed for a third of a window: sooner, they measure the burst that
                # the storm's end let through (two answers in 0.6 s read as 200 a minute under a
                # limit of 120, and the climb back to it brought 429s every ten seconds).
                peak = min(self.cap, max(peak, self._served_flowing / max(_MIN_MEASURE_SPAN, flowing)))
        self.rate = max(floor, decrease * current)
        self._peak = peak = max(peak, self.rate)
        self._slope = (peak - self.rate) / config.discovery_recovery_seconds
        self._probe_slope = config.discovery_probe * peak / WINDOW_SECONDS
        self._grown_at = now


def next_minute(after: float, wall_offset: float) -> float:
    """The first wall-clock ``:00`` (plus :data:`MINUTE_SLACK`) after ``after``, on the scope's clock."""
    wall = after + wall_offset
    boundary = (math.floor((wall - MINUTE_SLACK) / WINDOW_SECONDS) + 1) * WINDOW_SECONDS + MINUTE_SLACK
    return boundary - wall_offset


@final
class _Tally:
    """Events in the last window, counted per whole second (memory bounded by the window, not the rate)."""

    __slots__ = ("_buckets", "_total")

    def __init__(self) -> None:
        self._buckets: deque[list[float]] = deque()  # [second, count]
        self._total = 0

    def _prune(self, now: float) -> None:
        buckets = self._buckets
        while buckets and buckets[0][0] + WINDOW_SECONDS <= now:
            self._total -= int(buckets.popleft()[1])

    def add(self, now: float) -> None:
        second = math.floor(now)
        buckets = self._buckets
        if buckets and buckets[-1][0] == second:
            buckets[-1][1] += 1
        else:
            self._prune(now)
            buckets.append([second, 1])
        self._total += 1

    def count(self, now: float) -> int:
        self._prune(now)
        return self._total


