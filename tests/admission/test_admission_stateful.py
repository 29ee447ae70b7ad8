"""hypothesis.stateful models of the quota cores and of one scope's combined machine.

The cores are synchronous and take ``now`` explicitly, so these run with no
event loop: time is a float the machine advances. Each machine keeps its own
independent model (lists of stamps and charges) and checks the core against
it after every step, and checks the window invariants over the whole history.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import anyio
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from trio_batch_llm import AdmissionClosedError, RateLimitConfig
from trio_batch_llm._admission._core import Grant, QuotaCore, Ticket
from trio_batch_llm._admission._limits import (
    WINDOW_SECONDS,
    CooldownCore,
    RequestRateCore,
    TokenRateCore,
    TokenReservation,
)

SETTINGS = settings(
    max_examples=300, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
# Steps chosen to hit window edges exactly (60, 30 + 30, 0.25 * 4) as well as to miss them.
STEPS = st.sampled_from([0.0, 0.25, 1.0, 2.5, 7.0, 29.75, 30.0, 59.75, 60.0, 61.0, 150.0])
RATE_LIMIT = RateLimitConfig(
    cooldown_seconds=5.0, backoff_multiplier=2.0, max_cooldown_seconds=30.0,
    slow_start_seconds=6.0, slow_start_initial_fraction=0.25, learn_limits=False,
)


# -- requests per minute ----------------------------------------------------


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """The most half-open spans ``[start, stop)`` that share one instant."""
    # At equal times a span that stops is counted out before one that starts.
    events = sorted([(start, 1) for start, _ in spans] + [(stop, -1) for _, stop in spans])
    best = count = 0
    for _, delta in events:
        count += delta
        best = max(best, count)
    return best


class RequestCall:
    """The model of one admitted request: admitted at ``start``, its call ended at ``end``."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.end: float | None = None  # None while the call is open


def charged_spans(calls: list[RequestCall], window: float, now: float) -> list[tuple[float, float]]:
    # A request is charged from its admission until a window after its call
    # ended; an open call, until at least a window after now.
    return [(c.start, (now if c.end is None else c.end) + window) for c in calls]


def max_arrivals_in_window(calls: list[RequestCall], window: float, now: float) -> int:
    """The most arrivals any window ``[s, s + window)`` can have seen, however transit times fell.

    A request arrives at some ``a`` in ``[start, end]``. If ``k`` arrivals fall
    in one window ``[s, s + window)``, all ``k`` charged spans contain the last
    of them (each starts before it and stops at ``end + window >= s + window``),
    so the most spans sharing an instant bounds the arrivals in any window.
    """
    return max_overlap(charged_spans(calls, window, now))


class RequestRateMachine(RuleBasedStateMachine):
    calls = Bundle("calls")

    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0
        self.history: list[RequestCall] = []  # every admission not refunded

    @initialize(rpm=st.sampled_from([0.5, 1, 2, 2.5, 3, 7.9, 12]), burst=st.sampled_from([None, 1, 2]))
    def configure(self, rpm: float, burst: int | None) -> None:
        self.core = RequestRateCore(rpm, burst=burst)
        self.rpm, self.burst = rpm, burst

    @rule(step=STEPS)
    def advance(self, step: float) -> None:
        self.now += step

    def charged(self) -> list[RequestCall]:
        window = self.core.window
        return [c for c in self.history if c.end is None or c.end + window > self.now]

    def open_calls(self) -> int:
        return sum(c.end is None for c in self.history)

    def fits_in_model(self) -> bool:
        if len(self.charged()) >= self.core.limit:
            return False
        if self.burst is not None and self.burst < self.core.limit:
            burst_window = self.core.window * self.burst / self.core.limit
            if len([c for c in self.history if c.start + burst_window > self.now]) >= self.burst:
                return False
        return True

    @rule(target=calls)
    def admit(self) -> RequestCall:
        expected = self.fits_in_model()
        try:
            stamp = self.core.try_admit_nowait(self.now)
        except anyio.WouldBlock:
            assert not expected
            ready = self.core.ready_at(self.now)
            assert self.now < ready
            if self.open_calls() >= self.core.limit:
                # Every unit is held by a call still running: only its end can help.
                assert ready == math.inf
                return multiple()
            assert ready < math.inf
            # Exactly at the ready time it fits (nothing else changed meanwhile).
            self.now = ready
            stamp = self.core.try_admit_nowait(self.now)
        else:
            assert expected
        assert stamp == self.now
        call = RequestCall(stamp)
        self.history.append(call)
        return call

    @rule(call=consumes(calls))
    def end(self, call: RequestCall) -> None:
        call.end = self.now
        self.core.end(self.now)

    @rule(call=consumes(calls))
    def refund(self, call: RequestCall) -> None:
        self.history.remove(call)
        self.core.refund(call.start, self.now)

    @invariant()
    def window_holds(self) -> None:
        assert self.core.requests_in_window(self.now) == len(self.charged())
        assert max_arrivals_in_window(self.history, self.core.window, self.now) <= self.core.limit
        if self.rpm >= 1:
            # The promise in its plain form: never more than rpm arrivals in any 60 s.
            assert max_arrivals_in_window(self.history, 60.0, self.now) <= self.rpm

    def teardown(self) -> None:
        # Ended calls leave the window; only open calls are still charged.
        self.now += 2 * self.core.window
        assert self.core.requests_in_window(self.now) == self.open_calls()


