"""Quota scopes: what a worker passes through before every provider call, first attempts and retries alike.

A :class:`QuotaScope` admits a call when a concurrency slot, a request-per-minute
unit and a token reservation are all free at once, in FIFO order, and no
cooldown is running. One worker's 429 starts one cooldown for the whole scope
(:meth:`Admission.release_rate_limited`); calls in flight finish, nobody new is
admitted until it ends, then a slow-start ramp reopens admission.

The decisions, the uncontended fast path included, live in the synchronous
cores (:mod:`._core`, :mod:`._limits`, :mod:`._throttle`). This module adds the clock
and the waiting (over 400 lines because that waiting, bounded or shared, is one loop):
one ``Event`` per waiter, withdrawn on every exit path. A waiter whose
wait depends on time (an RPM or TPM window, a cooldown's end, the next step of
the ramp) sleeps until its computed ready time *or* its event, so no background
timer task exists: the cooldown needs no owner and closing a scope cancels nothing.

The engine's calling pattern, per attempt::

    try:
        admission = scope.try_admit_nowait(tokens)      # sync fast path
    except anyio.WouldBlock:
        admission = await scope.admit(tokens)
    try:
        await anyio.lowlevel.checkpoint_if_cancelled()
    except BaseException:
        admission.release_unused()                       # cancelled before the call: refund
        raise
    try:
        ... = await strategy.execute(...)
    except RateLimited as exc:
        admission.release_rate_limited(exc.retry_after, actual_tokens)
        raise
    finally:
        admission.release(actual_tokens)                 # a no-op if already released
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, final

import anyio
import anyio.lowlevel

from .._observe._log import PaceWatch
from .._values._config import ProcessorConfig, RateLimitConfig
from .._values._errors import AdmissionClosedError
from .._values._quota_reports import QuotaScopeStatistics
from ._core import QuotaCore
from ._headers import RateLimitObservation
from ._records import Grant, Ticket
from ._throttle import ThrottleBudget, ThrottleWatch

if TYPE_CHECKING:
    from ._redis_quota import RedisSharedQuota, SharedTicket

__all__ = ["Admission", "QuotaScope"]


def _granted(ticket: Ticket) -> Grant | None:
    # A call, so that type checkers do not carry a narrowed `ticket.grant`
    # across the synchronous admission that may set it.
    return ticket.grant


def _wake(tickets: Sequence[Ticket]) -> None:
    for ticket in tickets:
        event = ticket.event
        if event is not None:
            event.set()


@final
class Admission:
    """One admitted call's hold on its quota scope: the core's :class:`Grant` and the way back.

    It holds a concurrency slot, the call's request-per-minute stamp and its
    token reservation. Give it back once, when the call is over; every release
    method is idempotent (the first one counts), so a ``finally`` may release again:

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

    __slots__ = ("_grant", "_scope", "_shared")

    def __init__(self, scope: QuotaScope, grant: Grant, shared: SharedTicket | None = None) -> None:
        self._scope = scope
        self._grant: Grant | None = grant  # None once released
        self._shared = shared  # the call's share of a Redis-backed limit, if the scope has one

    @property
    def released(self) -> bool:
        return self._grant is None

    @property
    def grant(self) -> Grant | None:
        """What the call holds, as the core recorded it; ``None`` once released."""
        return self._grant

    def now(self) -> float:
        """The scope's clock: the one an observation given to :meth:`release` must be read on."""
        return self._scope._clock()

    def release(
        self, actual_tokens: int | None = None, observation: RateLimitObservation | None = None,
        *, answered: bool = True, evidence: bool = True,
    ) -> None:
        """Free the slot and settle the token reservation against ``actual_tokens``.

        ``observation`` is what the answer said about the provider's limits
        (:func:`parse_rate_limit_headers`); the scope paces by it. ``answered=False``:
        the call was cut short, so it says nothing about whether the provider refuses calls
        (implies ``evidence=False``).
        ``evidence=False``: the call failed in a way that says nothing about the rate this scope
        may call at (an overload, a 5xx, a per-day quota): discovery and the refusal rule do not
        count it (neither a 429 nor an answer); reported budgets are still read.
        """
        grant = self._grant
        if grant is not None:
            self._grant = None
            scope = self._scope
            core = scope._core
            evidence = evidence and answered  # no answer came: none for the refusal rule nor discovery
            if answered and scope.throttle.refusing_since is not None:
                scope.throttle.answered()  # an answer other than a 429: calls flow again
            if observation is not None or not evidence or not core.release_uncontended(grant):
                before = PaceWatch.of(core) if observation is not None else None
                woken = core.release(grant, actual_tokens, now := scope._clock(), observation,
                                     evidence=evidence)
                if before is not None:
                    before.log_changes(scope.name, core, now)
                if woken:
                    _wake(woken)
            ticket = self._shared
            if ticket is not None:
                assert scope._shared is not None
                if evidence:
                    scope._shared.discovery.answered(ticket.generation)
                scope._shared.settle_ended(ticket, actual_tokens, observation)

    def release_rate_limited(
        self, retry_after: float | None = None, actual_tokens: int | None = None,
        observation: RateLimitObservation | None = None,
    ) -> float:
        """Report a rate-limit failure to the scope, then release; return this call's own wait.

        The wait is 0 unless the 429 was a blip (its ``observation`` says
        capacity remains): then the scope is not paused and this call alone
        should wait that long before its retry. Already released: 0.
        """
        grant = self._grant
        if grant is None:
            return 0.0
        self._grant = None
        scope = self._scope
        core, now = scope._core, scope._clock()
        before = PaceWatch.of(core)
        wait, woken = core.release_rate_limited(grant, retry_after, actual_tokens, now, observation)
        _wake(woken)
        cause = retry_after if retry_after is not None or observation is None else observation.retry_after
        _wake(scope.throttle.refused_by(before, scope.name, core, now, cause, wait))
        shared = scope._shared
        if shared is not None:
            ticket = self._shared
            if ticket is not None:
                shared.settle_ended(ticket, actual_tokens, observation)
            shared.rate_limited(ticket, core.discovery_signal(observation, retry_after, now),
                                core.cooldown_remaining(now))
        return wait

    def release_unused(self) -> None:
        """Release a call that never reached the provider, refunding its whole quota."""
        grant = self._grant
        if grant is not None:
            self._grant = None
            scope = self._scope
            _wake(scope._core.release_unused(grant, scope._clock()))
            ticket = self._shared
            if ticket is not None:
                assert scope._shared is not None
                scope._shared.settle_unused(ticket)


