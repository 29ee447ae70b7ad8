"""A simulated provider and client around the pure quota core: no event loop, exact times.

The provider enforces a request (and optionally token) limit over a sliding
window, as the mock server does, and can change it at given times. It answers
each call at the moment it arrives (after the client's ``transit``) and the
answer reaches the client ``latency`` later, with OpenAI-style headers when
``headers`` is set (what is left after this call, and the time until the
window is empty) and a truthful ``Retry-After`` on its 429s when ``retry_after``
is set. The client is ``workers`` workers that each admit through
:class:`QuotaCore`, call, and retry a refused call (as the engine does: a
scope-held retry at once, a blip after its own wait).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from trio_batch_llm import RateLimitConfig
from trio_batch_llm._admission._core import Grant, QuotaCore, Ticket
from trio_batch_llm._admission._headers import parse_rate_limit_headers

WINDOW = 60.0


@dataclass
class Provider:
    limit: int
    token_limit: int | None = None
    headers: bool = True
    retry_after: bool = True
    schedule: tuple[tuple[float, int], ...] = ()  # (time, new request limit)
    blip_every: int = 0  # every n-th call that fits is refused anyway (a 429 with capacity left)
    window: float = WINDOW
    served: deque[tuple[float, int]] = field(default_factory=deque)
    accepted: list[float] = field(default_factory=list)
    refused: list[float] = field(default_factory=list)
    _fits: int = 0
    _tokens: int = 0  # the tokens in ``served``

    def limit_at(self, now: float) -> int:
        limit = self.limit
        for at, value in self.schedule:
            if now >= at:
                limit = value
        return limit

    def _prune(self, now: float) -> None:
        while self.served and self.served[0][0] + self.window <= now:
            self._tokens -= self.served.popleft()[1]

    def arrive(self, now: float, tokens: int) -> tuple[bool, dict[str, str]]:
        self._prune(now)
        limit = self.limit_at(now)
        used = len(self.served)
        used_tokens = self._tokens
        fits = used + 1 <= limit and (self.token_limit is None or used_tokens + tokens <= self.token_limit)
        blip = False
        if fits and self.blip_every:
            self._fits += 1
            blip = self._fits % self.blip_every == 0
        if fits and not blip:
            self.served.append((now, tokens))
            self._tokens += tokens
            self.accepted.append(now)
            used, used_tokens = used + 1, used_tokens + tokens
        else:
            self.refused.append(now)
        headers: dict[str, str] = {}
        if self.headers:
            empty_in = (self.served[-1][0] + self.window - now) if self.served else 0.0
            headers.update({
                "x-ratelimit-limit-requests": str(limit),
                "x-ratelimit-remaining-requests": str(max(0, limit - used)),
                "x-ratelimit-reset-requests": f"{empty_in:.3f}s",
            })
            token_limit = self.token_limit if self.token_limit is not None else 10**9
            if True:
                headers.update({
                    "x-ratelimit-limit-tokens": str(token_limit),
                    "x-ratelimit-remaining-tokens": str(max(0, token_limit - used_tokens)),
                    "x-ratelimit-reset-tokens": f"{empty_in:.3f}s",
                })
        if not (fits and not blip) and self.retry_after:
            wait = 1.0 if blip else self._wait(now, tokens, limit)
            headers["retry-after-ms"] = str(math.ceil(wait * 1000))
        return fits and not blip, headers

    def _wait(self, now: float, tokens: int, limit: int) -> float:
        live = self.served
        excess = len(live) + 1 - limit
        wait = 0.0
        if excess > 0:
            wait = live[excess - 1][0] + self.window - now if excess <= len(live) else self.window
        if self.token_limit is not None:
            over = self._tokens + tokens - self.token_limit
            freed = 0
            for at, t in live:
                if over <= 0:
                    break
                freed += t
                if freed >= over:
                    wait = max(wait, at + self.window - now)
                    break
        return max(wait, 0.001)


@dataclass
class Client:
    core: QuotaCore
    provider: Provider
    workers: int
    latency: float = 0.05
    transit: float = 0.01
    tokens: int = 0  # the estimate passed at admission
    usage: int = 100  # the real tokens of each call
    stop: float = 300.0
    now: float = 0.0
    _events: list[tuple[float, int, Callable[[], None]]] = field(default_factory=list)
    _seq: itertools.count[int] = field(default_factory=itertools.count)
    _head_timer: float = math.inf
    _timer_id: int = 0
    admissions: list[float] = field(default_factory=list)
    trace: list[tuple[float, str]] = field(default_factory=list)

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (when, next(self._seq), action))

    def run(self) -> None:
        for _ in range(self.workers):
            self.at(0.0, self.attempt)
        while self._events:
            when, _, action = heapq.heappop(self._events)
            if when > self.stop:
                break
            self.now = when
            action()

    def attempt(self) -> None:
        core = self.core
        try:
            grant = core.try_admit_nowait(self.tokens, self.now)
        except anyio.WouldBlock:
            ticket = core.enqueue(self.tokens)
            self._look(list(core.admit_waiters(self.now)))
            if ticket.grant is None:
                self._waiting(ticket)
            return
        self._call(grant)

    def _waiting(self, ticket: Ticket) -> None:
        self._arm()

    def _look(self, woken: list[Ticket]) -> None:
        for ticket in woken:
            if ticket.grant is not None:
                grant, ticket.grant = ticket.grant, None
                self._call(grant)
        self._arm()

    def _arm(self) -> None:
        # The head waiter sleeps until its ready time (or a release wakes it): one timer, the latest.
        core = self.core
        if not core.queue:
            return
        ready = core.ready_at(core.queue[0].tokens, self.now)
        if ready < math.inf and ready != self._head_timer:
            self._head_timer = ready
            self._timer_id += 1
            timer_id = self._timer_id
            self.at(max(ready, self.now), lambda: self._timer(timer_id))

    def _timer(self, timer_id: int) -> None:
        if timer_id != self._timer_id:
            return  # superseded by a later one
        self._head_timer = math.inf
        self._look(list(self.core.admit_waiters(self.now)))

    def _call(self, grant: Grant) -> None:
        self.admissions.append(self.now)
        self.at(self.now + self.transit, lambda: self._arrive(grant))

    def _arrive(self, grant: Grant) -> None:
        ok, headers = self.provider.arrive(self.now, self.usage)
        self.at(self.now + self.latency - self.transit, lambda: self._answer(grant, ok, headers))

    def _answer(self, grant: Grant, ok: bool, headers: dict[str, str]) -> None:
        core = self.core
        observation = parse_rate_limit_headers(headers, self.now) if headers else None
        if ok:
            self._look(list(core.release(grant, self.usage, self.now, observation)))
            self.at(self.now, self.attempt)
            return
        retry_after = observation.retry_after if observation is not None else None
        wait, woken = core.release_rate_limited(grant, retry_after, None, self.now, observation)
        self._look(list(woken))
        self.at(self.now + wait, self.attempt)


def simulate(provider: Provider, *, workers: int = 64, config: RateLimitConfig | None = None,
             rpm: float | None = None, tpm: int | None = None, stop: float = 300.0,
             latency: float = 0.05, tokens: int = 0, usage: int = 100) -> Client:
    core = QuotaCore(concurrency=workers, requests_per_minute=rpm, tokens_per_minute=tpm,
                     rate_limit=config or RateLimitConfig())
    client = Client(core, provider, workers, latency=latency, stop=stop, tokens=tokens, usage=usage)
    client.run()
    return client


def served_between(provider: Provider, start: float, stop: float) -> int:
    return sum(1 for t in provider.accepted if start <= t < stop)


def refused_between(provider: Provider, start: float, stop: float) -> int:
    return sum(1 for t in provider.refused if start <= t < stop)