# -- tokens per minute ------------------------------------------------------


class TokenRateMachine(RuleBasedStateMachine):
    reservations = Bundle("reservations")
    TPM = 1000

    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0
        self.core = TokenRateCore(self.TPM)
        self.charges: list[list[float]] = []  # [time, amount] model entries, debt included
        self.entry_of: dict[int, list[float]] = {}
        self.admissions: list[tuple[float, list[float]]] = []  # (time, model entry), in order
        self.window_sum_at_admission: list[float] = []

    def live_sum(self) -> float:
        return sum(amount for t, amount in self.charges if t + WINDOW_SECONDS > self.now)

    @rule(step=STEPS)
    def advance(self, step: float) -> None:
        self.now += step

    @rule(target=reservations, estimate=st.sampled_from([0, 1, 100, 333, 600, 999, 1000, 2500]))
    def admit(self, estimate: int) -> TokenReservation:
        size = min(estimate, self.TPM)
        try:
            reservation = self.core.try_admit_nowait(estimate, self.now)
        except anyio.WouldBlock:
            assert self.live_sum() + size > self.TPM
            ready = self.core.ready_at(estimate, self.now)
            assert self.now < ready < math.inf
            self.now = ready
            reservation = self.core.try_admit_nowait(estimate, self.now)
        assert self.live_sum() + size <= self.TPM
        assert reservation.reserved == size
        entry = [self.now, float(size)]
        self.charges.append(entry)
        self.entry_of[id(reservation)] = entry
        self.admissions.append((self.now, entry))
        return reservation

    @rule(reservation=consumes(reservations), ratio=st.sampled_from([None, 0.0, 0.5, 1.0, 1.5, 3.0]))
    def reconcile(self, reservation: TokenReservation, ratio: float | None) -> None:
        actual = None if ratio is None else int(reservation.reserved * ratio)
        entry = self.entry_of[id(reservation)]
        live = entry[0] + WINDOW_SECONDS > self.now
        if actual is not None and actual < reservation.reserved and live:
            entry[1] -= reservation.reserved - actual
        if actual is not None and actual > reservation.reserved:
            self.charges.append([self.now, float(actual - reservation.reserved)])
        self.core.reconcile(reservation, actual, self.now)
        self.core.reconcile(reservation, 0, self.now)  # a second settlement is a no-op

    @rule(reservation=consumes(reservations))
    def refund(self, reservation: TokenReservation) -> None:
        entry = self.entry_of[id(reservation)]
        if entry[0] + WINDOW_SECONDS > self.now:
            entry[1] = 0.0
        self.core.refund(reservation, self.now)

    @invariant()
    def reservations_within_tpm(self) -> None:
        assert self.core.reserved_in_window(self.now) == self.live_sum()
        assert self.core.available(self.now) == max(0, self.TPM - self.live_sum())
        # Any 60 s window holds at most TPM of reserved tokens (after refunds):
        # take each admission as the last one of a window ending at its time.
        for i, (t, _) in enumerate(self.admissions):
            window = sum(e[1] for s, e in self.admissions[: i + 1] if s + WINDOW_SECONDS > t)
            assert window <= self.TPM

    def teardown(self) -> None:
        # Every reservation leaves the window: nothing is charged forever.
        self.now += 2 * WINDOW_SECONDS
        assert self.core.reserved_in_window(self.now) == 0


