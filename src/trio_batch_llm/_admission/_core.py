"""One quota scope's combined state machine: every quota reserved atomically, waiters served FIFO.

:class:`QuotaCore` joins a concurrency bound, the optional RPM and TPM cores
and the cooldown core of :mod:`._limits`. Like them it is synchronous
and takes ``now`` explicitly. A request is admitted only when *all* its quotas
fit at once, and only in queue order: while anyone waits, a newcomer is not
admitted even if it would fit, so a large request at the head is never
starved by a stream of small ones behind it.

An admission is a :class:`Grant`, a frozen record of what the call holds (its
cooldown generation, its RPM stamp, its token reservation). Every change of
state is a core method taking the grant and ``now``; each grant is settled
exactly once, by :meth:`QuotaCore.release`, :meth:`~QuotaCore.release_rate_limited`
or :meth:`~QuotaCore.release_unused` (the async wrapper's handle makes that
idempotent for its callers).

Waiting is modelled with :class:`Ticket` objects. Every operation that can let
someone in (a release, a withdrawal, admitting waiters) admits as many tickets
from the head as now fit and returns the tickets whose owners must look again:
those it admitted, plus the new head, whose ready time may have changed. The
async wrapper (:mod:`._scope`) sets their events; the core never touches one.

The uncontended path (only the concurrency bound in force, nobody waiting)
needs no clock: :meth:`~QuotaCore.try_admit_uncontended` and
:meth:`~QuotaCore.release_uncontended` decide it without ``now``, and say so
when the answer depends on time, so the caller reads its clock only then.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, final

import anyio

from .._values._config import RateLimitConfig
from .._values._errors import AdmissionClosedError, ConfigurationError
from ._limits import NEVER, NOW, CooldownCore, RequestRateCore, TokenRateCore, TokenReservation

__all__ = ["Grant", "QuotaCore", "QuotaScopeStatistics", "Ticket"]


class Grant(NamedTuple):
    """What one admitted call holds in its scope: a frozen record, settled once by the core.

    A named tuple rather than a frozen dataclass because it is made on every
    admission that has an RPM or TPM limit, and a tuple is built about three
    times faster than a frozen dataclass (which sets each field through
    ``object.__setattr__``). Grants that hold nothing but a slot are shared.
    """

    generation: int
    """The scope's cooldown generation at admission (tells a stale 429 from a fresh one)."""
    request_stamp: float | None
    """The call's requests-per-minute stamp; ``None`` when the scope has no RPM limit."""
    token_reservation: TokenReservation | None
    """The call's token reservation; ``None`` when the scope has no TPM limit."""

    @property
    def tokens_reserved(self) -> int:
        """Tokens reserved for this call (0 when the scope has no token limit)."""
        reservation = self.token_reservation
        return 0 if reservation is None else reservation.reserved


_new_grant: Final = tuple.__new__  # skips the named tuple's own __new__: half the cost, same record
_NOTHING_TO_WAKE: Final[tuple[Ticket, ...]] = ()


@final
class Ticket:
    """A request waiting in a scope's FIFO queue."""

    __slots__ = ("event", "grant", "tokens")

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.grant: Grant | None = None  # set by the core when it admits this waiter
        self.event: Any = None  # the async wrapper's wake-up event; never touched by the core


@final
@dataclass(frozen=True, slots=True)
class QuotaScopeStatistics:
    """A snapshot of one quota scope. ``None`` means "no such limit is configured"."""

    in_flight: int
    waiting: int
    concurrency_bound: int
    concurrency_limit: int
    """The bound in force now: 0 during a cooldown, ramping back to the bound after it."""
    requests_per_minute: float | None
    requests_in_window: int | None
    tokens_per_minute: int | None
    tokens_reserved_in_window: int | None
    tokens_available: int | None
    cooldown_remaining: float
    admitted_total: int
    rate_limits_reported: int
    closed: bool


def check_tokens(tokens: int) -> None:
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens={tokens!r}: must be a whole number >= 0")


