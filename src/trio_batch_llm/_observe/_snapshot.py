"""A run's progress at one instant, and the :class:`Progress` interface that receives it.

Everything that shows or hands on progress stands on these two: the engine
drives a :class:`Progress` with snapshots (see :mod:`._progress`), the
displays of :mod:`._display` draw them, and the command line wraps them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import final

import anyio.lowlevel

__all__ = ["Progress", "ProgressSnapshot", "estimate_eta"]


@final
@dataclass(frozen=True, slots=True)
class ProgressSnapshot:
    """The state of a run at one instant.

    ``completed`` counts items with a result of their own, failures and replays
    included; ``failed`` and ``replayed`` are parts of it. ``not_run`` counts, apart
    from it, the items a stop (Ctrl+C, a guardrail) kept from starting: they are
    neither progress nor failures, as :meth:`BatchResult.summary` has them.
    ``rate`` is completions per second of items that ran, over a recent window
    (replays excluded, they cost nothing); ``eta`` is seconds left at that rate,
    ``None`` when unknown: before an item ran to its end, or after a stop (the
    rest will not run).

    When the engine knows its quota scopes, ``in_flight`` counts calls in flight
    and ``waiting`` the items started but not in a call (waiting for admission, a
    cooldown or a backoff); ``throttled`` then says why nothing moves when the
    provider holds the run back ("cooling down 0:42", "every call refused for 1:15"),
    ``""`` otherwise; ``waiting_for`` names what the waiting items wait for when it is
    not the provider ("the quota backend": a shared Redis that cannot be reached), ``""``
    otherwise. Without them, ``in_flight`` counts every started item.
    """

    completed: int
    failed: int
    in_flight: int
    total: int | None
    replayed: int = 0
    tokens_total: int = 0
    elapsed: float = 0.0
    rate: float = 0.0
    eta: float | None = None
    waiting: int = 0
    throttled: str = ""
    not_run: int = 0
    waiting_for: str = ""

    @property
    def succeeded(self) -> int:
        return self.completed - self.failed

    def with_total(self, total: int, *, final: bool = False) -> ProgressSnapshot:
        """This snapshot for a run whose caller knows ``total`` (a streaming run does not): its ETA,
        and, when ``final`` (the run is over), every item without a result of its own counted as not
        run: never read because a stop came first, or abandoned in flight by a forced stop."""
        if not final:
            return dataclasses.replace(self, total=total,
                                       eta=estimate_eta(total, self.completed, self.not_run, self.rate))
        not_run = max(self.not_run, total - self.completed)
        return dataclasses.replace(self, total=total, not_run=not_run, in_flight=0, waiting=0,
                                   eta=estimate_eta(total, self.completed, not_run, self.rate))

    @property
    def fraction(self) -> float | None:
        """Share of ``total`` completed, in ``[0, 1]``; ``None`` without a total."""
        if self.total is None:
            return None
        if self.total <= 0:
            return 1.0
        return min(1.0, max(0.0, self.completed / self.total))


def estimate_eta(total: int | None, completed: int, not_run: int, rate: float) -> float | None:
    """Seconds left at ``rate``: ``0.0`` when all is done; ``None`` without a total, before an item
    ran to its end (``rate`` 0: nothing to estimate from), or once a stop left items not run."""
    if total is None or not_run:
        return None
    remaining = max(0, total - completed)
    if remaining == 0:
        return 0.0
    return remaining / rate if rate > 0 else None


class Progress:
    """What the engine drives. Every method has a do-nothing default.

    - ``update(snapshot)``: sync and cheap; from the engine's progress task,
      at most every ``progress_interval``.
    - ``on_item(completed, total, item_id)``: sync, O(1), never blocks; when an item finishes.
    - ``await on_item_async(...)``: the same, and delivers it if that takes awaiting.
    - ``close(final)`` / ``await aclose(final)``: last draw and last delivery; idempotent.
    """

    def update(self, snapshot: ProgressSnapshot) -> None:
        """Show ``snapshot``."""

    def on_item(self, completed: int, total: int | None, item_id: str) -> None:
        """Note that ``item_id`` finished, ``completed`` of ``total`` so far."""

    async def on_item_async(self, completed: int, total: int | None, item_id: str) -> None:
        self.on_item(completed, total, item_id)
        await anyio.lowlevel.checkpoint()

    def close(self, final: ProgressSnapshot) -> None:
        """Show ``final`` and stop."""

    async def aclose(self, final: ProgressSnapshot) -> None:
        self.close(final)
        await anyio.lowlevel.checkpoint()