@final
class QuotaScope:
    """Concurrency, RPM and TPM quotas and the coordinated cooldown shared by one provider scope.

    ``clock`` defaults to :func:`anyio.current_time` (so it follows a test's
    virtual clock); any monotonic ``() -> float`` works for the sync methods.

    With ``shared`` (a Redis-backed limit, :mod:`._redis_quota`), the RPM and
    TPM limits live there instead of in this process: a call is admitted here
    first (FIFO, concurrency, cooldown, pacing), then takes its share there;
    its cooldowns are published there, and the ones it reports are joined here;
    the rate discovered from 429s alone is learnt there too, for every process.
    """

    __slots__ = ("_clock", "_core", "_shared", "name", "throttle")

    def __init__(
        self,
        *,
        concurrency: int,
        requests_per_minute: float | None = None,
        tokens_per_minute: int | None = None,
        rate_limit: RateLimitConfig | None = None,
        request_burst: int | None = None,
        clock: Callable[[], float] | None = None,
        name: str | None = None,
        shared: RedisSharedQuota | None = None,
    ) -> None:
        local = shared is None
        self._core = QuotaCore(
            concurrency=concurrency,
            requests_per_minute=requests_per_minute if local else None,
            tokens_per_minute=tokens_per_minute if local else None,
            rate_limit=rate_limit,
            request_burst=request_burst,
            shared_discovery=not local,
        )
        self._clock = clock or anyio.current_time
        self._core.use_wall_clock(self._clock)  # a storm's probes meet a calendar minute (issue 32)
        self.name = name
        self._shared = shared
        self.throttle = ThrottleWatch()
        """Its streak of 429s: the stall warning, the waiters' ``max_rate_limit_wait``, progress."""

    @classmethod
    def from_config(
        cls, config: ProcessorConfig, *, clock: Callable[[], float] | None = None, name: str | None = None,
        shared: RedisSharedQuota | None = None,
    ) -> QuotaScope:
        return cls(
            concurrency=config.provider_concurrency,
            requests_per_minute=config.max_requests_per_minute,
            tokens_per_minute=config.max_tokens_per_minute,
            rate_limit=config.rate_limit,
            clock=clock,
            name=name,
            shared=shared,
        )

    def join_cooldown(self, seconds: float) -> None:
        """Another process sharing this scope's limit is cooling down: pause here as long (no new storm)."""
        now = self._clock()
        self._core.pause(seconds, now)
        self.throttle.joined(now)

    def __repr__(self) -> str:
        core = self._core
        return (f"<QuotaScope {self.name or hex(id(self))} in_flight={core.in_flight}/{core.bound}"
                f" waiting={len(core.queue)}{' closed' if core.closed else ''}>")

    @property
    def needs_token_estimate(self) -> bool:
        """Whether ``tokens`` matters: estimate prompts for scopes with a token limit, configured or reported.

        It can turn true during a run, when the provider first reports a token budget.
        """
        core = self._core
        return (core.tokens is not None or (self._shared is not None and self._shared.tpm > 0)
                or (core.pacing is not None and (core.pacing.tokens.reported or core.pacing.inputs.reported
                                                 or core.pacing.outputs.reported)))

    @property
    def closed(self) -> bool:
        return self._core.closed

    # -- admission ---------------------------------------------------------

    def try_admit_nowait(self, tokens: int = 0) -> Admission:
        """Admit at once, or raise ``anyio.WouldBlock`` (also when others already wait).

        Raises :class:`AdmissionClosedError` once the scope is closed. ``tokens``
        is the call's estimated total tokens; it is ignored without a TPM limit.
        """
        core = self._core
        grant = core.try_admit_uncontended()
        if grant is None:
            grant = core.try_admit_nowait(tokens, self._clock())
        shared = self._shared
        if shared is None:
            return Admission(self, grant)
        ticket = shared.try_take_nowait(tokens)
        if ticket is None:
            _wake(core.release_unused(grant, self._clock()))  # the shared part needs a round trip
            raise anyio.WouldBlock
        return Admission(self, grant, ticket)

    async def admit(self, tokens: int = 0, *, throttle: ThrottleBudget | None = None) -> Admission:
        """Wait for a slot, an RPM unit, ``tokens`` of TPM and the end of any cooldown, in FIFO order.

        A cancelled waiter leaves nothing behind: no slot, no reservation, no
        queue entry, and the next waiter is woken if it was first in line.
        ``throttle``: give up (``ThrottleBudgetSpent``) past it (:meth:`ThrottleWatch.give_up_at`).
        """
        await anyio.lowlevel.checkpoint_if_cancelled()
        shared = self._shared
        if shared is not None:
            return await self._admit_shared(shared, tokens, throttle)
        try:
            admission = self.try_admit_nowait(tokens)
        except anyio.WouldBlock:
            return Admission(self, await self._wait(tokens, throttle))
        await anyio.lowlevel.cancel_shielded_checkpoint()
        return admission

    async def _admit_shared(
        self, shared: RedisSharedQuota, tokens: int, throttle: ThrottleBudget | None
    ) -> Admission:
        # Local first (FIFO, concurrency, cooldown), then the share: a slot held while Redis is asked
        # costs this process a slot; a share held while waiting for a slot would cost every process.
        core = self._core
        grant = core.try_admit_uncontended()
        if grant is None:
            try:
                grant = core.try_admit_nowait(tokens, self._clock())
            except anyio.WouldBlock:
                grant = await self._wait(tokens, throttle)
        try:
            ticket = await shared.take(tokens)
        except BaseException:
            _wake(core.release_unused(grant, self._clock()))
            raise
        return Admission(self, grant, ticket)

    async def _wait(self, tokens: int, throttle: ThrottleBudget | None = None) -> Grant:
        core = self._core
        ticket = core.enqueue(tokens)
        if throttle is not None:
            self.throttle.bound(ticket, throttle, self._clock())
        try:
            return await self._wait_in_line(ticket)
        except BaseException:
            # Cancelled, closed or failed: leave the queue, and give back
            # anything granted meanwhile (waking whoever is next).
            _wake(core.withdraw(ticket, self._clock()))
            raise

    async def _wait_in_line(self, ticket: Ticket) -> Grant:
        core = self._core
        watch = self.throttle
        while True:
            if core.closed:
                raise AdmissionClosedError("quota scope is closed")
            # Bounded by max_rate_limit_wait: give up past it (raises), else sleep no later than it.
            head = core.queue[0] is ticket
            deadline = (math.inf if ticket.throttle is None
                        else watch.give_up_at(ticket, self._clock(), head=head))
            if head:
                # First in line: admit ourselves (and whoever fits behind us)
                # if everything fits, else sleep until it could.
                now = self._clock()
                _wake(core.admit_waiters(now))
                if _granted(ticket) is not None:
                    break
                deadline = min(deadline, core.ready_at(ticket.tokens, now))
                if watch.refusing_since is not None:
                    # The one waiter that looks at the stall when nothing else happens (no timer task).
                    _wake(watch.check(self.name, core, now))
                    deadline = min(deadline, watch.check_at())
            event = ticket.event = anyio.Event()
            with anyio.move_on_at(deadline):
                await event.wait()
            grant = _granted(ticket)
            if grant is not None:
                return grant
        # Admitted without sleeping: still a schedule point, as every async call is.
        await anyio.lowlevel.cancel_shielded_checkpoint()
        grant = _granted(ticket)
        assert grant is not None
        return grant

    def ready_at(self, tokens: int = 0) -> float:
        """When a request for ``tokens`` could be admitted if nobody else came first.

        At or before :func:`anyio.current_time` means now; ``math.inf`` means
        only a release can make room. Waiters ahead are not accounted for.
        """
        return self._core.ready_at(tokens, self._clock())

    # -- rate limits and lifecycle -----------------------------------------

    def report_rate_limit(self, retry_after: float | None = None) -> bool:
        """Report a rate limit not tied to an admission; return whether a new cooldown started.

        On a scope shared through Redis it reaches every process, as a released 429 does.
        """
        core = self._core
        before = PaceWatch.of(core)
        started = core.report_rate_limit(retry_after, now := self._clock())
        _wake(self.throttle.refused_by(before, self.name, core, now, retry_after, 0.0))
        if (shared := self._shared) is not None:
            shared.rate_limited(None, core.discovery_signal(None, retry_after, now),
                                core.cooldown_remaining(now))
        return started

    def close(self) -> None:
        """Refuse new admissions; every waiter raises :class:`AdmissionClosedError`.

        Calls already admitted keep their slots and may still be released.
        Idempotent, synchronous, and owns no task: nothing to cancel or await.
        """
        _wake(self._core.close())
        if self._shared is not None:
            self._shared.close()

    def statistics(self) -> QuotaScopeStatistics:
        now = self._clock()
        stats = self._core.statistics(now)
        if self.throttle.refusing_since is not None:
            stats = dataclasses.replace(stats, refusing_for=self.throttle.refusing_for(now))
        shared = self._shared
        if shared is None:
            return stats
        waiting, spares = shared.statistics()
        if shared.discovery.rate is not None and stats.pacing == "inactive":
            stats = dataclasses.replace(stats, pacing="discovery",
                                        paced_requests_per_minute=shared.discovery.rate * 60.0)
        return dataclasses.replace(
            stats, waiting=stats.waiting + waiting, backend="redis", backend_spares=spares,
            backend_round_trips=shared.round_trips, backend_waiting=shared.taking,
            backend_unreachable=shared.unreachable,
            requests_per_minute=stats.requests_per_minute if not shared.limit else shared.requests_per_minute,
            tokens_per_minute=shared.tpm or None,
        )