@final
class QuotaCore:
    """The synchronous machine behind a quota scope (see the module docstring).

    ``fast`` is true only when nothing but the concurrency bound can refuse a
    request (no RPM, no TPM, no cooldown or ramp, not closed): a rate-limit
    report or a close clears it, and the first timed admission after the ramp
    sets it again.
    """

    __slots__ = (
        "_bare", "admitted_total", "bound", "closed", "cooldown", "fast", "in_flight", "queue",
        "rate_limits_reported", "requests", "tokens",
    )

    def __init__(
        self,
        *,
        concurrency: int,
        requests_per_minute: float | None = None,
        tokens_per_minute: int | None = None,
        rate_limit: RateLimitConfig | None = None,
        request_burst: int | None = None,
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigurationError("concurrency", concurrency, "must be a whole number >= 1")
        self.bound = concurrency
        self.in_flight = 0
        self.requests = (
            None if requests_per_minute is None
            else RequestRateCore(requests_per_minute, burst=request_burst)
        )
        self.tokens = None if tokens_per_minute is None else TokenRateCore(tokens_per_minute)
        self.cooldown = CooldownCore(rate_limit or RateLimitConfig())
        self.queue: deque[Ticket] = deque()
        self.closed = False
        self.admitted_total = 0
        self.rate_limits_reported = 0
        self.fast = self.requests is None and self.tokens is None
        # The grant of a call that holds only a slot, shared: immutable, and the same for
        # every such admission of one cooldown generation.
        self._bare = Grant(self.cooldown.generation, None, None)

    def ready_at(self, tokens: int, now: float) -> float:
        """When a request for ``tokens`` at the head of the queue could be admitted.

        ``<= now`` means it fits now; ``math.inf`` means only a release can help.
        """
        # The latest of every quota's ready time. Inline tests rather than max() and
        # cooldown.active(): every timed admission passes here.
        cooldown = self.cooldown
        if now < cooldown.ramp_end:
            ready = max(
                cooldown.ready_at(now), cooldown.concurrency_ready_at(self.bound, self.in_flight, now)
            )
        else:
            ready = NOW if self.in_flight < self.bound else NEVER
        requests = self.requests
        if requests is not None:
            at = requests.ready_at(now)
            if at > ready:
                ready = at
        reserve = self.tokens
        if reserve is not None:
            at = reserve.ready_at(tokens, now)
            if at > ready:
                ready = at
        return ready

    # -- admission ---------------------------------------------------------

    def _commit(self, tokens: int, now: float) -> Grant:
        self.in_flight += 1
        self.admitted_total += 1
        requests, reserve = self.requests, self.tokens
        if requests is None and reserve is None:
            return self._bare
        stamp = None if requests is None else requests.commit(now)
        reservation = None if reserve is None else reserve.commit(tokens, now)
        grant: Grant = _new_grant(Grant, (self.cooldown.generation, stamp, reservation))
        return grant

    def try_admit_uncontended(self) -> Grant | None:
        """The fast path, decided without a clock: admit when only a free slot is needed.

        ``None`` when the answer depends on time (an RPM or TPM limit, a
        cooldown or its ramp) or on others (someone waits, the scope is
        closed): then ask :meth:`try_admit_nowait` with ``now``.
        """
        if self.fast and self.in_flight < self.bound and not self.queue:
            self.in_flight += 1
            self.admitted_total += 1
            return self._bare
        return None

    def try_admit_nowait(self, tokens: int, now: float) -> Grant:
        """Admit at once or raise ``anyio.WouldBlock`` (also when others are already waiting)."""
        if self.closed:
            raise AdmissionClosedError("quota scope is closed")
        if tokens.__class__ is not int or tokens < 0:
            check_tokens(tokens)  # raises, unless tokens is a subclass of int
        if not self.fast and self.requests is None and self.tokens is None:
            self.fast = not self.cooldown.active(now)  # the ramp is over: the fast path reopens
        if self.queue or self.ready_at(tokens, now) > now:
            raise anyio.WouldBlock
        return self._commit(tokens, now)

    def enqueue(self, tokens: int) -> Ticket:
        """Join the back of the queue; :meth:`admit_waiters` admits, :meth:`withdraw` leaves."""
        if self.closed:
            raise AdmissionClosedError("quota scope is closed")
        check_tokens(tokens)
        ticket = Ticket(tokens)
        self.queue.append(ticket)
        return ticket

    def admit_waiters(self, now: float) -> Sequence[Ticket]:
        """Admit waiters from the head while they fit; return the tickets to wake."""
        queue = self.queue
        if not queue or self.closed:
            return _NOTHING_TO_WAKE
        woken: list[Ticket] = []
        while queue:
            head = queue[0]
            woken.append(head)
            if self.ready_at(head.tokens, now) > now:
                break  # the head stays; it is woken to compute its new ready time
            queue.popleft()
            head.grant = self._commit(head.tokens, now)
        return woken

    def withdraw(self, ticket: Ticket, now: float) -> Sequence[Ticket]:
        """Take a waiter that gave up (cancelled, closed) out, refunding anything it was granted."""
        grant = ticket.grant
        if grant is not None:
            ticket.grant = None
            return self.release_unused(grant, now)
        queue = self.queue
        if queue and queue[0] is ticket:
            queue.popleft()
            return self.admit_waiters(now)
        try:
            queue.remove(ticket)
        except ValueError:
            pass  # already gone (for example, withdrawn twice)
        return _NOTHING_TO_WAKE

    # -- settling a grant (each exactly once) -------------------------------

    def release_uncontended(self, grant: Grant) -> bool:
        """The fast path of :meth:`release`, decided without a clock; ``False``: call that instead.

        Frees the slot when there is nothing to settle (no RPM or TPM limit)
        and nobody to wake.
        """
        if self.requests is None and self.tokens is None and not self.queue:
            self.in_flight -= 1
            return True
        return False

    def release(self, grant: Grant, actual_tokens: int | None, now: float) -> Sequence[Ticket]:
        """The call is over: free the slot, settle tokens with real usage; return the tickets to wake.

        ``actual_tokens`` is the call's real total; ``None`` (unknown) keeps
        the reservation, since unknown usage is never taken for zero. The RPM
        unit keeps counting for a window from ``now``, the call's end.
        """
        self.in_flight -= 1
        # Every grant of a scope with an RPM (TPM) limit holds a unit (a reservation).
        requests = self.requests
        if requests is not None:
            requests.end(now)  # it reached the provider (a 429 too): counts a window on from here
        reserve = self.tokens
        if reserve is not None:
            reservation = grant.token_reservation
            if reservation is not None:
                reserve.reconcile(reservation, actual_tokens, now)
        return self.admit_waiters(now) if self.queue else _NOTHING_TO_WAKE

    def release_rate_limited(
        self, grant: Grant, retry_after: float | None, actual_tokens: int | None, now: float
    ) -> Sequence[Ticket]:
        """The call was rate limited (a 429): start or join the cooldown, *then* release.

        In that order, so the freed slot cannot go to a waiter ahead of the
        cooldown. The 429 did reach the provider: its RPM unit counts as after
        :meth:`release`.
        """
        self.report_rate_limit(retry_after, now, admitted_generation=grant.generation)
        return self.release(grant, actual_tokens, now)

    def release_unused(self, grant: Grant, now: float) -> Sequence[Ticket]:
        """The call never reached the provider: free the slot, refund the RPM unit and every token."""
        self.in_flight -= 1
        _, stamp, reservation = grant
        if stamp is not None and self.requests is not None:
            self.requests.refund(stamp, now)
        if reservation is not None and self.tokens is not None:
            self.tokens.refund(reservation, now)
        return self.admit_waiters(now)

    # -- rate limits and lifecycle -------------------------------------------

    def report_rate_limit(
        self, retry_after: float | None, now: float, *, admitted_generation: int | None = None
    ) -> bool:
        """Start or join the scope's cooldown; return whether a new one started."""
        self.rate_limits_reported += 1
        started = self.cooldown.report(retry_after, now, admitted_generation=admitted_generation)
        if started:
            self._bare = Grant(self.cooldown.generation, None, None)
        self.fast = False
        return started

    def close(self) -> Sequence[Ticket]:
        """Refuse new requests; return every waiter, to be woken into AdmissionClosedError."""
        self.closed = True
        self.fast = False
        return list(self.queue)

    def statistics(self, now: float) -> QuotaScopeStatistics:
        requests, tokens = self.requests, self.tokens
        return QuotaScopeStatistics(
            in_flight=self.in_flight,
            waiting=len(self.queue),
            concurrency_bound=self.bound,
            concurrency_limit=self.cooldown.concurrency_limit(self.bound, now),
            requests_per_minute=None if requests is None else requests.requests_per_minute,
            requests_in_window=None if requests is None else requests.requests_in_window(now),
            tokens_per_minute=None if tokens is None else tokens.tokens_per_minute,
            tokens_reserved_in_window=None if tokens is None else tokens.reserved_in_window(now),
            tokens_available=None if tokens is None else tokens.available(now),
            cooldown_remaining=self.cooldown.remaining(now),
            admitted_total=self.admitted_total,
            rate_limits_reported=self.rate_limits_reported,
            closed=self.closed,
        )
