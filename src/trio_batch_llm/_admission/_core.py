"""One quota scope's combined state machine: every quota reserved atomically, waiters served FIFO.

:class:`QuotaCore` joins a concurrency bound, the optional RPM and TPM cores
and the cooldown core of :mod:`._limits`. Like them it is synchronous
and takes ``now`` explicitly. A request is admitted only when *all* its quotas
fit at once, and only in queue order: while anyone waits, a newcomer is not
admitted even if it would fit, so a large request at the head is never
starved by a stream of small ones behind it.

Waiting is modelled with :class:`Ticket` objects. Every operation that can let
someone in (a release, a withdrawal, a grant) admits as many tickets from the
head as now fit and returns the tickets whose owners must look again: those
it admitted, plus the new head, whose ready time may have changed. The async
wrapper (:mod:`._scope`) sets their events; the core never touches one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, final

import anyio

from .._values._config import RateLimitConfig
from .._values._errors import AdmissionClosedError, ConfigurationError
from ._limits import NEVER, NOW, CooldownCore, RequestRateCore, TokenRateCore, TokenReservation

if TYPE_CHECKING:
    from ._scope import QuotaScope

__all__ = ["Admission", "QuotaCore", "QuotaScopeStatistics", "Ticket"]

_NOTHING_TO_WAKE: Final[tuple[Ticket, ...]] = ()


@final
class Admission:
    """One admitted call's hold on its quota scope.

    It holds a concurrency slot, the call's request-per-minute stamp and its
    token reservation. Give it back exactly once, when the call is over;
    every release method is idempotent, so a ``finally`` may release again:

    - :meth:`release` after the call, with the real total tokens when known
      (``None`` keeps the reservation: unknown usage is never taken for zero);
      the RPM unit keeps counting for a window from now, the call's end;
    - :meth:`release_rate_limited` when the call was rate limited (a 429):
      it starts or joins the scope's cooldown *before* freeing the slot, so
      the slot cannot go to a waiter ahead of the cooldown; the 429 did reach
      the provider, so its RPM unit counts as after :meth:`release`;
    - :meth:`release_unused` when the call never reached the provider
      (refused or cancelled before it started): the RPM unit and every
      reserved token are refunded at once.
    """

    __slots__ = ("_request_stamp", "_scope", "_token_reservation", "generation", "released")

    def __init__(
        self,
        scope: QuotaScope | None,
        generation: int,
        request_stamp: float | None = None,
        token_reservation: TokenReservation | None = None,
    ) -> None:
        self._scope = scope
        self._request_stamp = request_stamp
        self._token_reservation = token_reservation
        self.generation = generation
        """The scope's cooldown generation at admission (tells a stale 429 from a fresh one)."""
        self.released = False

    @property
    def tokens_reserved(self) -> int:
        """Tokens reserved for this call (0 when the scope has no token limit)."""
        reservation = self._token_reservation
        return 0 if reservation is None else reservation.reserved

    def _owner(self) -> QuotaScope:
        if self._scope is None:
            raise RuntimeError("this admission came from a bare QuotaCore: release it through the core")
        return self._scope

    def release(self, actual_tokens: int | None = None) -> None:
        """Free the slot and settle the token reservation against ``actual_tokens``."""
        self._owner().release(self, actual_tokens)

    def release_rate_limited(
        self, retry_after: float | None = None, actual_tokens: int | None = None
    ) -> None:
        """Report a rate-limit failure to the scope, then release."""
        self._owner().release_rate_limited(self, retry_after, actual_tokens)

    def release_unused(self) -> None:
        """Release a call that never reached the provider, refunding its whole quota."""
        self._owner().release_unused(self)


