"""One quota scope's combined state machine: every quota reserved atomically, waiters served FIFO.

Over 400 lines because it is one state machine: admitting, settling and the rate-limit reports
change the same fields together, and each rule reads the others' state.

:class:`QuotaCore` joins a concurrency bound, the optional RPM and TPM cores
and the cooldown core of :mod:`._limits`. Like them it is synchronous
and takes ``now`` explicitly. A request is admitted only when *all* its quotas
fit at once, and only in queue order: while anyone waits, a newcomer is not
admitted even if it would fit, so a large request at the head is never
starved by a stream of small ones behind it.

An admission is a :class:`~._records.Grant`, a frozen record of what the call
holds (its cooldown generation, its RPM stamp, its token reservation, its pace mark). Every change of
state is a core method taking the grant and ``now``; each grant is settled
exactly once, by :meth:`QuotaCore.release`, :meth:`~QuotaCore.release_rate_limited`
or :meth:`~QuotaCore.release_unused` (the async wrapper's handle makes that
idempotent for its callers).

Waiting is modelled with :class:`~._records.Ticket` objects. Every operation that can let
someone in (a release, a withdrawal, admitting waiters) admits as many tickets
from the head as now fit and returns the tickets whose owners must look again:
those it admitted, plus the new head, whose ready time may have changed. The
async wrapper (:mod:`._scope`) sets their events; the core never touches one.

When learning is on (``RateLimitConfig.learn_limits``), a
:class:`~._pacing.PacingCore` adds the provider's reported budgets and the
discovered rate to the quotas, from the first answer that reports a budget or
the first 429 on; until then it costs nothing.

The uncontended path (only the concurrency bound in force, nobody waiting)
needs no clock: :meth:`~QuotaCore.try_admit_uncontended` and
:meth:`~QuotaCore.release_uncontended` decide it without ``now``, and say so
when the answer depends on time, so the caller reads its clock only then.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Final, final

import anyio

from .._values._config import RateLimitConfig
from .._values._errors import AdmissionClosedError, ConfigurationError
from .._values._quota_reports import Pace, QuotaScopeStatistics
from ._headers import RateLimitObservation
from ._limits import NEVER, NOW, CooldownCore, RequestRateCore, TokenRateCore
from ._pacing import PacingCore
from ._records import Grant, Ticket, check_tokens
from ._refusals import RefusalRule

__all__ = ["Grant", "QuotaCore", "QuotaScopeStatistics", "Ticket"]


_new_grant: Final = tuple.__new__  # skips the named tuple's own __new__: half the cost, same record
_NOTHING_TO_WAKE: Final[tuple[Ticket, ...]] = ()


@final
class QuotaCore:
    """The synchronous machine behind a quota scope (see the module docstring).

    ``fast`` is true only when nothing but the concurrency bound can refuse a
    request (no RPM, no TPM, no pacing, no cooldown or ramp, not closed): a
    rate-limit report, the first pacing or a close clears it, and the first
    timed admission after the ramp sets it again (unless pacing is in force).
    ``pacing`` is ``None`` when learning is off (``RateLimitConfig.learn_limits``);
    ``paced`` says whether it has begun to pace (it never stops once begun).
    ``shared_discovery``: the scope's limits live in Redis, which discovers the rate
    for every process (:mod:`._redis_discovery`); this core's discovery stays off.
    """

    __slots__ = (
        "_bare", "_blip_wait", "admitted_total", "bound", "closed", "cooldown", "fast", "in_flight", "paced",
        "pacing", "queue", "rate_limits_reported", "refusals", "requests", "tokens",
    )

    def __init__(
        self,
        *,
        concurrency: int,
        requests_per_minute: float | None = None,
        tokens_per_minute: int | None = None,
        rate_limit: RateLimitConfig | None = None,
        request_burst: int | None = None,
        shared_discovery: bool = False,
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigurationError("concurrency", concurrency, "must be a whole number >= 1")
        config = rate_limit or RateLimitConfig()
        self.bound = concurrency
        self.in_flight = 0
        self.requests = (
            None if requests_per_minute is None
            else RequestRateCore(requests_per_minute, burst=request_burst)
        )
        self.tokens = None if tokens_per_minute is None else TokenRateCore(tokens_per_minute)
        self.cooldown = CooldownCore(config)
        self.pacing = (
            PacingCore(config, requests_per_minute=requests_per_minute, shared_discovery=shared_discovery)
            if config.learn_limits else None
        )
        self.paced = False
        self._blip_wait = config.blip_retry_seconds
        self.refusals = RefusalRule()  # which 429s follow the rate, which refuse a call at random
        self.queue: deque[Ticket] = deque()
        self.closed = False
        self.admitted_total = 0
        self.rate_limits_reported = 0
        self.fast = self.requests is None and self.tokens is None
        # The grant of a call that holds only a slot, shared: immutable, and the same for
        # every such admission of one cooldown generation.
        self._bare = Grant(self.cooldown.generation, None, None, None)

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
        if self.paced:
            assert self.pacing is not None
            at = self.pacing.ready_at(tokens, self.in_flight, now)
            if at > ready:
                ready = at
        return ready

    # -- admission ---------------------------------------------------------

    def _commit(self, tokens: int, now: float) -> Grant:
        self.in_flight += 1
        self.admitted_total += 1
        requests, reserve = self.requests, self.tokens
        mark = self.pacing.commit(tokens, now) if self.paced and self.pacing is not None else None
        if requests is None and reserve is None and mark is None:
            return self._bare
        stamp = None if requests is None else requests.commit(now)
        reservation = None if reserve is None else reserve.commit(tokens, now)
        grant: Grant = _new_grant(Grant, (self.cooldown.generation, stamp, reservation, mark))
        return grant

    def try_admit_uncontended(self) -> Grant | None:
        """The fast path, decided without a clock: admit when only a free slot is needed.

        ``None`` when the answer depends on time (an RPM or TPM limit, pacing,
        a cooldown or its ramp) or on others (someone waits, the scope is
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
        if not self.fast and self.requests is None and self.tokens is None and not self.paced:
            self.fast = not self.cooldown.active(now)  # the ramp is over: the fast path reopens
        # FIFO over fit: while anyone waits a newcomer queues too, even if it would fit. Otherwise a
        # stream of small requests keeps slipping past a large one at the head, which never runs.
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
                # Nobody behind the head is admitted either (FIFO, see try_admit_nowait).
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

        Frees the slot when there is nothing to settle (no RPM or TPM limit,
        no pacing) and nobody to wake.
        """
        if self.requests is None and self.tokens is None and not self.queue and not self.paced:
            self.in_flight -= 1
            self.refusals.answered()  # (not paced, no cooldown: nothing a lone 429 did is left)
            return True
        return False

    def _settle(self, grant: Grant, actual_tokens: int | None, now: float) -> Sequence[Ticket]:
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

    def _start_pacing(self) -> None:
        if not self.paced and self.pacing is not None and self.pacing.active:
            self.paced = True
            self.fast = False

    def release(
        self, grant: Grant, actual_tokens: int | None, now: float,
        observation: RateLimitObservation | None = None, *, evidence: bool = True,
    ) -> Sequence[Ticket]:
        """The call is over: free the slot, settle tokens with real usage; return the tickets to wake.

        ``actual_tokens`` is the call's real total; ``None`` (unknown) keeps the reservation, since
        unknown usage is never taken for zero. The RPM unit counts for a window from ``now``, the end.
        ``observation``: what it said of the limits. ``evidence=False`` (a 5xx): not an answer to discovery.
        """
        pacing = self.pacing
        generation = pacing.discovery.generation if self.paced and pacing is not None else None
        # An answer may show that the run of 429s which acted on the scope is one that random
        # refusals make (the noise share grew since: _refusals); what it did to the pace or the
        # cooldown is undone, or it would stand for a limit for good and pace the scope ever lower.
        if evidence and self.refusals.answered(generation):
            self.refusals.forget(pacing, self.cooldown, now)  # noise confirmed: undo what lone 429s did
        if pacing is not None and (self.paced or observation is not None):
            pacing.answered(grant.pace, actual_tokens, observation, self.in_flight - 1, now, served=evidence)
            self._start_pacing()
        return self._settle(grant, actual_tokens, now)

    def release_rate_limited(
        self, grant: Grant, retry_after: float | None, actual_tokens: int | None, now: float,
        observation: RateLimitObservation | None = None,
    ) -> tuple[float, Sequence[Ticket]]:
        """The call was rate limited (a 429): learn from it or start the cooldown, *then* release.

        In that order, so the freed slot cannot go to a waiter ahead of the cooldown.
        The 429 reached the provider: its RPM unit counts as after :meth:`release`.
        Returns the seconds *this call* should wait before its retry beyond what admission
        imposes (non-zero only for a blip: a 429 whose headers say capacity remains), and the
        tickets to wake.

        With learning on, a scope-wide cooldown starts only for a wait the
        provider asked for (``retry_after``, or the observation's); otherwise
        the 429 moves the reported budget or the discovered rate. With it off,
        every 429 starts or joins the cooldown.
        """
        if observation is not None and retry_after is None:
            retry_after = observation.retry_after
        pacing = self.pacing
        if pacing is None:
            self.report_rate_limit(retry_after, now, admitted_generation=grant.generation)
            return 0.0, self._settle(grant, actual_tokens, now)
        # The calls that ended before this one, less the 429s among them: roughly what got through.
        # Discovery's first guess at a window's worth (only if a 429 starts it: see _discovery).
        served_before = self.admitted_total - self.in_flight - self.rate_limits_reported
        self.rate_limits_reported += 1
        # A blip: a 429 that says nothing of the limit (no budget reported, and too few in a row to be
        # the rate's: _refusals). Only this call waits; slowing or pausing the whole scope for a
        # refusal a lower rate would not cure would cost every other call and cure nothing.
        if (observation is None or not observation.reports_budget) and not self.refusals.refused(
                pacing.discovery):
            self.refusals.forget(pacing, self.cooldown, now)  # a refusal a lower rate would not cure
            pacing.blips += 1
            blip = True
        else:
            blip = pacing.rate_limited(grant.pace, observation, retry_after, self.in_flight - 1, now,
                                       served_before)
            self._start_pacing()
        if blip:
            wait = retry_after if retry_after is not None else self._blip_wait
            return wait, self._settle(grant, actual_tokens, now)
        if retry_after is not None:  # the provider asked for a wait: kept even if the cooldown is lifted
            # Learning paces by the 429's budget or the discovered rate; a scope-wide pause is only
            # for a wait the provider asked for (without one, pausing would only idle the scope).
            started = self._cool_down(retry_after, now, grant.generation)
            self.refusals.cooled(self.cooldown.generation if started else None, now + retry_after)
        self.fast = False
        return 0.0, self._settle(grant, actual_tokens, now)

    def use_wall_clock(self, clock: Callable[[], float]) -> None:
        """Let discovery's storm probes meet the wall-clock minute (``clock``: the scope's clock)."""
        if self.pacing is not None:
            self.pacing.use_wall_clock(clock)

    def release_unused(self, grant: Grant, now: float) -> Sequence[Ticket]:
        """The call never reached the provider: free the slot, refund the RPM unit and every token."""
        self.in_flight -= 1
        _, stamp, reservation, mark = grant
        if mark is not None and self.pacing is not None:
            self.pacing.refund(mark)
        if stamp is not None and self.requests is not None:
            self.requests.refund(stamp, now)
        if reservation is not None and self.tokens is not None:
            self.tokens.refund(reservation, now)
        return self.admit_waiters(now)

    # -- rate limits and lifecycle -------------------------------------------

    def _cool_down(self, retry_after: float | None, now: float, generation: int | None) -> bool:
        started = self.cooldown.report(retry_after, now, admitted_generation=generation)
        if started:
            # The shared bare grant carries the generation: calls admitted from now on belong to the
            # new storm, so their 429s may start the next cooldown (older ones only join this one).
            self._bare = Grant(self.cooldown.generation, None, None, None)
        self.fast = False
        return started

    def pause(self, seconds: float, now: float) -> bool:
        """Join a cooldown reported from elsewhere (another process): pause until ``now + seconds``."""
        return self._cool_down(seconds, now, None)

    def discovery_signal(self, observation: RateLimitObservation | None, retry_after: float | None,
                         now: float) -> bool | None:
        """Whether a 429 feeds discovery (None: not), and if so whether it asked to wait."""
        pacing = self.pacing
        if pacing is None or self.refusals.transient:
            return None  # the last 429 was a per-call refusal: nothing for a shared discovery either
        return pacing.discovery_signal(observation, retry_after, now)

    def report_rate_limit(
        self, retry_after: float | None, now: float, *, admitted_generation: int | None = None
    ) -> bool:
        """Report a rate limit not tied to a release; return whether a new cooldown started.

        With learning on and no ``retry_after``, it lowers the discovered rate instead.
        """
        self.rate_limits_reported += 1
        self.refusals.transient = False
        pacing = self.pacing
        if pacing is not None and retry_after is None:
            pacing.rate_limited(None, None, None, self.in_flight, now)
            self._start_pacing()
            return False
        return self._cool_down(retry_after, now, admitted_generation)

    def close(self) -> Sequence[Ticket]:
        """Refuse new requests; return every waiter, to be woken into AdmissionClosedError."""
        self.closed = True
        self.fast = False
        return list(self.queue)

    def pace(self) -> Pace:
        """What the learning admission knows now (for the log of what a release changed)."""
        pacing = self.pacing
        if pacing is None:
            return Pace(self.cooldown.generation, None, None, None)
        discovered, reported = pacing.discovery.rate, pacing.requests.limit
        return Pace(self.cooldown.generation, discovered, reported, pacing.tokens.limit)

    def cooldown_remaining(self, now: float) -> float:
        """Seconds until the cooldown in force ends (0: none)."""
        return self.cooldown.remaining(now)

    def statistics(self, now: float) -> QuotaScopeStatistics:
        requests, tokens, pacing = self.requests, self.tokens, self.pacing
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
            cooldown_remaining=self.cooldown_remaining(now),
            admitted_total=self.admitted_total,
            rate_limits_reported=self.rate_limits_reported,
            closed=self.closed,
            pacing="off" if pacing is None else pacing.mode(now),
            paced_requests_per_minute=None if pacing is None else pacing.paced_requests_per_minute(now),
            paced_tokens_per_minute=None if pacing is None else pacing.paced_tokens_per_minute(now),
            reported_requests_remaining=None if pacing is None else pacing.requests.remaining,
            reported_tokens_remaining=None if pacing is None else pacing.tokens.remaining,
            rate_limit_blips=0 if pacing is None else pacing.blips,
        )
