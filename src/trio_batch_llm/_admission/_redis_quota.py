"""One quota scope's share of a Redis-backed limit: RPM units and TPM reservations held in Redis.

Over 400 lines because the leader protocol, the spares and the buffered settlements (ends, refunds,
debts, both reported budgets, discovery's events) are one round trip's parts and must change together.

:class:`~._scope.QuotaScope` keeps what is local to the process (the
concurrency bound, the FIFO queue, the cooldown's ramp, learned pacing) and
asks a :class:`RedisSharedQuota` for the shared part once its local admission
succeeded: :meth:`~RedisSharedQuota.try_take_nowait` (no round trip: a spare
unit) or :meth:`~RedisSharedQuota.take` (waits in a local FIFO).

**One round trip for many waiters.** Waiters queue here in order, in a
:class:`~._redis_line.WaitingLine`: the first becomes the *leader* and asks Redis for
everyone queued at once (the script admits the longest prefix that fits, in order, so
FIFO holds across the batch). The leader sleeps until the reported ready time, or until
a local release gives it something new to say, and asks again; when its own request is
granted it hands the lead to the next waiter. No task is spawned for this.

**Releases ride along.** A call's end, a refund, a token settlement, a
cooldown, an answer or 429 for discovery (:mod:`._redis_discovery`) are buffered
(the release methods are synchronous) and sent with the next round trip: the
leader's, or the link's flusher a few milliseconds later.
Late is always the strict side: an end stamped later counts longer, a refund
sent later frees later.

**Spares.** With an RPM limit and no TPM limit, a round trip also leases spare
units, counted in Redis like any admitted call; the next admissions take them
without a round trip. It leases what this process admitted since the last round
trip, or, if more, what it will admit in two round trips at its recent pace (so
a slow round trip, e.g. on an event loop busy with 200 calls, never leaves the
admissions waiting for it), never more than ``min(max_lease, limit // 20)`` held
in all. Unused spares go back after ``lease_seconds``, and at once when
discovery is active (none is leased then).

**Calls in flight.** With ``RedisQuotaBackend.max_in_flight``, :meth:`~RedisSharedQuota.take`
first takes a lease (:mod:`._redis_inflight`), then the RPM/TPM share, so that the
call starts as soon as its rate unit is granted; every settlement gives the lease back.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from collections.abc import Callable
from typing import Final, cast, final

import anyio.lowlevel

from .._values._config import RateLimitConfig
from ._headers import RateLimitObservation
from ._limits import WINDOW_SECONDS
from ._redis_discovery import SharedDiscovery
from ._redis_inflight import SharedInFlight
from ._redis_line import WaitingLine, Want
from ._redis_link import RedisLink
from ._redis_lua import AcquireReply

__all__ = ["RedisSharedQuota", "SharedTicket", "scope_key"]

_POLL_FIRST: Final = 0.02  # seconds: how soon a blocked leader asks again when nothing local changed
_POLL_MAX: Final = 0.5
_RTT_DECAY: Final = 0.8  # each round trip, the remembered slowest one counts this much less


def scope_key(namespace: str, key: object) -> str:
    """The Redis hash tag of a quota scope: equal ``quota_scope()`` keys give equal tags in every process."""
    digest = hashlib.sha256(repr(key).encode("utf-8", "backslashreplace")).hexdigest()[:24]
    return f"{namespace}:{digest}"


@final
class SharedTicket:
    """What one admitted call holds in Redis: its unit id, the tokens it reserved there, its token mark.

    ``generation``: the scope's discovery generation when it was granted (:mod:`._redis_discovery`).
    ``lease``: its lease on a slot of the scope's bound on calls in flight, if any (:mod:`._redis_inflight`).
    """

    __slots__ = ("generation", "lease", "token_mark", "tokens", "unit")

    def __init__(
        self, unit: str, tokens: int, token_mark: int = 0, generation: int = 0, lease: str = ""
    ) -> None:
        self.lease = lease
        self.unit = unit
        self.tokens = tokens
        self.token_mark = token_mark  # the scope's token charge total just after it (see _redis_lua)
        self.generation = generation


@final
class _Want(Want[SharedTicket]):
    __slots__ = ("tokens",)

    def __init__(self, tokens: int) -> None:
        super().__init__()
        self.tokens = tokens

    @property
    def ticket(self) -> SharedTicket | None:
        """What Redis granted this waiter (its :attr:`~._redis_line.Want.grant`)."""
        return self.grant


@final
class RedisSharedQuota(WaitingLine[SharedTicket]):
    """The shared RPM/TPM of one scope (see the module docstring); its waiters wait in a
    :class:`~._redis_line.WaitingLine`."""

    __slots__ = (
        "_admitted", "_budgets", "_carrying", "_cool", "_demand_at", "_ends", "_keys",
        "_pace", "_refilling", "_refunds", "_round_trip_seconds", "_settles", "_spare_cap",
        "_spares", "_taking", "_token_budgets", "discovery", "hold", "inflight", "limit",
        "name", "on_cooldown",
        "pacing_margin", "requests_per_minute", "round_trips", "tpm", "window",
    )

    def __init__(
        self, link: RedisLink, name: str, *, requests_per_minute: float | None, tokens_per_minute: int | None,
        rate_limit: RateLimitConfig | None = None,
    ) -> None:
        super().__init__(link, _POLL_FIRST, _POLL_MAX)
        self.name = name
        self._keys = [f"{{{name}}}:{key}" for key in ("req", "tok", "amt", "st", "dga", "dsv")]
        if requests_per_minute is None:
            self.limit, self.window = 0, WINDOW_SECONDS
        else:  # the same reading of a fractional RPM as RequestRateCore's
            self.limit = max(1, math.floor(requests_per_minute))
            self.window = max(WINDOW_SECONDS, WINDOW_SECONDS * self.limit / requests_per_minute)
        self.requests_per_minute = requests_per_minute
        self.tpm = tokens_per_minute or 0
        self.round_trips = 0
        self.discovery = SharedDiscovery(rate_limit, requests_per_minute, self._kick, link.clock)
        self.pacing_margin = 0.005  # the scope's RateLimitConfig.pacing_margin (set by the registry)
        self.hold = link.backend.max_call_seconds
        self._spare_cap = 0 if self.tpm else min(link.backend.max_lease, self.limit // 20)
        self.on_cooldown: Callable[[float], None] | None = None  # the scope's join_cooldown
        self._spares: deque[tuple[str, float]] = deque()  # (unit, leased at, on the link's clock)
        self._admitted = 0  # admissions since the last round trip: the demand a lease may cover
        self._taking = 0  # admissions inside take(): they hold a local slot, and no call yet
        self._demand_at: float | None = None  # when that count began (on the link's clock)
        self._pace = 0.0  # admissions per second over recent round trips
        self._round_trip_seconds = 0.0  # the recent slowest round trip, decaying
        self._ends: list[str] = []
        self._refunds: list[str] = []
        self._settles: list[tuple[str, int, int]] = []  # (unit, reserved, actual)
        self._budgets: list[tuple[str, int, float, int]] = []  # (mark, remaining, reset after, margin)
        self._token_budgets: list[tuple[int, int, float, int]] = []  # the same, for the token budget
        self._cool: float | None = None
        self._carrying = 0  # round trips under way that carry releases
        self._refilling = False
        link.add(self)
        backend = link.backend
        self.inflight = None if backend.max_in_flight is None else SharedInFlight(
            link, name, backend.max_in_flight, backend.in_flight_expiry)

    def __repr__(self) -> str:
        return f"<RedisSharedQuota {self.name} waiting={len(self._queue)} spares={len(self._spares)}>"

    @property
    def has_limits(self) -> bool:
        return self.limit > 0 or self.tpm > 0 or self.discovery.active

    def clamp(self, tokens: int) -> int:
        return min(tokens, self.tpm) if self.tpm else 0

    # -- taking a share ------------------------------------------------------------

    def try_take_nowait(self, tokens: int) -> SharedTicket | None:
        """A spare unit at once, or ``None`` (then :meth:`take`)."""
        if self.inflight is not None:
            return None  # a lease needs a round trip
        if not self.has_limits:
            return SharedTicket("", 0)
        if self._queue or self.tpm or not self._spares:
            return None
        unit, _ = self._spares.popleft()
        self._admitted += 1
        if self.wants_refill:
            self._link.want_flush()  # the link's task tops the lease up before it runs out
        return SharedTicket(unit, 0)

    async def take(self, tokens: int) -> SharedTicket:
        """Wait, in FIFO order with this process's other waiters, until Redis grants the share
        (with a bound on calls in flight, a lease first)."""
        self._taking += 1
        try:
            inflight = self.inflight
            if inflight is None:
                return await self._take(tokens)
            lease = await inflight.acquire()
            try:
                ticket = await self._take(tokens)
            except BaseException:
                inflight.release(lease)
                raise
            ticket.lease = lease
            return ticket
        finally:
            self._taking -= 1

    async def _take(self, tokens: int) -> SharedTicket:
        await anyio.lowlevel.checkpoint_if_cancelled()
        if not self.has_limits:
            return SharedTicket("", 0)
        if not self._queue and not self.tpm and self._spares:
            ticket = self.try_take_nowait(tokens)
            assert ticket is not None
            await anyio.lowlevel.cancel_shielded_checkpoint()
            return ticket
        return await self._wait_in_line(_Want(self.clamp(tokens)))

    async def _ask(self) -> float:
        wants = cast("list[_Want]", list(self._queue))  # only _take queues, and only _Want
        reply = await self._round_trip(wants)
        self._admit(wants, reply)
        return _POLL_MAX if reply.ready_at is None else max(0.0, reply.ready_at - reply.now)

    def _give_back(self, grant: SharedTicket) -> None:
        self.settle_unused(grant)

    def _admit(self, wants: list[_Want], reply: AcquireReply) -> None:
        granted = len(reply.units) - reply.spares
        now = self._link.clock()
        for want, unit, mark in zip(wants[:granted], reply.units[:granted], reply.token_marks[:granted],
                                    strict=True):
            ticket = SharedTicket(unit, want.tokens, mark, reply.generation)
            if self._hand(want, ticket):
                self._admitted += 1
            else:  # withdrawn while we asked, or served from spares meanwhile: the share goes back
                self.settle_unused(ticket)
        for unit in reply.units[granted:]:
            self._spares.append((unit, now))
        self._serve_from_spares()
        if reply.cooldown_remaining > 0 and self.on_cooldown is not None:
            self.on_cooldown(reply.cooldown_remaining)

    @property
    def wants_refill(self) -> bool:
        """Spares are running low while they are in use: top them up ahead of demand."""
        return (self._spare_cap > 0 and self._admitted > 0 and not self._refilling
                and len(self._spares) <= self._spare_cap // 2 and not self.discovery.active)

    def _serve_from_spares(self) -> None:
        # Waiters that queued during a round trip take the spares it brought, in order.
        queue, spares = self._queue, self._spares
        while queue and spares and not self.tpm:
            want = queue.popleft()
            want.grant = SharedTicket(spares.popleft()[0], 0)
            self._admitted += 1
            if want.event is not None:
                want.event.set()

    async def _round_trip(self, wants: list[_Want], *, refill: bool = False) -> AcquireReply:
        now = self._link.clock()
        spares = self._spares
        while spares and spares[0][1] + self._link.backend.lease_seconds <= now:
            self._refunds.append(spares.popleft()[0])
        spare = 0
        if wants or refill:
            spare = self._lease_size(now)
        ends, refunds, settles, cool = self._ends, self._refunds, self._settles, self._cool
        budgets, token_budgets = self._budgets, self._token_budgets
        self._ends, self._refunds, self._settles, self._cool, self._budgets = [], [], [], None, []
        self._token_budgets = []
        script_clock = self._link.script_clock
        args: list[str | int | float] = [
            "" if script_clock is None else repr(script_clock()), self.limit, repr(self.window),
            repr(self.hold), self.tpm, spare,
            "" if cool is None else repr(cool), len(ends), *ends, len(refunds), *refunds, len(settles),
        ]
        for unit, reserved, actual in settles:
            args += [unit, reserved, actual]
        args.append(len(budgets))
        for mark, remaining, after, margin in budgets:
            args += [mark, remaining, repr(after), margin]
        args.append(len(token_budgets))
        for token_mark, remaining, after, margin in token_budgets:
            args += [token_mark, remaining, repr(after), margin]
        discovery, events = self.discovery.take()
        args += [*discovery, len(wants), *(want.tokens for want in wants)]
        self.round_trips += 1
        carrying = bool(ends or refunds or settles or budgets or token_budgets or cool is not None or events)
        self._carrying += carrying
        try:
            reply = await self._link.run_script(self._keys, args)
            self._round_trip_seconds = max(self._link.clock() - now, self._round_trip_seconds * _RTT_DECAY)
            self.discovery.read(reply.generation, reply.discovered_rate)
            if self.discovery.active and spares:  # a spare would go unpaced: back to Redis, soon
                self._refunds += [unit for unit, _ in spares]
                spares.clear()
                self._link.want_flush()
            return reply
        except BaseException:
            # Not known to have applied: keep it all for the next round trip. Each item is
            # idempotent (see _redis_lua), so sending it twice loosens nothing.
            self._ends[:0] = ends
            self._refunds[:0] = refunds
            self._settles[:0] = settles
            self._budgets[:0] = budgets  # a ceiling applied twice is the same ceiling
            self._token_budgets[:0] = token_budgets
            self.discovery.give_back(events)
            if cool is not None:
                self._cool = cool if self._cool is None else max(cool, self._cool)
            raise
        finally:
            self._carrying -= carrying

    def _lease_size(self, now: float) -> int:
        """Spare units to ask for: the demand since the last round trip, or two round trips' worth of it.

        Never more than the cap held in all. A spare counts in Redis like an admitted call, so no
        lease can over-admit; an unused one goes back after ``lease_seconds``, so a larger lease only
        holds room from the other processes a little longer.
        """
        admitted, self._admitted = self._admitted, 0
        started, self._demand_at = self._demand_at, now
        if started is not None and now > started:
            recent = admitted / (now - started)
            self._pace = max(recent, (self._pace + recent) / 2)  # up at once, down by halves
        ahead = math.ceil(2 * self._pace * self._round_trip_seconds)
        return max(0, min(self._spare_cap - len(self._spares), max(admitted, ahead - len(self._spares))))

    # -- settling (synchronous: called from Admission's release methods) ----------

    def settle_ended(
        self, ticket: SharedTicket, actual_tokens: int | None,
        observation: RateLimitObservation | None = None,
    ) -> None:
        """The call reached the provider: its unit counts a window from now; tokens settle to real usage.

        ``observation`` (the answer's rate-limit headers, read on the link's clock) shares the
        provider's reported request budget with every process (only with an RPM limit: units
        and their marks exist only then), and its reported token budget (only with a TPM
        limit: token charges exist only then; the margin is this call's reservation, or
        ``pacing_margin`` of the reported limit if larger, as :mod:`._pacing` keeps it).
        """
        self._end_lease(ticket)
        if not ticket.unit:
            return
        if observation is not None and self.limit:
            remaining, reset_at = observation.requests_remaining, observation.requests_reset_at
            if remaining is not None and reset_at is not None:
                limit = observation.requests_limit or self.limit
                margin = max(1, math.ceil(self.pacing_margin * limit))
                after = max(0.0, reset_at - self._link.clock())
                self._budgets.append((ticket.unit, max(0, remaining), after, margin))
        if observation is not None and self.tpm:
            remaining, reset_at = observation.tokens_remaining, observation.tokens_reset_at
            reported = observation.tokens_limit
            if remaining is None:  # shared limits keep one token budget: Anthropic's input one, cautious
                remaining, reset_at = observation.input_tokens_remaining, observation.input_tokens_reset_at
                reported = observation.input_tokens_limit
            if remaining is not None and reset_at is not None:
                limit = reported or self.tpm
                margin = max(1, ticket.tokens, math.ceil(self.pacing_margin * limit))
                after = max(0.0, reset_at - self._link.clock())
                self._token_budgets.append((ticket.token_mark, max(0, remaining), after, margin))
        if self.limit:
            self._ends.append(ticket.unit)
        if self.tpm and actual_tokens is not None and actual_tokens != ticket.tokens:
            self._settles.append((ticket.unit, ticket.tokens, max(0, actual_tokens)))
        self._kick()

    def settle_unused(self, ticket: SharedTicket) -> None:
        """The call never reached the provider: its unit and every reserved token come back."""
        self._end_lease(ticket)
        if not ticket.unit:
            return
        if self.limit:
            self._refunds.append(ticket.unit)
        if self.tpm and ticket.tokens:
            self._settles.append((ticket.unit, ticket.tokens, 0))
        self._kick()

    def _end_lease(self, ticket: SharedTicket) -> None:
        lease, ticket.lease = ticket.lease, ""
        if lease and self.inflight is not None:
            self.inflight.release(lease)

    def rate_limited(self, ticket: SharedTicket | None, asked_to_wait: bool | None, cooldown: float) -> None:
        """A 429 in this process: every process sharing the scope pauses ``cooldown`` seconds.

        ``asked_to_wait`` is None for a 429 that reported a budget (discovery does not learn from
        it); otherwise the shared discovery learns from it, as a 429 to the call of ``ticket``, or,
        for one reported apart from any call (None), to a call of the generation in force.
        """
        if asked_to_wait is not None:
            generation = self.discovery.generation if ticket is None else ticket.generation
            self.discovery.rate_limited(generation, asked_to_wait)
        if cooldown > 0 and math.isfinite(cooldown):
            self._cool = cooldown if self._cool is None else max(cooldown, self._cool)
            self._kick()

    @property
    def holds_spares(self) -> bool:
        return bool(self._spares)

    @property
    def buffered(self) -> bool:
        return bool(self._ends or self._refunds or self._settles or self._budgets or self._token_budgets
                    or self._cool is not None or self.discovery.buffered)

    @property
    def pending(self) -> bool:
        """Whether releases reported here have not yet all reached Redis (buffered, or on their way)."""
        return self.buffered or self._carrying > 0

    async def flush_idle(self) -> None:
        """Send buffered releases if no leader is about to (the link's flusher calls this)."""
        if self._leader:
            await anyio.lowlevel.checkpoint()
            return  # the leader's next round trip carries everything
        if self.wants_refill:
            self._refilling = True
            try:
                self._admit([], await self._round_trip([], refill=True))
            finally:
                self._refilling = False
            return
        stale_spares = bool(self._spares) and not self._queue and (
            self._spares[0][1] + self._link.backend.lease_seconds <= self._link.clock())
        if self.buffered or stale_spares:
            await self._round_trip([])
        else:
            await anyio.lowlevel.checkpoint()

    async def hand_back(self) -> None:
        """At close: return every spare unit and send what is buffered."""
        self.closed = True
        while self._spares:
            self._refunds.append(self._spares.popleft()[0])
        if self.buffered:
            await self._round_trip([])
        else:
            await anyio.lowlevel.checkpoint()

    def close(self) -> None:
        if self.inflight is not None:
            self.inflight.close()
        self._close_line()

    def statistics(self) -> tuple[int, int]:
        """``(waiting, spares)``."""
        return len(self._queue), len(self._spares)

    @property
    def taking(self) -> int:
        """Admissions waiting in :meth:`take`: they hold their local slot, and have no call yet."""
        return self._taking

    @property
    def unreachable(self) -> bool:
        """Whether the link's round trips wait for the server (:attr:`RedisLink.unreachable`)."""
        return self._link.unreachable
