"""Whether a quota scope is throttled: the streak of 429s it is in, its stall warning, its waiters' bounds.

A scope is *refusing* from a 429 on until its provider answers a call with
anything else: :attr:`ThrottleWatch.refusing_since` is when the streak began.
Three things read it:

- the stall WARNING: once a streak (or a cooldown it started) has lasted
  :data:`STALL_SECONDS`, once per streak; a new streak may warn again;
- a waiter's bound (``RetryConfig.max_rate_limit_wait``): a waiter gives up
  :meth:`give_up_at` (:class:`ThrottleBudgetSpent`), counted from its own
  last 429, else from when it queued or the streak began, whichever is later;
  behind a streak already longer than the bound, at once unless first in line;
- statistics and progress: how long the scope has refused every call.

Synchronous and clock-free like the other cores (``now`` is passed in), so no
timer exists: the scope checks :meth:`check` when something happens (a 429, a
waiter waking), and the first waiter in line sleeps no later than :meth:`check_at`.
The methods that log or wake return the tickets whose events the scope must set.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, final

from .._observe._log import PaceWatch, log_first_rate_limit, log_stall
from ._records import Ticket

if TYPE_CHECKING:
    from ._core import QuotaCore

__all__ = ["STALL_SECONDS", "ThrottleBudget", "ThrottleBudgetSpent", "ThrottleWatch"]

STALL_SECONDS: Final = 60.0
"""A streak of refusals this long is a stall: logged once as a WARNING."""


class ThrottleBudgetSpent(Exception):
    """A waiter's ``max_rate_limit_wait`` ran out while it waited for admission."""

    def __init__(self, throttled: float, streak: float | None = None) -> None:
        super().__init__(f"throttled for {throttled:.3g} s")
        self.throttled = throttled
        """Seconds this wait counted as throttled (from its start, or the streak's, to now)."""
        self.streak = streak
        """Set when the waiter gave up at once, behind a streak of refusals already longer than its
        bound: how long the scope had refused every call (the waiter itself waited for nothing)."""


@final
class ThrottleBudget:
    """What a waiter may still spend throttled: ``seconds`` from ``since`` (its own last 429), or,
    with ``since=None``, from when it queued or its scope began refusing, whichever is later."""

    __slots__ = ("seconds", "since")

    def __init__(self, seconds: float, since: float | None = None) -> None:
        self.seconds = seconds
        self.since = since


@final
class ThrottleWatch:
    """One scope's refusal streak and what has been said about it (see the module docstring)."""

    __slots__ = ("rate_limits", "refusals", "refusing_since", "shortest_budget", "warned", "woken")

    def __init__(self) -> None:
        self.refusing_since: float | None = None
        """When the current streak of 429s began; ``None``: the last answer was not a 429."""
        self.refusals = 0
        """429s in the current streak."""
        self.rate_limits = 0
        """429s ever reported to the scope (the first is logged at INFO)."""
        self.warned = False
        """The current streak's stall WARNING was logged."""
        self.woken = False
        """The current streak woke its waiters once, to bound their wait (:meth:`due`)."""
        self.shortest_budget = math.inf
        """The smallest ``max_rate_limit_wait`` any waiter brought: when waiters must first look."""

    def refused(self, now: float) -> bool:
        """A 429 at ``now``; return whether it is the scope's first."""
        first = self.rate_limits == 0
        self.rate_limits += 1
        if self.refusing_since is None:
            self.refusing_since = now
            self.refusals = 0
            self.warned = self.woken = False
        self.refusals += 1
        return first

    def joined(self, now: float) -> None:
        """Another process sharing the scope's limit cooled down: throttled here too (not a 429 of ours)."""
        if self.refusing_since is None:
            self.refusing_since = now
            self.warned = self.woken = False

    def refused_by(self, before: PaceWatch, name: str | None, core: QuotaCore, now: float,
                   retry_after: float | None, wait: float) -> Sequence[Ticket]:
        """A 429 reached the scope: log what it changed (the first 429 at INFO, always), then the stall."""
        first = self.refused(now)
        if not before.log_changes(name, core, now, retry_after) and first:
            log_first_rate_limit(name or "-", retry_after, wait)
        return self.check(name, core, now)

    def check(self, name: str | None, core: QuotaCore, now: float) -> Sequence[Ticket]:
        """The stall WARNING when due; the waiters to wake when their bounds may have come."""
        warn, wake = self.due(now)
        if warn:
            log_stall(name or "-", self.refusing_for(now), self.refusals, len(core.queue), core.in_flight)
        return list(core.queue) if wake else ()

    def bound(self, ticket: Ticket, budget: ThrottleBudget, now: float) -> None:
        """``ticket`` queues now with ``budget``: it gives up past :meth:`give_up_at`."""
        ticket.throttle = budget
        ticket.enqueued = now
        if budget.seconds < self.shortest_budget:
            self.shortest_budget = budget.seconds

    def answered(self) -> None:
        """A call got an answer other than a 429: calls flow again, the streak is over."""
        self.refusing_since = None

    def refusing_for(self, now: float) -> float:
        """Seconds the current streak has lasted (0: none)."""
        since = self.refusing_since
        return 0.0 if since is None else max(0.0, now - since)

    def check_at(self) -> float:
        """When the scope must next look at :meth:`due` if nothing happens first (``inf``: never)."""
        since = self.refusing_since
        if since is None:
            return math.inf
        at = math.inf
        if not self.warned:
            at = since + STALL_SECONDS
        if not self.woken and since + self.shortest_budget < at:
            at = since + self.shortest_budget
        return at

    def due(self, now: float) -> tuple[bool, bool]:
        """``(warn, wake)``: log the stall WARNING; wake the waiters to bound their wait. Once a streak."""
        since = self.refusing_since
        if since is None:
            return False, False
        warn = not self.warned and now >= since + STALL_SECONDS
        wake = not self.woken and now >= since + self.shortest_budget
        self.warned |= warn
        self.woken |= wake
        return warn, wake

    def throttled_since(self, ticket: Ticket) -> float | None:
        """When the wait of ``ticket`` (bounded) began to count as throttled (``None``: it does not)."""
        budget: ThrottleBudget = ticket.throttle
        if budget.since is not None:
            return budget.since
        since = self.refusing_since
        return None if since is None else max(since, ticket.enqueued)

    def give_up_at(self, ticket: Ticket, now: float, *, head: bool = True) -> float:
        """When bounded ``ticket`` gives up (``inf``: not throttled); past it, ``ThrottleBudgetSpent``.

        Behind a streak already longer than its bound, a waiter with no 429 of its own that is
        not first in line gives up at once: the scope has refused every call for longer than this
        item may wait, so a batch against an endpoint that refuses everything ends within about one
        bound rather than one bound per wave of workers. The first in line still waits its own
        bound and is admitted when the scope is ready: the probe that ends the streak when the
        provider comes back (a long-lived pool is never shut out for good).
        """
        budget: ThrottleBudget = ticket.throttle
        streak_since = self.refusing_since
        if (not head and budget.since is None and streak_since is not None
                and now - streak_since >= budget.seconds):
            raise ThrottleBudgetSpent(0.0, streak=now - streak_since)
        since = self.throttled_since(ticket)
        if since is None:
            return math.inf
        at: float = since + ticket.throttle.seconds
        if now >= at:
            raise ThrottleBudgetSpent(now - since)
        return at
