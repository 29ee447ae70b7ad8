"""Where an item's time went: :class:`ItemTiming` and a record per call, :class:`AttemptTiming`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, final

__all__ = ["AttemptTiming", "ItemTiming"]

_BUCKETS: Final = ("admission_wait", "execution", "backoff", "cooldown", "total")


@final
@dataclass(frozen=True, slots=True)
class AttemptTiming:
    """One call of an item, in seconds: the waits before it and the call itself.

    ``backoff``, ``admission_wait`` and ``cooldown`` are the time since the previous
    call ended (or the item started); ``execution`` is the call (and its parsing).
    The records of an item add up to its :class:`ItemTiming` up to its last call.
    """

    attempt: int
    execution: float = 0.0
    admission_wait: float = 0.0
    cooldown: float = 0.0
    backoff: float = 0.0


@final
@dataclass(slots=True)
class ItemTiming:
    """Where an item's time went, in seconds.

    The four buckets split ``total`` with no gap and no overlap, also when a
    deadline or a stop cut the item short mid-wait: ``admission_wait`` (from
    the start, and waiting for a slot or a quota), ``cooldown`` (waiting out a
    rate-limit cooldown), ``execution`` (calls), ``backoff`` (from a failed
    call to the next admission).
    """

    admission_wait: float = 0.0
    execution: float = 0.0
    backoff: float = 0.0
    cooldown: float = 0.0
    total: float = 0.0
    attempts: list[AttemptTiming] = field(default_factory=list, repr=False, compare=False)
    """One record per call (not stored in checkpoints: a replayed result has none)."""

    def close_attempt(self, attempt: int) -> None:
        """The call ``attempt`` ended: book the time since the previous one ended as its record."""
        booked = self.attempts
        if not booked:  # the first call (nearly every item's only one): all the time so far is its
            booked.append(AttemptTiming(attempt, execution=self.execution, admission_wait=self.admission_wait,
                                        cooldown=self.cooldown, backoff=self.backoff))
            return
        booked.append(AttemptTiming(
            attempt,
            execution=self.execution - sum(a.execution for a in booked),
            admission_wait=self.admission_wait - sum(a.admission_wait for a in booked),
            cooldown=self.cooldown - sum(a.cooldown for a in booked),
            backoff=self.backoff - sum(a.backoff for a in booked),
        ))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ItemTiming:
        """The buckets as :meth:`to_dict` wrote them (no per-call records: they are not stored)."""
        wait, execution, backoff, cooldown, total = (float(data.get(name, 0.0)) for name in _BUCKETS)
        return cls(wait, execution, backoff, cooldown, total)

    def to_dict(self) -> dict[str, float]:
        return {
            "admission_wait": self.admission_wait,
            "execution": self.execution,
            "backoff": self.backoff,
            "cooldown": self.cooldown,
            "total": self.total,
        }
