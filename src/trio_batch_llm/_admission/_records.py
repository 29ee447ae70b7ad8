"""The records of a quota scope: a call's :class:`Grant`, a waiter's :class:`Ticket`, its pace, statistics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, final

from ._limits import TokenReservation
from ._pacing import PaceMark

__all__ = ["Grant", "Pace", "QuotaScopeStatistics", "Ticket", "check_tokens"]


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
    pace: PaceMark | None
    """Where the call stands in the scope's pacing; ``None`` when no pacing was in force."""

    @property
    def tokens_reserved(self) -> int:
        """Tokens reserved for this call (0 when the scope has no token limit)."""
        reservation = self.token_reservation
        return 0 if reservation is None else reservation.reserved


class Pace(NamedTuple):
    """What a scope's learning admission knows at one moment, compared before and after a release to log
    what the release changed (:class:`~trio_batch_llm._observe._log.PaceWatch`).

    Read through :meth:`QuotaCore.pace <trio_batch_llm._admission._core.QuotaCore.pace>`, so the logger
    reads one record rather than the cores inside the scope.
    """

    cooldowns: int
    """The cooldown generation: it moves when a new cooldown starts."""
    rate: float | None
    """The discovered request rate, per second (``None``: nothing discovered, or learning off)."""
    request_limit: int | None
    """The request limit the provider reported (``None``: never reported, or learning off)."""
    token_limit: int | None
    """The token limit the provider reported (``None``: never reported, or learning off)."""


@final
class Ticket:
    """A request waiting in a scope's FIFO queue."""

    __slots__ = ("enqueued", "event", "grant", "throttle", "tokens")

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.grant: Grant | None = None  # set by the core when it admits this waiter
        self.event: Any = None  # the async wrapper's wake-up event; never touched by the core
        self.throttle: Any = None  # the async wrapper's ThrottleBudget for this waiter, if bounded
        self.enqueued = 0.0  # when it queued, on the scope's clock (read with ``throttle`` only)


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
    pacing: str = "off"
    """``"off"`` (learning disabled), ``"inactive"`` (nothing learnt), ``"headers"`` or ``"discovery"``."""
    paced_requests_per_minute: float | None = None
    """The request pace in force now (learnt from headers or discovered); ``None``: none."""
    paced_tokens_per_minute: float | None = None
    """The token pace in force now (learnt from headers); ``None``: none."""
    reported_requests_remaining: int | None = None
    """The requests the provider last said were left (``None``: never said)."""
    reported_tokens_remaining: int | None = None
    """The tokens the provider last said were left (``None``: never said)."""
    rate_limit_blips: int = 0
    """429s retried by their call alone, no scope-wide effect: headers said capacity remained, or too
    short a run of refusals for the noise share (:mod:`._refusals`)."""
    backend: str = "local"
    """Where the RPM/TPM limits are kept: ``"local"`` (this process) or ``"redis"`` (shared)."""
    backend_round_trips: int = 0
    """Round trips to the shared backend on behalf of this scope (admissions and releases)."""
    backend_spares: int = 0
    """Spare request units this process holds from the shared backend, ready to admit without a round trip."""
    refusing_for: float = 0.0
    """Seconds since the provider last answered this scope other than with a 429, while it answers
    only 429s (0: its last answer was not a 429). With a cooldown running, the scope is throttled."""
    backend_waiting: int = 0
    """Admissions that hold a slot (counted in ``in_flight``) while they wait for the shared backend
    to grant their share: no call has started for them yet."""
    backend_unreachable: bool = False
    """Whether the shared backend cannot be reached now (still connecting, or its round trips fail):
    admissions wait for it, up to its ``unreachable_timeout``."""

    @property
    def throttled(self) -> bool:
        """Whether the provider is holding this scope back: a cooldown runs, or every answer is a 429."""
        return self.cooldown_remaining > 0 or self.refusing_for > 0


def check_tokens(tokens: int) -> None:
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens={tokens!r}: must be a whole number >= 0")
