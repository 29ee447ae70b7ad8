"""The records a quota scope hands its callers: a call's :class:`Grant`, a waiter's :class:`Ticket`.

What it reports to observers (its statistics, its pace) are values: :mod:`.._values._quota_reports`.
"""

from __future__ import annotations

from typing import Any, NamedTuple, final

from ._limits import TokenReservation
from ._pacing import PaceMark

__all__ = ["Grant", "Ticket", "check_tokens"]


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


def check_tokens(tokens: int) -> None:
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens={tokens!r}: must be a whole number >= 0")
