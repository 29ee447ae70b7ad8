"""The pure state machines behind each quota of a scope: requests per minute, tokens per minute, cooldown.

Over 400 lines because each rule keeps its why beside it, and the three cores share one time model
(half-open windows, ``NOW``/``NEVER``, a fit derived from ``ready_at``) that is clearest in one place.

Each core is synchronous, takes ``now`` (seconds on any monotonic clock)
explicitly and never touches an event loop, so ``hypothesis.stateful`` can
drive it directly. Each answers two questions with one expression:
``ready_at(...)`` is the earliest time the request could be admitted if
nothing else changed, and a request *fits* exactly when ``ready_at(...) <= now``.
Deriving the check from the ready time (rather than writing both) is what keeps
a waiter that sleeps until its ready time from waking to a failed check and
spinning on float rounding.

Windows are half-open: a charge at ``t`` counts in every window
``[s, s + 60)`` with ``s <= t < s + 60``, and stops counting at ``t + 60``.
A request is charged from its admission until a window after its call *ended*
(see :class:`RequestRateCore`).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Final, final

import anyio

from .._values._config import RateLimitConfig
from .._values._errors import ConfigurationError

__all__ = [
    "PACE_CREDIT", "WINDOW_SECONDS", "CooldownCore", "RequestRateCore", "TokenRateCore", "TokenReservation",
]

WINDOW_SECONDS: Final = 60.0
PACE_CREDIT: Final = 3.0
"""Seconds of pace an idle scope may bank (5 % of a window's worth), and the slack for late wake-ups."""
# Why 3 s: a paced scope admits at ``tat - PACE_CREDIT``, so a waiter that wakes a little late
# (a busy event loop, a coarse timer) does not push every later call back by its lateness; and a
# scope idle for a while may start a few calls at once, which no provider's per-minute window
# notices, but never a window's worth: the credit is 5 % of it, far under any pacing margin.
NEVER: Final = math.inf
"""A ready time that only an event (a release), not the clock, can bring closer."""
NOW: Final = -math.inf
"""A ready time that has already passed: the request fits."""


@final
class RequestRateCore:
    """Requests per minute, counted as the provider counts them: from arrival, for a window.

    A request reaches the provider at some moment between its admission and the
    end of its call, and is counted there for 60 s from that moment. Counting
    it here from admission to 60 s after admission is not enough: transit times
    vary, so a burst admitted as old stamps expire can land in one provider
    window together with the stragglers of the burst before it. So a request
    counts from its admission until ``window`` seconds after its call *ended*
    (:meth:`end`); one that never reached the provider stops counting at once
    (:meth:`refund`). Since every arrival lies inside that span, the provider
    never sees more than ``limit`` arrivals in any window. The price is each
    call's own duration per window of quota.

    ``limit = max(1, floor(rpm))`` requests in any window of
    ``window = max(60, 60 / rpm)`` seconds. For ``rpm >= 1`` that is the exact
    invariant "at most rpm requests in any 60 s window": no schedule can admit
    a fractional request, so a fractional part above 1 is unusable without
    breaking it (2.5 rpm runs as 2 per minute). Below 1 rpm it is one request
    per ``60 / rpm`` seconds, the nearest thing to 0.5 requests a minute.

    ``burst`` (optional) smooths admissions: at most ``burst`` admissions in
    any ``window * burst / limit`` seconds, so ``burst=1`` paces requests evenly
    instead of letting the whole minute's quota go at once.
    """

    __slots__ = (
        "_admitted", "_burst", "_burst_window", "_ended", "_open", "limit", "requests_per_minute", "window",
    )

    def __init__(self, requests_per_minute: float, *, burst: int | None = None) -> None:
        if isinstance(requests_per_minute, bool) or not isinstance(requests_per_minute, (int, float)):
            raise ConfigurationError("requests_per_minute", requests_per_minute, "must be a number")
        if not math.isfinite(requests_per_minute) or requests_per_minute <= 0:
            raise ConfigurationError("requests_per_minute", requests_per_minute, "must be finite and > 0")
        if burst is not None and (isinstance(burst, bool) or not isinstance(burst, int) or burst < 1):
            raise ConfigurationError("request_burst", burst, "must be a whole number >= 1")
        self.requests_per_minute = float(requests_per_minute)
        self.limit: int = max(1, math.floor(requests_per_minute))
        self.window: float = max(WINDOW_SECONDS, WINDOW_SECONDS * self.limit / requests_per_minute)
        self._burst = burst if burst is not None and burst < self.limit else None
        self._burst_window = self.window * (self._burst or 1) / self.limit
        # A call counts from admission to a window after it *ended* (the class docstring): an open
        # call is not stamped, since when it reaches the provider is unknown until it ends.
        self._open = 0  # admitted, call not ended: counts however long it takes
        # End times of calls that ended less than a window ago: non-decreasing
        # (appended at the clock's now), so the head is the next to leave.
        self._ended: deque[float] = deque()
        self._admitted: deque[float] = deque(maxlen=self._burst)  # recent admissions, for the burst pace

    def _prune(self, now: float) -> None:
        ended, window = self._ended, self.window
        while ended and ended[0] + window <= now:
            ended.popleft()

    def ready_at(self, now: float) -> float:
        ended = self._ended
        if ended and ended[0] + self.window <= now:
            self._prune(now)
        ready = NOW
        excess = self._open + len(ended) + 1 - self.limit
        if excess > 0:
            # Enough ended calls must leave the window; calls still open leave only by ending.
            ready = ended[excess - 1] + self.window if excess <= len(ended) else NEVER
        burst = self._burst
        if burst is not None and len(self._admitted) >= burst:
            ready = max(ready, self._admitted[0] + self._burst_window)
        return ready

    def try_admit_nowait(self, now: float) -> float:
        """Admit one request at ``now`` and return its stamp; ``anyio.WouldBlock`` if it does not fit."""
        if self.ready_at(now) > now:
            raise anyio.WouldBlock
        return self.commit(now)

    def commit(self, now: float) -> float:
        """Record an admission the caller has already checked with :meth:`ready_at`."""
        self._open += 1
        if self._burst is not None:
            self._admitted.append(now)
        return now

    def end(self, now: float) -> None:
        """A call ended, whatever its outcome (a 429 too): it counts until a window from ``now``."""
        self._open -= 1
        self._ended.append(now)

    def refund(self, stamp: float, now: float) -> None:
        """Forget the open admission made at ``stamp``: its request never reached the provider."""
        self._open -= 1
        if self._burst is not None:
            # Equal stamps are interchangeable. A stamp the bounded log already
            # pushed out is older than all it keeps, and the admission that
            # pushed it out waited until it was a burst window old: forgetting
            # it loosens nothing.
            try:
                self._admitted.remove(stamp)
            except ValueError:
                pass

    def requests_in_window(self, now: float) -> int:
        """Requests the provider may be counting now: calls open, and calls ended within a window."""
        self._prune(now)
        return self._open + len(self._ended)


@final
class TokenReservation:
    """One entry of the token log: ``amount`` tokens charged at ``time``."""

    __slots__ = ("amount", "live", "reserved", "settled", "time")

    def __init__(self, time: float, amount: int) -> None:
        self.time = time
        self.amount = amount  # what the window is charged now (after refunds)
        self.reserved = amount  # what was reserved at admission
        self.live = True  # False once it has left the window
        self.settled = False  # reconciled or refunded: later calls are no-ops


@final
class TokenRateCore:
    """Tokens per minute as a log of reservations that are reconciled after the call.

    A request reserves ``min(estimate, tokens_per_minute)`` before its call,
    and fits when the reservations still in the window plus its own stay within
    ``tokens_per_minute``. An estimate larger than the whole quota is clamped to
    it, so that request runs alone in an otherwise empty window instead of
    waiting forever; its real usage is then charged as debt.

    After the call, :meth:`reconcile` compares real usage with the reservation:
    less refunds the difference (while the reservation is still in the window),
    more charges the excess as a new entry at the time it became known (debt
    that later requests wait out), and unknown usage (``None``) keeps the
    reservation as it is: unknown is never taken for zero.
    """

    __slots__ = ("_log", "_total", "tokens_per_minute")

    def __init__(self, tokens_per_minute: int) -> None:
        if isinstance(tokens_per_minute, bool) or not isinstance(tokens_per_minute, int):
            raise ConfigurationError("tokens_per_minute", tokens_per_minute, "must be a whole number")
        if tokens_per_minute < 1:
            raise ConfigurationError("tokens_per_minute", tokens_per_minute, "must be >= 1")
        self.tokens_per_minute = tokens_per_minute
        self._log: deque[TokenReservation] = deque()
        self._total = 0

    def reservation_size(self, estimate: int) -> int:
        # Clamped to the whole quota: a request estimated above it could never fit and would wait
        # forever; clamped, it runs alone in an empty window and its excess is charged as debt.
        if estimate < 0:
            raise ValueError(f"tokens={estimate!r}: must be >= 0")
        return min(estimate, self.tokens_per_minute)

    def _prune(self, now: float) -> None:
        log = self._log
        while log and log[0].time + WINDOW_SECONDS <= now:
            entry = log.popleft()
            entry.live = False
            self._total -= entry.amount

    def ready_at(self, estimate: int, now: float) -> float:
        self._prune(now)
        excess = self._total + self.reservation_size(estimate) - self.tokens_per_minute
        if excess <= 0:
            return NOW
        # Walk the oldest entries until enough of them will have left the window.
        freed = 0
        for entry in self._log:
            freed += entry.amount
            if freed >= excess:
                return entry.time + WINDOW_SECONDS
        raise AssertionError("unreachable: a reservation never exceeds tokens_per_minute")

    def try_admit_nowait(self, estimate: int, now: float) -> TokenReservation:
        """Reserve tokens at ``now``; raise ``anyio.WouldBlock`` if they do not fit."""
        if self.ready_at(estimate, now) > now:
            raise anyio.WouldBlock
        return self.commit(estimate, now)

    def commit(self, estimate: int, now: float) -> TokenReservation:
        entry = TokenReservation(now, self.reservation_size(estimate))
        self._log.append(entry)
        self._total += entry.amount
        return entry

    def reconcile(self, reservation: TokenReservation, actual: int | None, now: float) -> int:
        """Settle ``reservation`` against real usage; return the tokens charged beyond it (debt)."""
        if reservation.settled:
            return 0
        reservation.settled = True
        if actual is None:
            return 0  # unknown usage is never taken for zero: the reservation stays charged
        self._prune(now)
        if actual < reservation.reserved:
            self._refund(reservation, reservation.reserved - max(actual, 0))
            return 0
        # More than reserved: the excess is charged *now*, when it became known, not back at the
        # admission: back-dating would let it leave the window sooner than the provider forgets it.
        debt = actual - reservation.reserved
        if debt:
            self._log.append(TokenReservation(now, debt))
            self._total += debt
        return debt

    def refund(self, reservation: TokenReservation, now: float) -> None:
        """Return the whole reservation: its call never reached the provider."""
        if reservation.settled:
            return
        reservation.settled = True
        self._prune(now)
        self._refund(reservation, reservation.reserved)

    def _refund(self, reservation: TokenReservation, tokens: int) -> None:
        # An entry that already left the window frees nothing: its tokens no longer count.
        if reservation.live:
            tokens = min(tokens, reservation.amount)
            reservation.amount -= tokens
            self._total -= tokens

    def reserved_in_window(self, now: float) -> int:
        self._prune(now)
        return self._total

    def available(self, now: float) -> int:
        return max(0, self.tokens_per_minute - self.reserved_in_window(now))


@final
class CooldownCore:
    """One coordinated cooldown per quota scope, then a linear slow-start ramp.

    A rate-limit report starts a cooldown unless the storm already has one:

    - while a cooldown runs, reports join it (a Retry-After can push its end
      later, to ``now + retry_after``; nothing is added end to end);
    - a report from a call admitted *before* the latest cooldown began
      (``admitted_generation`` older than :attr:`generation`) belongs to a
      storm already answered: it is ignored, except that a Retry-After pauses
      admission until ``now + retry_after`` if that is later;
    - otherwise a new cooldown starts: Retry-After seconds when given (the
      provider's word, not capped), else ``cooldown_seconds *
      backoff_multiplier ** level`` capped at ``max_cooldown_seconds``.
      ``level`` grows by one for each new cooldown that starts within the
      previous one's aftermath (its ramp, and at least its own length, after
      it ended), and resets to 0 otherwise.

    During the cooldown the concurrency limit is 0. After it, the limit starts
    at ``max(1, ceil(fraction * bound))`` and reaches ``bound`` linearly over
    ``slow_start_seconds``, one step at a time.
    """

    __slots__ = ("_aftermath_end", "_config", "_level", "_until", "generation", "ramp_end")

    def __init__(self, config: RateLimitConfig) -> None:
        self._config = config
        self._until = NOW  # admission paused while now < _until
        self.ramp_end = NOW
        """The limit is below the bound while ``now < ramp_end`` (read on the hot path; never set it)."""
        self._aftermath_end = NOW
        self._level = 0
        self.generation = 0  # bumped by each new cooldown

    def report(
        self, retry_after: float | None, now: float, *, admitted_generation: int | None = None
    ) -> bool:
        """Record a rate-limit failure; return whether it started a new cooldown."""
        if retry_after is not None and not math.isfinite(retry_after):
            retry_after = None  # a garbage header is no better than none
        elif retry_after is not None:
            retry_after = max(0.0, retry_after)
        # The generation tells one storm from the next. Calls admitted before the latest cooldown
        # began were sent into the storm that started it; their 429s arrive during or after that
        # cooldown and say nothing new. Were each to start (or add to) a cooldown, a batch of 200
        # calls in flight would pause the scope 200 times over for one refusal.
        stale = admitted_generation is not None and admitted_generation < self.generation
        if now < self._until or stale:
            # Joined, not added end to end. Only the provider's own word may push the end later:
            # its Retry-After is when it will take calls again, whoever asked.
            if retry_after is not None and now + retry_after > self._until:
                self._pause_until(now + retry_after)
            return False
        # Backoff grows only for storms that follow each other (within the last one's aftermath:
        # its ramp, and at least its own length): one 429 an hour must not grow a cooldown forever.
        self._level = self._level + 1 if now < self._aftermath_end else 0
        config = self._config
        if retry_after is not None:
            # The provider's word, not capped by max_cooldown_seconds: starting earlier than it
            # said only buys more 429s (and, with some providers, a longer ban).
            duration = retry_after
        else:
            try:
                grown = config.cooldown_seconds * config.backoff_multiplier**self._level
            except OverflowError:
                grown = math.inf
            duration = min(config.max_cooldown_seconds, grown)
        self.generation += 1  # grants made from now on belong to the new storm (see ``stale``)
        self._pause_until(now + duration)
        self._aftermath_end = self._until + max(config.slow_start_seconds, duration)
        return True

    def _pause_until(self, until: float) -> None:
        # The ramp always follows the pause: resuming at full concurrency would send a whole
        # bound of calls into a provider that has just refused, and likely start the next storm.
        self._until = until
        self.ramp_end = until + self._config.slow_start_seconds

    def lift(self, generation: int, now: float) -> None:
        """End cooldown ``generation`` (if still the latest) and its ramp now: the report that began
        them proved to be a per-call refusal.

        The level stays (a storm soon after still grows the next cooldown); the generation too.
        """
        if generation != self.generation:
            return
        if self._until > now:
            self._until = now
        if self.ramp_end > now:
            self.ramp_end = now

    def ready_at(self, now: float) -> float:
        """When the pause ends (in the past when there is none)."""
        return self._until

    def active(self, now: float) -> bool:
        """Whether a cooldown or its ramp still limits admission."""
        return now < self.ramp_end

    def remaining(self, now: float) -> float:
        return max(0.0, self._until - now)

    def _ramp_shape(self, bound: int) -> tuple[int, int]:
        initial = min(bound, max(1, math.ceil(self._config.slow_start_initial_fraction * bound)))
        return initial, bound - initial

    def _step_time(self, step: int, steps: int) -> float:
        # The time the limit reaches initial + step; the last step is exactly
        # ramp_end so that "ramp over" and "limit == bound" agree.
        if step >= steps:
            return self.ramp_end
        return self._until + self._config.slow_start_seconds * step / steps

    def concurrency_limit(self, bound: int, now: float) -> int:
        """The effective concurrency bound at ``now``: 0 while paused, ramping after."""
        if now >= self.ramp_end:
            return bound
        if now < self._until:
            return 0
        initial, steps = self._ramp_shape(bound)
        if steps == 0:
            return bound
        span = self._config.slow_start_seconds
        step = min(steps - 1, max(0, math.floor(steps * (now - self._until) / span)))
        # Settle rounding against the same expression the ready time uses.
        while step + 1 < steps and self._step_time(step + 1, steps) <= now:
            step += 1
        while step > 0 and self._step_time(step, steps) > now:
            step -= 1
        return initial + step

    def concurrency_ready_at(self, bound: int, in_flight: int, now: float) -> float:
        """When the effective bound first exceeds ``in_flight`` (never, if the bound itself doesn't)."""
        if in_flight >= bound:
            return NEVER
        if self.concurrency_limit(bound, now) > in_flight:
            return NOW
        initial, steps = self._ramp_shape(bound)
        step = in_flight + 1 - initial
        if step <= 0 or steps == 0:
            return self._until
        return self._step_time(step, steps)
