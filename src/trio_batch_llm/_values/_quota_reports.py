"""What a quota scope reports: its statistics and its pace, records that observers and the progress line read.

Values (no runtime): the observers (:mod:`trio_batch_llm._observe`) stand on a lower floor than
admission, so what admission reports to them lives here, below both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, final

__all__ = ["Pace", "QuotaScopeStatistics"]


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