# -- cooldown and ramp ------------------------------------------------------


class CooldownMachine(RuleBasedStateMachine):
    BOUND = 10

    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0
        self.core = CooldownCore(RATE_LIMIT)
        self.last_limit = self.BOUND

    @rule(step=STEPS | st.sampled_from([0.5, 1.5, 3.0]))
    def advance(self, step: float) -> None:
        before = self.core.remaining(self.now)
        self.now += step
        limit = self.core.concurrency_limit(self.BOUND, self.now)
        if before == 0:
            # Without a new report, the ramp only ever grows.
            assert limit >= self.last_limit
        self.last_limit = limit

    @rule(retry_after=st.sampled_from([None, None, 0.0, 1.0, 3.0, 45.0]),
          age=st.sampled_from([None, 0, 1]))
    def report(self, retry_after: float | None, age: int | None) -> None:
        core = self.core
        generation = None if age is None else max(0, core.generation - age)
        stale = generation is not None and generation < core.generation
        cooling = core.remaining(self.now) > 0
        end_before = self.now + core.remaining(self.now)
        started = core.report(retry_after, self.now, admitted_generation=generation)
        end_after = self.now + core.remaining(self.now)
        assert started == (not cooling and not stale)
        if started:
            if retry_after is not None:
                assert end_after == self.now + retry_after
            else:
                assert end_after - self.now <= RATE_LIMIT.max_cooldown_seconds
                assert end_after - self.now >= RATE_LIMIT.cooldown_seconds
        elif retry_after is None:
            assert end_after == end_before  # joining a storm never adds time
        else:
            assert end_after == max(end_before, self.now + retry_after)  # never end to end
        self.last_limit = core.concurrency_limit(self.BOUND, self.now)

    @rule(in_flight=st.integers(0, BOUND))
    def ready_time_is_exact(self, in_flight: int) -> None:
        core = self.core
        ready = core.concurrency_ready_at(self.BOUND, in_flight, self.now)
        limit_now = core.concurrency_limit(self.BOUND, self.now)
        if in_flight >= self.BOUND:
            assert ready == math.inf
        elif limit_now > in_flight:
            assert ready <= self.now
        else:
            assert self.now < ready < math.inf
            assert core.concurrency_limit(self.BOUND, ready) > in_flight
            before = math.nextafter(ready, -math.inf)
            assert core.concurrency_limit(self.BOUND, before) <= in_flight

    @invariant()
    def limit_follows_the_ramp(self) -> None:
        core, now = self.core, self.now
        limit = core.concurrency_limit(self.BOUND, now)
        assert 0 <= limit <= self.BOUND
        if core.remaining(now) > 0:
            assert limit == 0
        else:
            assert limit >= max(1, math.ceil(RATE_LIMIT.slow_start_initial_fraction * self.BOUND))
        if not core.active(now):
            assert limit == self.BOUND


# -- one scope: all quotas at once, FIFO ------------------------------------


class Held:
    """The machine's record of one admission (grants that hold only a slot are shared objects)."""

    def __init__(self, grant: Grant, call: RequestCall | None) -> None:
        self.grant = grant
        self.call = call  # its RPM unit in the model, None without RPM or once refunded


