"""Pacing by what the provider says, and discovering its limit when it says nothing.

Pure, like :mod:`._limits`: synchronous, ``now`` passed in, no event loop. The
quota core (:mod:`._core`) asks :meth:`PacingCore.ready_at` before every
admission, stamps each admitted call with a :class:`PaceMark`, and reports what
each answer said (a :class:`~._headers.RateLimitObservation`, or nothing).

**Header pacing.** Both budgets a provider reports (requests and tokens) are
kept as a *ceiling* on a running total of what this scope has charged: a call
charges 1 request and its token charge at admission, and its mark is the total
just after (itself included). An answer to the call with mark ``m`` that says
``remaining`` is left until ``reset_at`` means the provider will take
``remaining`` more after that call, so the scope may charge up to
``m + remaining - margin`` until ``reset_at``. Calls admitted after the answered
one are already in that total, which is how calls in flight that the provider
has not counted yet are subtracted; ``margin`` (``pacing_margin`` of the limit,
at least one call) covers the calls admitted just before it that reached the
provider just after it. A fresher answer (higher mark) replaces the ceiling; a
staler one can only lower it. When the ceiling is reached and no call is in
flight (so no answer will come to move it), one *probe* may go at the time the
reported budget would have refilled by one call at an even rate.

Within the ceiling, admissions are spread, never burst: at most
``max(limit / 60 s, left / (reset_at - now))`` per second (the second term only
for a reset at least a second away), with a credit of :data:`~._limits.PACE_CREDIT`
seconds, so idle time buys a short burst, not a window's worth.

**Discovery** (:mod:`._discovery`) takes over when the provider reported no
budget within the last window: a request rate learnt from 429s alone.

**Tokens.** Charges are the caller's token estimate times the observed ratio of
real usage to estimates (for the pace; the ceiling never charges less than the
estimate itself); with no estimate (0), the mean real usage per call.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Final, NamedTuple, final

from .._values._config import RateLimitConfig
from .._values._token_estimates import output_part
from .._values._usage import UsedTokens
from ._discovery import Discovery
from ._headers import RateLimitObservation
from ._limits import NOW, PACE_CREDIT, WINDOW_SECONDS

__all__ = ["HeaderBudget", "PaceMark", "PacingCore"]

_MIN_RESET_SPREAD: Final = 1.0  # a reset nearer than this is not worth spreading toward
_RATIO_WEIGHT: Final = 0.1  # the weight of each new answer in the usage/estimate averages


class PaceMark(NamedTuple):
    """Where one admitted call stands in its scope's pacing (see the module docstring)."""

    requests: int
    """The scope's request total just after this call's admission (itself included)."""
    tokens: float
    """The scope's token total (ceiling charges) just after this call's admission."""
    estimate: int
    """The caller's token estimate for the call (0: none given)."""
    generation: int
    """The discovery generation at admission: a 429 from an older one lowers nothing."""
    input_tokens: float = 0.0
    """The scope's input-token total just after this call's admission (:meth:`PacingCore.split`)."""
    output_tokens: float = 0.0
    """The scope's output-token total just after this call's admission."""