@final
class Ticket:
    """A request waiting in a scope's FIFO queue."""

    __slots__ = ("admission", "event", "tokens")

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.admission: Admission | None = None
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
    """The synchronous machine behind a :class:`QuotaScope` (see the module docstring).

    The attributes ``bound``, ``in_flight``, ``queue``, ``fast``, ``requests``
    and ``tokens`` are read by the scope's fast path; ``fast`` is true only
    when nothing but the concurrency bound can refuse a request (no RPM, no
    TPM, no cooldown or ramp, not closed).
    """

    __slots__ = (
        "admitted_total", "bound", "closed", "cooldown", "fast", "in_flight", "owner", "queue",
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
        owner: QuotaScope | None = None,
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
        self.owner = owner
        self.admitted_total = 0
        self.rate_limits_reported = 0
        self.fast = self.requests is None and self.tokens is None

    def _refresh_fast(self, now: float) -> None:
        self.fast = (
            not self.closed and self.requests is None and self.tokens is None
            and not self.cooldown.active(now)
        )

    def ready_at(self, tokens: int, now: float) -> float:
        """When a request for ``tokens`` at the head of the queue could be admitted.

        ``<= now`` means it fits now; ``math.inf`` means only a release can help.
        """
        cooldown = self.cooldown
        if cooldown.active(now):
            ready = max(
                cooldown.ready_at(now), cooldown.concurrency_ready_at(self.bound, self.in_flight, now)
            )
        else:
            ready = NOW if self.in_flight < self.bound else NEVER
        if self.requests is not None:
            ready = max(ready, self.requests.ready_at(now))
        if self.tokens is not None:
            ready = max(ready, self.tokens.ready_at(tokens, now))
        return ready

    def _commit(self, tokens: int, now: float) -> Admission:
        self.in_flight += 1
        self.admitted_total += 1
        stamp = None if self.requests is None else self.requests.commit(now)
        reservation = None if self.tokens is None else self.tokens.commit(tokens, now)
        return Admission(self.owner, self.cooldown.generation, stamp, reservation)

    def try_admit_nowait(self, tokens: int, now: float) -> Admission:
        """Admit at once or raise ``anyio.WouldBlock`` (also when others are already waiting)."""
        if self.closed:
            raise AdmissionClosedError("quota scope is closed")
        check_tokens(tokens)
        self._refresh_fast(now)
        if self.queue or self.ready_at(tokens, now) > now:
            raise anyio.WouldBlock
        return self._commit(tokens, now)

    def enqueue(self, tokens: int) -> Ticket:
        """Join the back of the queue; call :meth:`grant` to be admitted and :meth:`withdraw` to leave."""
        if self.closed:
            raise AdmissionClosedError("quota scope is closed")
        check_tokens(tokens)
        ticket = Ticket(tokens)
        self.queue.append(ticket)
        return ticket

    def grant(self, now: float) -> Sequence[Ticket]:
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
            head.admission = self._commit(head.tokens, now)
        return woken

    def withdraw(self, ticket: Ticket, now: float) -> Sequence[Ticket]:
        """Take a waiter that gave up (cancelled, closed) out, returning anything it was granted."""
        admission = ticket.admission
        if admission is not None:
            ticket.admission = None
            return self.release_unused(admission, now)
        queue = self.queue
        if queue and queue[0] is ticket:
            queue.popleft()
            return self.grant(now)
        try:
            queue.remove(ticket)
        except ValueError:
            pass  # already gone (for example, withdrawn twice)
        return _NOTHING_TO_WAKE

    def release(self, admission: Admission, actual_tokens: int | None, now: float) -> Sequence[Ticket]:
        """Free the slot, reconcile tokens with real usage; return the tickets to wake."""
        if admission.released:
            return _NOTHING_TO_WAKE
        admission.released = True
        self.in_flight -= 1
        if admission._request_stamp is not None and self.requests is not None:
            self.requests.end(now)  # it reached the provider (a 429 too): counts a window on from here
        reservation = admission._token_reservation
        if reservation is not None and self.tokens is not None:
            self.tokens.reconcile(reservation, actual_tokens, now)
        return self.grant(now)

    def release_unused(self, admission: Admission, now: float) -> Sequence[Ticket]:
        """Free the slot and refund the RPM unit and all tokens: the call never happened."""
        if admission.released:
            return _NOTHING_TO_WAKE
        admission.released = True
        self.in_flight -= 1
        if admission._request_stamp is not None and self.requests is not None:
            self.requests.refund(admission._request_stamp, now)
        reservation = admission._token_reservation
        if reservation is not None and self.tokens is not None:
            self.tokens.refund(reservation, now)
        return self.grant(now)

    def report_rate_limit(
        self, retry_after: float | None, now: float, *, admitted_generation: int | None = None
    ) -> bool:
        """Start or join the scope's cooldown; return whether a new one started."""
        self.rate_limits_reported += 1
        started = self.cooldown.report(retry_after, now, admitted_generation=admitted_generation)
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