class ScopeMachine(RuleBasedStateMachine):
    """The combined core, driven the way the async wrapper drives it.

    Tickets are waiters. ``head_wakes`` is the head waiter waking (its event
    or its deadline) and admitting; ``waiter_returns`` is a granted waiter
    running again and taking its grant; ``withdraw`` is a waiter cancelled
    (possibly after it was granted but before it ran). Each grant is settled
    exactly once (the async handle makes repeats no-ops), through the
    uncontended path or the timed one, as the wrapper would.
    """

    admissions = Bundle("admissions")
    tickets = Bundle("tickets")

    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0
        self.request_calls: dict[int, Held] = {}  # every RPM unit not refunded, by id of its holder
        self.outstanding: dict[int, Held] = {}  # admissions a caller holds
        self.waiting: dict[int, Ticket] = {}  # tickets in arrival order, not yet returned or withdrawn
        self.granted: dict[int, Held] = {}  # by ticket: granted, not yet returned or withdrawn
        self.arrival: dict[int, int] = {}
        self.granted_order: list[int] = []
        # Time passed since the head waiter last looked (its task has not run yet):
        # it may be able to go, and a newcomer must still not pass it.
        self.head_is_late = False

    # A third of the runs have neither RPM nor TPM: the scope the uncontended path serves.
    @initialize(bound=st.integers(1, 4), rpm=st.sampled_from([None, None, 3, 5.5]),
                tpm=st.sampled_from([None, None, 1000]))
    def configure(self, bound: int, rpm: float | None, tpm: int | None) -> None:
        self.core = QuotaCore(concurrency=bound, requests_per_minute=rpm, tokens_per_minute=tpm,
                              rate_limit=RATE_LIMIT)
        self.rpm, self.tpm = rpm, tpm

    def check_admitted_now(self) -> None:
        """Whatever was just admitted, it was admitted within every quota in force now."""
        core, now = self.core, self.now
        assert core.in_flight <= core.cooldown.concurrency_limit(core.bound, now)
        assert core.cooldown.remaining(now) == 0
        if core.requests is not None:
            assert core.requests.requests_in_window(now) <= core.requests.limit
        if core.tokens is not None:
            assert core.tokens.reserved_in_window(now) <= core.tokens.tokens_per_minute

    def admitted(self, grant: Grant, tokens: int) -> Held:
        assert grant.generation == self.core.cooldown.generation
        assert (grant.request_stamp is not None) == (self.rpm is not None)
        if grant.request_stamp is not None:
            assert grant.request_stamp == self.now
        assert grant.tokens_reserved == (0 if self.tpm is None else min(tokens, self.tpm))
        held = Held(grant, None if grant.request_stamp is None else RequestCall(self.now))
        if held.call is not None:
            self.request_calls[id(held)] = held
        return held

    def after(self, woken: Sequence[Ticket]) -> None:
        """Account for waiters a core call admitted; each must be among the tickets it said to wake."""
        core = self.core
        newly = [t for t in self.waiting.values() if t.grant is not None and id(t) not in self.granted]
        for ticket in newly:
            assert ticket in woken  # else its owner would sleep on, holding a slot it does not know of
            assert ticket.grant is not None
            self.granted_order.append(self.arrival[id(ticket)])
            self.granted[id(ticket)] = self.admitted(ticket.grant, ticket.tokens)
        if newly:
            self.check_admitted_now()
        if core.queue and not core.closed and not self.head_is_late:
            # Nobody is left waiting at the head who could go now.
            assert core.ready_at(core.queue[0].tokens, self.now) > self.now

    def head_looked(self, woken: Sequence[Ticket]) -> None:
        """The head waiter (if any) just ran a full admission pass."""
        self.head_is_late = False
        self.after(woken)

    def refund(self, held: Held) -> None:
        self.request_calls.pop(id(held), None)

    def end_call(self, held: Held) -> None:
        if held.call is not None:
            held.call.end = self.now

    @rule(step=STEPS)
    def advance(self, step: float) -> None:
        """Time passes; a head waiter whose ready time comes up wakes then, as its deadline fires."""
        core, target = self.core, self.now + step
        while core.queue and not core.closed:
            ready = core.ready_at(core.queue[0].tokens, self.now)
            if ready > target:
                break
            self.now = max(self.now, ready)
            self.head_looked(core.admit_waiters(self.now))
        self.now = target

    @rule(step=STEPS)
    def advance_while_the_head_is_late(self, step: float) -> None:
        """Time passes and the head waiter's task does not run (a busy event loop): it wakes late."""
        self.now += step
        self.head_is_late = bool(self.core.queue)

    @rule(target=admissions, tokens=st.sampled_from([0, 100, 700, 5000]), uncontended_first=st.booleans())
    def try_admit(self, tokens: int, uncontended_first: bool) -> object:
        core = self.core
        waiting = bool(core.queue)
        fits = not core.closed and not waiting and core.ready_at(tokens, self.now) <= self.now
        if uncontended_first:
            # The scope's path: ask without a clock first, and with ``now`` only if told to.
            grant = core.try_admit_uncontended()
            if grant is not None:
                assert fits and self.rpm is None and self.tpm is None
                assert grant == Grant(core.cooldown.generation, None, None, None)
                return self.hold(grant, tokens)
        if core.closed:
            with pytest.raises(AdmissionClosedError):
                core.try_admit_nowait(tokens, self.now)
            return multiple()
        try:
            grant = core.try_admit_nowait(tokens, self.now)
        except anyio.WouldBlock:
            assert not fits
            return multiple()
        assert fits  # FIFO: nobody jumps the queue
        return self.hold(grant, tokens)

    def hold(self, grant: Grant, tokens: int) -> Held:
        held = self.admitted(grant, tokens)
        self.check_admitted_now()
        self.outstanding[id(held)] = held
        return held

    @precondition(lambda self: not self.core.closed)
    @rule(target=tickets, tokens=st.sampled_from([0, 100, 700, 5000]))
    def enqueue(self, tokens: int) -> Ticket:
        ticket = self.core.enqueue(tokens)
        self.waiting[id(ticket)] = ticket
        self.arrival[id(ticket)] = len(self.arrival)
        if self.core.queue[0] is ticket:
            # As in admit(): a waiter that is first in line tries before it sleeps.
            self.head_looked(self.core.admit_waiters(self.now))
        return ticket

    @precondition(lambda self: bool(self.core.queue))
    @rule()
    def head_wakes(self) -> None:
        self.head_looked(self.core.admit_waiters(self.now))

    @precondition(lambda self: bool(self.core.queue) and not self.core.closed)
    @rule()
    def head_sleeps_until_ready(self) -> None:
        core = self.core
        ready = core.ready_at(core.queue[0].tokens, self.now)
        woken: Sequence[Ticket] = ()
        if ready < math.inf:
            self.now = max(self.now, ready)
            before = len(core.queue)
            woken = core.admit_waiters(self.now)
            assert len(core.queue) < before  # the ready time was exact
        self.head_looked(woken)

    @rule(target=admissions, ticket=tickets)
    def waiter_returns(self, ticket: Ticket) -> object:
        held = self.granted.pop(id(ticket), None)
        if held is None or id(ticket) not in self.waiting:
            return multiple()
        del self.waiting[id(ticket)]
        assert ticket.grant is held.grant
        self.outstanding[id(held)] = held
        return held

    @rule(ticket=consumes(tickets))
    def withdraw(self, ticket: Ticket) -> None:
        if self.waiting.pop(id(ticket), None) is None:
            return  # it already returned with its grant
        held = self.granted.pop(id(ticket), None)
        if held is not None:
            self.refund(held)  # granted, cancelled before it ran: all refunded
        passes = held is not None or self.core.queue[0] is ticket  # the core admits whoever is next
        woken = self.core.withdraw(ticket, self.now)
        assert ticket not in self.core.queue and ticket.grant is None
        if passes:
            self.head_looked(woken)
        else:
            self.after(woken)

    def settle(self, held: Held, actual: int | None, uncontended_first: bool) -> Sequence[Ticket]:
        core = self.core
        before = core.in_flight
        if uncontended_first:
            nothing_to_settle = held.grant.request_stamp is None and held.grant.token_reservation is None
            quiet = nothing_to_settle and not core.queue
            if core.release_uncontended(held.grant):
                assert quiet and core.in_flight == before - 1
                return ()
            assert core.in_flight == before
        return core.release(held.grant, actual, self.now)

    @rule(held=consumes(admissions), ratio=st.sampled_from([None, 0.0, 0.5, 2.0]),
          uncontended_first=st.booleans())
    def release(self, held: Held, ratio: float | None, uncontended_first: bool) -> None:
        actual = None if ratio is None else int(held.grant.tokens_reserved * ratio)
        del self.outstanding[id(held)]
        self.end_call(held)
        self.head_looked(self.settle(held, actual, uncontended_first))

    @rule(held=consumes(admissions))
    def release_unused(self, held: Held) -> None:
        self.refund(held)
        del self.outstanding[id(held)]
        self.head_looked(self.core.release_unused(held.grant, self.now))

    @rule(held=admissions, retry_after=st.sampled_from([None, 2.0]))
    def rate_limited(self, held: Held, retry_after: float | None) -> None:
        """A 429 reported for a call that is still held (the report comes before the release)."""
        self.core.report_rate_limit(retry_after, self.now, admitted_generation=held.grant.generation)

    @rule(held=consumes(admissions), retry_after=st.sampled_from([None, 2.0]),
          ratio=st.sampled_from([None, 0.5]))
    def release_rate_limited(self, held: Held, retry_after: float | None, ratio: float | None) -> None:
        core = self.core
        actual = None if ratio is None else int(held.grant.tokens_reserved * ratio)
        fresh = held.grant.generation == core.cooldown.generation and core.cooldown.remaining(self.now) == 0
        reported = core.rate_limits_reported
        del self.outstanding[id(held)]
        self.end_call(held)
        wait, woken = core.release_rate_limited(held.grant, retry_after, actual, self.now)
        assert wait == 0.0
        assert core.rate_limits_reported == reported + 1
        if fresh:
            # A fresh 429 starts a cooldown before the slot is freed: nobody slipped in.
            assert core.cooldown.remaining(self.now) > 0
            assert not any(t.grant is not None for t in woken)
        self.head_looked(woken)

    @precondition(lambda self: not self.core.closed)
    @rule(now=st.integers(0, 9))
    def close(self, now: int) -> None:
        if now:
            return  # closing is final: rarely, so that runs mostly exercise an open scope
        core = self.core
        assert list(core.close()) == list(core.queue)
        with pytest.raises(AdmissionClosedError):
            core.enqueue(0)
        assert core.try_admit_uncontended() is None

    @invariant()
    def quotas_hold(self) -> None:
        core = self.core
        assert core.in_flight == len(self.outstanding) + len(self.granted)
        assert 0 <= core.in_flight <= core.bound
        if core.requests is not None:
            calls = [held.call for held in self.request_calls.values() if held.call is not None]
            assert max_arrivals_in_window(calls, 60.0, self.now) <= core.requests.requests_per_minute
            window = core.requests.window
            charged = [c for c in calls if c.end is None or c.end + window > self.now]
            assert core.requests.requests_in_window(self.now) == len(charged)
        # FIFO: waiters were admitted in the order they arrived.
        assert self.granted_order == sorted(self.granted_order)
        assert [id(t) for t in core.queue] == [
            id(t) for t in self.waiting.values() if t.grant is None and t in core.queue
        ]

    def teardown(self) -> None:
        core = self.core
        for ticket in list(self.waiting.values()):
            core.withdraw(ticket, self.now)
        for held in list(self.outstanding.values()):
            core.release(held.grant, None, self.now)
        self.now += 1000.0
        stats = core.statistics(self.now)
        assert (stats.in_flight, stats.waiting) == (0, 0)
        assert stats.tokens_reserved_in_window in (None, 0)
        assert stats.requests_in_window in (None, 0)
        assert stats.concurrency_limit == core.bound


