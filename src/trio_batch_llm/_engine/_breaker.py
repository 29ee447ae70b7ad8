"""The circuit breaker of one quota scope: a synchronous state machine over (state, now, outcome).

It never awaits, owns no task and reads no clock (``now`` is passed in), so it is
tested without an event loop (:mod:`._breaker_gate` is its async side). The states:

- ``closed``: calls go. An attempt that fails with an endpoint-unusable error
  (:attr:`Classification.endpoint_unusable`) adds one to the streak; any other
  outcome (an answer, a 5xx, a 429, a timeout: the endpoint was reached or may
  have been) ends the streak. While a streak has begun, and at the start until
  the endpoint has answered once (for ``pause`` seconds at most: a refusal comes
  within a round trip, and a slow endpoint must not run at ``threshold`` calls
  for long), at most ``threshold`` attempts are counted or in flight together
  (``streak + unresolved <= threshold``), so a dead endpoint costs ``threshold``
  attempts, not one per worker and retry.
- ``open`` (the streak reached ``threshold``): nothing goes until ``pause`` seconds
  have passed; waiting items spend no attempts.
- ``half_open``: one probe goes, the rest wait. Its answer (or any non-unusable
  outcome) closes the breaker; an endpoint-unusable failure re-opens it, and after
  ``probes`` failed probes the scope is
- ``retired``: nothing goes again in this owner; every item that asks ends with
  ``StopReason.PROVIDER_RETIRED``.

Invariant (tested with hypothesis): after the first endpoint-unusable failure
that follows the last other outcome, at most ``threshold + probes`` attempts start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal, final

from .._values._breaker_config import CircuitBreakerConfig

__all__ = ["GO", "PROBE", "RETIRED", "BreakerState", "CircuitBreaker", "Gate", "Trip"]

BreakerState = Literal["closed", "open", "half_open", "retired"]


@final
@dataclass(frozen=True, slots=True)
class Gate:
    """What :meth:`CircuitBreaker.gate` answered: go, go as the probe, wait until ``until``, or retired."""

    kind: Literal["go", "probe", "wait", "retired"]
    until: float = math.inf


GO: Final = Gate("go")
PROBE: Final = Gate("probe")
RETIRED: Final = Gate("retired")
_WAIT_FOR_AN_OUTCOME: Final = Gate("wait")


@final
@dataclass(frozen=True, slots=True)
class Trip:
    """Why the breaker opened: the first error of the streak, and the item whose failure opened it."""

    cause: str
    """What the first error said about the endpoint ("connection refused", "HTTP 401", ...)."""
    first_error: str
    item_id: str | None
    failures: int


@final
class CircuitBreaker:
    """One scope's breaker. :meth:`gate` before an attempt; then exactly one of :meth:`answered`,
    :meth:`failed` or :meth:`released` for every attempt it let go."""

    __slots__ = ("_cause", "_cold_until", "_first", "_open_until", "_probes_failed", "_probing", "_proven",
                 "config", "state", "streak", "trip", "unresolved")

    def __init__(self, config: CircuitBreakerConfig) -> None:
        self.config = config
        self.state: BreakerState = "closed"
        self.streak = 0
        """Endpoint-unusable failures in a row (closed state)."""
        self.unresolved = 0
        """Attempts let go whose outcome is not known yet."""
        self.trip: Trip | None = None
        """Set when the breaker opened (kept when it is retired); ``None`` once it closes again."""
        self._first: str | None = None
        self._cause = ""
        self._proven = False
        self._cold_until = math.nan  # the end of the start's bound: set at the first gate()
        self._open_until = math.inf
        self._probes_failed = 0
        self._probing = False

    @property
    def open_until(self) -> float:
        """When an open breaker lets its probe go (``inf`` unless open)."""
        return self._open_until if self.state == "open" else math.inf

    def gate(self, now: float) -> Gate:
        """May an attempt start at ``now``? ``go``/``probe`` count it as started."""
        state = self.state
        if state == "closed":
            if self.streak + self.unresolved >= self.config.threshold and (self.streak or not self._proven):
                if self.streak:
                    return _WAIT_FOR_AN_OUTCOME
                if math.isnan(self._cold_until):  # the first attempt asks now
                    self._cold_until = now + self.config.pause
                if now < self._cold_until:
                    return Gate("wait", self._cold_until)
                self._proven = True  # no refusal in a pause's time: the endpoint is there
            elif math.isnan(self._cold_until):
                self._cold_until = now + self.config.pause
            self.unresolved += 1
            return GO
        if state == "retired":
            return RETIRED
        if state == "open":
            if now < self._open_until:
                return Gate("wait", self._open_until)
            self.state = "half_open"
        if self._probing:
            return _WAIT_FOR_AN_OUTCOME
        self._probing = True
        self.unresolved += 1
        return PROBE

    def answered(self, *, probe: bool = False) -> bool:
        """An attempt reached the endpoint (it answered, or failed in a way that says it is usable).

        Closes the breaker unless it is retired; returns whether the state changed."""
        self.unresolved -= 1
        if probe:
            self._probing = False
        self._proven = True
        self.streak = 0
        self._first = None
        if self.state in ("open", "half_open"):
            self.state = "closed"
            self.trip = None
            self._open_until = math.inf
            self._probes_failed = 0
            self._probing = False
            return True
        return False

    def failed(self, now: float, error: str, item_id: str | None, *, probe: bool = False,
               cause: str = "endpoint unusable") -> bool:
        """An attempt failed with an endpoint-unusable error; returns whether the state changed."""
        self.unresolved -= 1
        state = self.state
        if probe:
            self._probing = False
            if state != "half_open":
                return False  # the breaker was closed meanwhile by another answer
            self._probes_failed += 1
            if self._probes_failed >= self.config.probes:
                self.state = "retired"
            else:
                self.state = "open"
                self._open_until = now + self.config.pause
            return True
        if state != "closed":
            return False  # a straggler let go before the breaker opened: it was counted already
        self.streak += 1
        if self._first is None:
            self._first, self._cause = error, cause
        if self.streak < self.config.threshold:
            return False
        self.trip = Trip(self._cause, self._first, item_id, self.streak)
        self.state = "open"
        self._open_until = now + self.config.pause
        return True

    def released(self, *, probe: bool = False) -> bool:
        """An attempt let go ended without an outcome (cut short, refused by the quota scope).

        Returns whether a waiter may go now."""
        self.unresolved -= 1
        if probe:
            self._probing = False
        return True
