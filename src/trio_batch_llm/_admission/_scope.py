"""Quota scopes: what a worker passes through before every provider call, first attempts and retries alike.

A :class:`QuotaScope` admits a call when a concurrency slot, a request-per-minute
unit and a token reservation are all free at once, in FIFO order, and no
cooldown is running. One worker's 429 starts one cooldown for the whole scope
(:meth:`Admission.release_rate_limited`); calls in flight finish, nobody new is
admitted until it ends, then a slow-start ramp reopens admission.

The decisions live in the synchronous cores (:mod:`._core`,
:mod:`._limits`). This module adds the waiting: one ``Event`` per
waiter, withdrawn on every exit path. A waiter whose wait depends on time (an
RPM or TPM window, a cooldown's end, the next step of the ramp) sleeps until
its computed ready time *or* its event, so no background timer task exists:
the cooldown needs no owner and closing a scope cancels nothing.

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

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import final

import anyio
import anyio.lowlevel

from .._values._config import ProcessorConfig, RateLimitConfig
from .._values._errors import AdmissionClosedError
from ._core import Admission, QuotaCore, QuotaScopeStatistics, Ticket

__all__ = ["Admission", "QuotaRegistry", "QuotaRegistryStatistics", "QuotaScope", "QuotaScopeStatistics"]


def _granted(ticket: Ticket) -> Admission | None:
    # A call, so that type checkers do not carry a narrowed `ticket.admission`
    # across the synchronous grant that may set it.
    return ticket.admission


def _wake(tickets: Sequence[Ticket]) -> None:
    for ticket in tickets:
        event = ticket.event
        if event is not None:
            event.set()


@final
class QuotaScope:
    """Concurrency, RPM and TPM quotas and the coordinated cooldown shared by one provider scope.

    ``clock`` defaults to :func:`anyio.current_time` (so it follows a test's
    virtual clock); any monotonic ``() -> float`` works for the sync methods.
    """

    __slots__ = ("_clock", "_core", "name")

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
    ) -> None:
        self._core = QuotaCore(
            concurrency=concurrency,
            requests_per_minute=requests_per_minute,
            tokens_per_minute=tokens_per_minute,
            rate_limit=rate_limit,
            request_burst=request_burst,
            owner=self,
        )
        self._clock = clock or anyio.current_time
        self.name = name

    @classmethod
    def from_config(
        cls, config: ProcessorConfig, *, clock: Callable[[], float] | None = None, name: str | None = None
    ) -> QuotaScope:
        return cls(
            concurrency=config.provider_concurrency,
            requests_per_minute=config.max_requests_per_minute,
            tokens_per_minute=config.max_tokens_per_minute,
            rate_limit=config.rate_limit,
            clock=clock,
            name=name,
        )

    def __repr__(self) -> str:
        core = self._core
        return (f"<QuotaScope {self.name or hex(id(self))} in_flight={core.in_flight}/{core.bound}"
                f" waiting={len(core.queue)}{' closed' if core.closed else ''}>")

    @property
    def needs_token_estimate(self) -> bool:
        """Whether ``tokens`` matters: estimate prompts only for scopes with a token limit."""
        return self._core.tokens is not None

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
        if core.fast and core.in_flight < core.bound and not core.queue:
            # The uncontended path: only the concurrency bound is in force.
            core.in_flight += 1
            core.admitted_total += 1
            return Admission(self, core.cooldown.generation)
        return core.try_admit_nowait(tokens, self._clock())

    async def admit(self, tokens: int = 0) -> Admission:
        """Wait for a slot, an RPM unit, ``tokens`` of TPM and the end of any cooldown, in FIFO order.

        A cancelled waiter leaves nothing behind: no slot, no reservation, no
        queue entry, and the next waiter is woken if it was first in line.
        """
        await anyio.lowlevel.checkpoint_if_cancelled()
        try:
            admission = self.try_admit_nowait(tokens)
        except anyio.WouldBlock:
            return await self._wait(tokens)
        await anyio.lowlevel.cancel_shielded_checkpoint()
        return admission

    async def _wait(self, tokens: int) -> Admission:
        core = self._core
        ticket = core.enqueue(tokens)
        try:
            return await self._wait_in_line(ticket)
        except BaseException:
            # Cancelled, closed or failed: leave the queue, and give back
            # anything granted meanwhile (waking whoever is next).
            _wake(core.withdraw(ticket, self._clock()))
            raise

    async def _wait_in_line(self, ticket: Ticket) -> Admission:
        core = self._core
        while True:
            if core.closed:
                raise AdmissionClosedError("quota scope is closed")
            deadline = math.inf
            if core.queue[0] is ticket:
                # First in line: admit ourselves (and whoever fits behind us)
                # if everything fits, else sleep until it could.
                now = self._clock()
                _wake(core.grant(now))
                if _granted(ticket) is not None:
                    break
                deadline = core.ready_at(ticket.tokens, now)
            event = ticket.event = anyio.Event()
            with anyio.move_on_at(deadline):
                await event.wait()
            admission = _granted(ticket)
            if admission is not None:
                return admission
        # Admitted without sleeping: still a schedule point, as every async call is.
        await anyio.lowlevel.cancel_shielded_checkpoint()
        admission = _granted(ticket)
        assert admission is not None
        return admission

    def ready_at(self, tokens: int = 0) -> float:
        """When a request for ``tokens`` could be admitted if nobody else came first.

        At or before :func:`anyio.current_time` means now; ``math.inf`` means
        only a release can make room. Waiters ahead are not accounted for.
        """
        return self._core.ready_at(tokens, self._clock())

    # -- release and rate limits -------------------------------------------

    def release(self, admission: Admission, actual_tokens: int | None = None) -> None:
        """Free ``admission``'s slot, settle its tokens with ``actual_tokens``, wake waiters.

        ``actual_tokens`` is the call's real total; ``None`` (unknown) keeps the
        reservation. Idempotent.
        """
        if admission.released:
            return
        core = self._core
        if admission._scope is not self:
            raise ValueError("admission belongs to another quota scope")
        if core.tokens is None and not core.queue:
            # Nobody to wake and no tokens to settle: free the slot here. An RPM
            # scope must still see the end, which starts the request's last window.
            admission.released = True
            core.in_flight -= 1
            requests = core.requests
            if requests is not None and admission._request_stamp is not None:
                requests.end(self._clock())
            return
        _wake(core.release(admission, actual_tokens, self._clock()))

    def release_unused(self, admission: Admission) -> None:
        """Release a call that never reached the provider, refunding its RPM unit and tokens."""
        if admission.released:
            return
        if admission._scope is not self:
            raise ValueError("admission belongs to another quota scope")
        _wake(self._core.release_unused(admission, self._clock()))

    def release_rate_limited(
        self, admission: Admission, retry_after: float | None = None, actual_tokens: int | None = None
    ) -> None:
        """Report a 429 on ``admission``'s call, then release it.

        The cooldown starts first, so the freed slot cannot go to a waiter before it.
        """
        if admission._scope is not self:
            raise ValueError("admission belongs to another quota scope")
        now = self._clock()
        self._core.report_rate_limit(retry_after, now, admitted_generation=admission.generation)
        _wake(self._core.release(admission, actual_tokens, now))

    def report_rate_limit(self, retry_after: float | None = None) -> bool:
        """Report a rate limit not tied to an admission; return whether a new cooldown started."""
        return self._core.report_rate_limit(retry_after, self._clock())

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Refuse new admissions; every waiter raises :class:`AdmissionClosedError`.

        Calls already admitted keep their slots and may still be released.
        Idempotent, synchronous, and owns no task: nothing to cancel or await.
        """
        _wake(self._core.close())

    def statistics(self) -> QuotaScopeStatistics:
        return self._core.statistics(self._clock())