@final
class HeaderBudget:
    """One reported budget (requests or tokens): its ceiling on the running total, and its pace."""

    __slots__ = ("_probed_at", "_tat", "ceiling", "limit", "mark", "observed_at", "remaining", "reset_at")

    def __init__(self) -> None:
        self.limit: int | None = None
        self.remaining: int | None = None
        self.ceiling = math.inf  # the running total may reach this before reset_at
        self.mark = -math.inf  # the mark of the answer the ceiling comes from
        self.reset_at = NOW
        self.observed_at = NOW
        self._probed_at = NOW
        self._tat = NOW  # the pace's theoretical next admission (GCRA)

    @property
    def reported(self) -> bool:
        """Whether the provider ever reported this budget."""
        return self.observed_at > NOW

    def live(self, now: float) -> bool:
        """Whether the provider reported this budget within the last window."""
        return now < self.observed_at + WINDOW_SECONDS

    def observe(self, mark: float, limit: int | None, remaining: int | None, reset_at: float | None,
                at: float, margin: float) -> None:
        """Take one answer's report: the call with ``mark`` left ``remaining`` until ``reset_at``."""
        if limit is not None and limit > 0:
            self.limit = limit
        if remaining is None and limit is None:
            return
        self.observed_at = max(self.observed_at, at)
        if remaining is None:
            return
        reset = reset_at if reset_at is not None else at + WINDOW_SECONDS
        # Answers arrive out of order (calls of different lengths). The answer to the latest call
        # (highest mark) knows the most and replaces the ceiling; a stale one may only lower it:
        # the provider may count a call we think it has not seen yet, never the other way round.
        # Once the reset passed, the old ceiling describes a window that is gone: any answer wins.
        ceiling = mark + remaining - margin
        if mark >= self.mark or self.reset_at <= at:
            self.ceiling, self.mark, self.reset_at, self.remaining = ceiling, mark, reset, remaining
        elif ceiling < self.ceiling:  # an older call's answer that says less: believe the cautious one
            self.ceiling, self.remaining = ceiling, remaining

    def ready_at(self, charge: float, total: float, in_flight: int, now: float) -> float:
        """When a call charging ``charge`` fits the ceiling and the pace (``total``: charged so far)."""
        ready = NOW
        reset_at = self.reset_at
        if now < reset_at and total + charge > self.ceiling:
            # At the ceiling with calls in flight, their answers will move it: wait for them. With
            # none in flight no answer will come, and waiting for the reset could idle the scope a
            # whole window while the provider's budget refills: one probe goes when it would have
            # refilled by one call, and its answer reports the budget afresh.
            ready = reset_at if in_flight else min(reset_at, self._probe_at(charge))
        # The pace (theoretical arrival time, less the credit): calls spread over the window instead
        # of spending the budget in one burst that a provider counting per second would refuse.
        if self.limit is not None and self._tat - PACE_CREDIT > ready:
            ready = self._tat - PACE_CREDIT
        return ready

    def _probe_at(self, charge: float) -> float:
        # The time the reported budget would have refilled by one call, at an even rate.
        limit, remaining = self.limit, self.remaining
        span = self.reset_at - self.observed_at
        if limit is None or remaining is None or span <= 0:
            return self.reset_at
        step = span * max(charge, 1.0) / max(charge, 1.0, limit - remaining)
        return max(self.observed_at, self._probed_at) + step

    def rate(self, total: float, now: float) -> float | None:
        """The pace in units per second: the limit over a window, or what is left over the time left."""
        if self.limit is None:
            return None
        rate = self.limit / WINDOW_SECONDS
        left_for = self.reset_at - now
        if left_for >= _MIN_RESET_SPREAD and math.isfinite(self.ceiling):
            rate = max(rate, (self.ceiling - total) / left_for)
        return rate

    def commit(self, charge: float, total: float, now: float) -> None:
        """An admission of ``charge`` at ``now``, with ``total`` already including it."""
        if now < self.reset_at and total > self.ceiling:
            self._probed_at = now
        rate = self.rate(total, now)
        if rate is not None and rate > 0 and charge > 0:
            self._tat = max(self._tat, now) + charge / rate


