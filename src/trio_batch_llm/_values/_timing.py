"""Where an item's time and money went: :class:`ItemTiming`, and a record per call, :class:`AttemptTiming`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, final

from ._cost import call_cost

__all__ = ["AttemptTiming", "ItemTiming"]

_BUCKETS: Final = ("admission_wait", "execution", "backoff", "cooldown", "total")
_NO_USAGE: Final[Mapping[str, int]] = MappingProxyType({})
"""The usage of a call that reported none (shared: most records of a mock run, no dict each)."""


@final
@dataclass(frozen=True, slots=True)
class AttemptTiming:
    """One call of an item: the waits before it and the call itself, in seconds, and what it used.

    ``backoff``, ``admission_wait`` and ``cooldown`` are the time since the previous
    call ended (or the item started); ``execution`` is the call (and its parsing).
    The records of an item add up to its :class:`ItemTiming` up to its last call.

    ``token_usage`` is this call's own (a failed call's from its exception's ``token_usage``;
    empty when it reported none, or was cut short); the records' usages add up to the item's
    ``token_usage``. :attr:`cost` prices it.
    """

    attempt: int
    execution: float = 0.0
    admission_wait: float = 0.0
    cooldown: float = 0.0
    backoff: float = 0.0
    token_usage: Mapping[str, int] = field(default_factory=lambda: _NO_USAGE, hash=False)  # shared empty
    model: str | None = None
    """The model that answered (its reported ``model``, else the strategy's ``model_name``)."""
    cost_function: Callable[[Any], float] | None = field(default=None, repr=False, compare=False)
    """The config's ``GuardrailConfig.cost_function``, when set: it prices this call instead of the table."""

    @property
    def input_tokens(self) -> int | None:
        return self.token_usage.get("input_tokens")

    @property
    def output_tokens(self) -> int | None:
        return self.token_usage.get("output_tokens")

    @property
    def cached_input_tokens(self) -> int | None:
        return self.token_usage.get("cached_input_tokens")

    @property
    def total_tokens(self) -> int | None:
        return self.token_usage.get("total_tokens")

    @property
    def cost(self) -> float | None:
        """Dollars this call cost: ``cost_function(token_usage)`` when the config has one, else
        :attr:`model`'s built-in rates (``DEFAULT_MODEL_RATES``). ``None`` when unknown: no usage,
        a model not in the table, or a ``cost_function`` that failed (the budget reports that).

        Priced when read, not when the call ended: the item path pays nothing for it."""
        return call_cost(self.token_usage, self.model, self.cost_function)


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

    def close_attempt(
        self,
        attempt: int,
        usage: Mapping[str, int] | None = None,
        model: str | None = None,
        cost_function: Callable[[Any], float] | None = None,
    ) -> None:
        """The call ``attempt`` ended: book the time since the previous one ended as its record,
        with the call's own ``usage`` (its cost is priced when read, by ``cost_function`` or ``model``)."""
        booked = self.attempts
        if not booked:  # the first call (nearly every item's only one): all the time so far is its
            booked.append(AttemptTiming(attempt, self.execution, self.admission_wait, self.cooldown,
                                        self.backoff, usage or _NO_USAGE, model, cost_function))
            return
        booked.append(AttemptTiming(
            attempt,
            execution=self.execution - sum(a.execution for a in booked),
            admission_wait=self.admission_wait - sum(a.admission_wait for a in booked),
            cooldown=self.cooldown - sum(a.cooldown for a in booked),
            backoff=self.backoff - sum(a.backoff for a in booked),
            token_usage=usage or _NO_USAGE,
            model=model,
            cost_function=cost_function,
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