@final
@dataclass(frozen=True, slots=True)
class QuotaRegistryStatistics:
    """Totals over every scope of a registry."""

    scopes: int
    in_flight: int
    waiting: int
    admitted_total: int
    rate_limits_reported: int
    closed: bool


class _ByIdentity:
    """Stands in for an unhashable scope key: such keys share a scope only with themselves."""

    __slots__ = ("key",)

    def __init__(self, key: object) -> None:
        self.key = key

    def __hash__(self) -> int:
        return id(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ByIdentity) and other.key is self.key


@final
class QuotaRegistry:
    """One host's quota scopes, created on first use and keyed by ``strategy.quota_scope()``.

    The first config seen for a key sizes its scope; later configs for the
    same key share it unchanged (the quota belongs to the provider, not to a
    batch). :meth:`close` closes every scope and refuses new ones.
    """

    __slots__ = ("_clock", "_closed", "_scopes")

    def __init__(self, *, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock
        self._scopes: dict[object, QuotaScope] = {}
        self._closed = False

    def scope_for(self, key: object, config: ProcessorConfig) -> QuotaScope:
        try:
            scope = self._scopes.get(key)
        except TypeError:
            key = _ByIdentity(key)
            scope = self._scopes.get(key)
        if scope is None:
            if self._closed:
                raise AdmissionClosedError("quota registry is closed")
            name = key.key if isinstance(key, _ByIdentity) else key
            scope = QuotaScope.from_config(config, clock=self._clock, name=f"{name!r}")
            self._scopes[key] = scope
        return scope

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close every scope (waking their waiters into AdmissionClosedError). Idempotent."""
        self._closed = True
        for scope in self._scopes.values():
            scope.close()

    def scope_statistics(self) -> list[tuple[object, QuotaScopeStatistics]]:
        return [
            (key.key if isinstance(key, _ByIdentity) else key, scope.statistics())
            for key, scope in self._scopes.items()
        ]

    def statistics(self) -> QuotaRegistryStatistics:
        stats = [scope.statistics() for scope in self._scopes.values()]
        return QuotaRegistryStatistics(
            scopes=len(stats),
            in_flight=sum(s.in_flight for s in stats),
            waiting=sum(s.waiting for s in stats),
            admitted_total=sum(s.admitted_total for s in stats),
            rate_limits_reported=sum(s.rate_limits_reported for s in stats),
            closed=self._closed,
        )