@final
class PacingCore:
    """One scope's header pacing and discovery; ``active`` once either has anything to say."""

    __slots__ = (
        "_cached", "_config", "_mean_tokens", "_open", "_ratio", "active", "blips", "discovery",
        "input_total", "inputs", "output_total", "outputs", "requests", "requests_total", "tokens",
        "tokens_total",
    )

    def __init__(self, config: RateLimitConfig, *, requests_per_minute: float | None = None,
                 shared_discovery: bool = False) -> None:
        self._config = config
        self.requests = HeaderBudget()
        self.tokens = HeaderBudget()
        self.inputs = HeaderBudget()  # Anthropic's input- and output-token budgets, paced apart
        self.outputs = HeaderBudget()
        self.input_total = self.output_total = 0.0
        self._cached: float | None = None  # the share of input tokens that were cache reads, averaged
        self.discovery = Discovery(config, requests_per_minute, shared=shared_discovery)
        self.active = False
        self.requests_total = 0
        self.tokens_total = 0.0
        self.blips = 0
        self._open = 0  # paced calls (with a mark) not settled yet
        self._ratio = 1.0  # real tokens / estimate, averaged over answers
        self._mean_tokens = 0.0  # real tokens per call, averaged over answers

    # -- admission ----------------------------------------------------------------------------

    def _paced_tokens(self, estimate: int) -> float:
        return estimate * self._ratio if estimate > 0 else self._mean_tokens

    def _ceiling_tokens(self, estimate: int) -> float:
        return estimate * max(1.0, self._ratio) if estimate > 0 else self._mean_tokens

    def headers_live(self, now: float) -> bool:
        return (self.requests.live(now) or self.tokens.live(now) or self.inputs.live(now)
                or self.outputs.live(now))

    def split(self, estimate: int) -> tuple[float, float]:
        """A call's ``(input, output)`` charges: its estimate less its output part (a
        :class:`TokenCharge`), and that part. Unknown parts are charged whole to both budgets
        (the cautious side); no estimate at all, the mean real usage per call."""
        if estimate <= 0:
            return self._mean_tokens, self._mean_tokens
        output = output_part(estimate)
        if output is None:
            return float(estimate), float(estimate)
        # Cache reads do not count against the input budget: charge the share that was not one.
        return (estimate - output) * (1.0 - (self._cached or 0.0)), float(output)

    def ready_at(self, estimate: int, in_flight: int, now: float) -> float:
        """The earliest time a call with token ``estimate`` fits every reported budget and the pace."""
        requests, tokens = self.requests, self.tokens
        ready = NOW
        live = False
        if requests.live(now):
            live = True
            ready = requests.ready_at(1, self.requests_total, in_flight, now)
        if tokens.live(now):
            live = True
            at = tokens.ready_at(self._ceiling_tokens(estimate), self.tokens_total, in_flight, now)
            if at > ready:
                ready = at
        if self.inputs.live(now) or self.outputs.live(now):  # each part within what its budget has left
            live = True
            charges = self.split(estimate)
            for budget, charge, total in ((self.inputs, charges[0], self.input_total),
                                          (self.outputs, charges[1], self.output_total)):
                if budget.live(now) and (at := budget.ready_at(charge, total, in_flight, now)) > ready:
                    ready = at
        if not live:
            ready = self.discovery.ready_at(in_flight, now)
        return ready

    def commit(self, estimate: int, now: float) -> PaceMark:
        """Charge one admitted call; return its mark."""
        self.requests_total += 1
        charge = self._ceiling_tokens(estimate)
        self.tokens_total += charge
        if self.requests.live(now):
            self.requests.commit(1, self.requests_total, now)
        if self.tokens.live(now):
            # The pace charges the usage-corrected estimate, the ceiling the cautious one.
            self.tokens.commit(self._paced_tokens(estimate), self.tokens_total, now)
        charge_in, charge_out = self.split(estimate)
        self.input_total += charge_in
        self.output_total += charge_out
        if self.inputs.live(now):
            self.inputs.commit(charge_in, self.input_total, now)
        if self.outputs.live(now):
            self.outputs.commit(charge_out, self.output_total, now)
        self.discovery.commit(now)
        self._open += 1
        return PaceMark(self.requests_total, self.tokens_total, estimate, self.discovery.generation,
                        self.input_total, self.output_total)

    def forget_discovery(self) -> None:
        """Start discovery over: what it learnt came from refusals now known for noise.

        The generation goes on (a 429 to a call admitted before is still as new as it was).
        """
        old = self.discovery
        self.discovery = Discovery(self._config, None if math.isinf(old.cap) else old.cap * WINDOW_SECONDS,
                                   shared=old.shared)
        self.discovery.generation = old.generation
        self.discovery.wall_offset = old.wall_offset

    def use_wall_clock(self, clock: Callable[[], float]) -> None:
        """Give discovery the wall clock: ``time.time()`` minus ``clock()``, the scope's clock."""
        self.discovery.wall_offset = lambda: time.time() - clock()

    # -- answers ------------------------------------------------------------------------------

    def refund(self, mark: PaceMark | None) -> None:
        """A paced call that never reached the provider: it stays charged (the cautious side)."""
        # Not uncharged: calls admitted after it carry marks that count it, and the ceilings their
        # answers set are read against the total; lowering the total would admit one call more
        # than the provider said remains.
        if mark is not None:
            self._open -= 1

    def discovery_signal(self, observation: RateLimitObservation | None, retry_after: float | None,
                         now: float) -> bool | None:
        """Whether a 429 feeds discovery (see :meth:`rate_limited`): ``None`` if not, else whether
        the provider asked to wait."""
        if (observation is not None and observation.reports_budget) or self.headers_live(now):
            return None
        return retry_after is not None or (observation is not None and observation.retry_after is not None)

    def _mark_of(self, mark: PaceMark | None, in_flight: int) -> PaceMark:
        """``mark``, or the place of a call admitted before pacing began (in generation 0).

        Every paced call came after such a call, and so did, at most, the other
        unpaced calls still in flight: it is placed that far before the first
        paced one. (Unpaced calls that came after it and already ended are not
        known; the margin covers a few.)
        """
        if mark is not None:
            self._open -= 1
            return mark
        unpaced = max(0, in_flight - self._open)
        return PaceMark(-unpaced, -unpaced * self._mean_tokens, 0, 0)

    def _observe(self, mark: PaceMark, observation: RateLimitObservation) -> None:
        margin = self._config.pacing_margin
        obs = observation
        if obs.requests_limit is not None or obs.requests_remaining is not None:
            self.active = True
            limit = obs.requests_limit or self.requests.limit or 0
            self.requests.observe(mark.requests, obs.requests_limit, obs.requests_remaining,
                                  obs.requests_reset_at, obs.at, max(1.0, margin * limit))
        if obs.tokens_limit is not None or obs.tokens_remaining is not None:
            self.active = True
            limit = obs.tokens_limit or self.tokens.limit or 0
            per_call = self._ceiling_tokens(mark.estimate)
            self.tokens.observe(mark.tokens, obs.tokens_limit, obs.tokens_remaining,
                                obs.tokens_reset_at, obs.at, max(per_call, margin * limit))
        for budget, (total, part), (limit_of, remaining, reset_at) in (
                (self.inputs, (mark.input_tokens, 0), (obs.input_tokens_limit, obs.input_tokens_remaining,
                                                       obs.input_tokens_reset_at)),
                (self.outputs, (mark.output_tokens, 1), (obs.output_tokens_limit, obs.output_tokens_remaining,
                                                         obs.output_tokens_reset_at))):
            if limit_of is not None or remaining is not None:
                self.active = True
                per_call = self.split(mark.estimate)[part]
                budget.observe(total, limit_of, remaining, reset_at, obs.at,
                               max(per_call, margin * (limit_of or budget.limit or 0)))

    def _learn_usage(self, estimate: int, actual: int | None) -> None:
        if actual is None or actual < 0:
            return
        weight = _RATIO_WEIGHT if self._mean_tokens else 1.0
        self._mean_tokens += weight * (actual - self._mean_tokens)
        if estimate > 0:
            self._ratio += weight * (actual / estimate - self._ratio)

    def answered(self, mark: PaceMark | None, actual_tokens: int | None,
                 observation: RateLimitObservation | None, in_flight: int, now: float, *,
                 served: bool = True) -> None:
        """A call's answer that was not a 429 (``in_flight``: calls still out, this one excluded).

        ``served=False``: a failure that says nothing about the rate (an overload, a 5xx): its
        reported budgets are read, but discovery does not count it served."""
        placed = self._mark_of(mark, in_flight)
        if served:
            self._learn_usage(placed.estimate, actual_tokens)
            if isinstance(actual_tokens, UsedTokens) and actual_tokens.input > 0:
                share = actual_tokens.cached / actual_tokens.input
                cached = self._cached
                self._cached = share if cached is None else cached + _RATIO_WEIGHT * (share - cached)
        if observation is not None:
            self._observe(placed, observation)
        if served:
            self.discovery.answered(placed.generation, now)

    def rate_limited(self, mark: PaceMark | None, observation: RateLimitObservation | None,
                     retry_after: float | None, in_flight: int, now: float, served_before: int = 0) -> bool:
        """A call's 429; return ``True`` when it was a blip (its headers say capacity remains).

        A blip only moves the reported budgets. Otherwise a reported budget
        moves its ceiling (the refused call was not counted, so nothing is
        learnt of its usage), and a 429 that reports no budget feeds discovery,
        unless the provider reported budgets within the last window.
        """
        placed = self._mark_of(mark, in_flight)
        if observation is not None and observation.reports_budget:
            self._observe(placed, observation)
            if observation.capacity_remains:
                self.blips += 1
                return True
        elif (asked := self.discovery_signal(observation, retry_after, now)) is not None:
            self.active = True
            self.discovery.rate_limited(placed.generation, asked, now, served_before)
        return False

    # -- reporting ------------------------------------------------------------------------------

    def mode(self, now: float) -> str:
        if self.headers_live(now):
            return "headers"
        return "discovery" if self.discovery.rate is not None else "inactive"

    def paced_requests_per_minute(self, now: float) -> float | None:
        """The request pace in force now, per minute (``None``: none)."""
        if self.requests.live(now):
            rate = self.requests.rate(self.requests_total, now)
            return None if rate is None else rate * WINDOW_SECONDS
        if self.headers_live(now) or self.discovery.rate is None:
            return None
        return self.discovery.rate * WINDOW_SECONDS

    def paced_tokens_per_minute(self, now: float) -> float | None:
        if not self.tokens.live(now):
            return None
        rate = self.tokens.rate(self.tokens_total, now)
        return None if rate is None else rate * WINDOW_SECONDS