TestRequestRate = RequestRateMachine.TestCase
TestRequestRate.settings = SETTINGS
TestTokenRate = TokenRateMachine.TestCase
TestTokenRate.settings = SETTINGS
TestCooldown = CooldownMachine.TestCase
TestCooldown.settings = SETTINGS
TestScope = ScopeMachine.TestCase
TestScope.settings = SETTINGS


def test_a_late_head_waiter_is_not_passed_on_the_uncontended_path() -> None:
    # After a cooldown and its ramp, the first timed admission reopens the
    # clock-free path while the head waiter (woken at its ready time, but its
    # task not run yet) still waits: a newcomer must not take its slot.
    core = QuotaCore(concurrency=2, rate_limit=RATE_LIMIT)
    first = core.try_admit_uncontended()
    assert first is not None
    core.release_rate_limited(first, None, None, 0.0)
    ticket = core.enqueue(0)
    assert core.admit_waiters(0.0) == [ticket] and ticket.grant is None  # cooling down
    late = 60.0  # the cooldown (5 s) and its ramp (6 s) are long over
    with pytest.raises(anyio.WouldBlock):
        core.try_admit_nowait(0, late)
    assert core.fast  # the ramp is over: the clock-free path is open again ...
    assert core.try_admit_uncontended() is None  # ... but not past a waiter
    assert core.admit_waiters(late) == [ticket] and ticket.grant is not None
    assert core.in_flight == 1
