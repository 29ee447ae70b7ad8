"""The lifecycle events of a batch, and the :class:`Observer` that receives them.

Per batch: one :class:`BatchStarted`; per item that runs, :class:`ItemStarted`
and an :class:`AttemptFailed` for each failed attempt; per item that gets a
result, exactly one terminal event (:func:`terminal_event`:
:class:`ItemCompleted`, :class:`ItemFailed` or :class:`ItemReplayed`); then one
:class:`BatchFinished`. Events are frozen values, built only when someone
observes (see :class:`~._hooks.Hooks`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, final, runtime_checkable

from .._values._categories import ErrorCategory
from .._values._results import BatchTermination, WorkItemResult
from .._values._stats import CounterSnapshot

__all__ = [
    "AttemptFailed",
    "BatchFinished",
    "BatchStarted",
    "ItemCompleted",
    "ItemFailed",
    "ItemReplayed",
    "ItemStarted",
    "LifecycleEvent",
    "Observer",
    "terminal_event",
]


@final
@dataclass(frozen=True, slots=True)
class BatchStarted:
    total: int | None
    """Items known up front; ``None`` for a stream."""


@final
@dataclass(frozen=True, slots=True)
class ItemStarted:
    item_id: str
    attempt: int = 1


@final
@dataclass(frozen=True, slots=True)
class AttemptFailed:
    item_id: str
    attempt: int
    category: ErrorCategory


@final
@dataclass(frozen=True, slots=True)
class ItemCompleted:
    result: WorkItemResult[Any]


@final
@dataclass(frozen=True, slots=True)
class ItemFailed:
    result: WorkItemResult[Any]


@final
@dataclass(frozen=True, slots=True)
class ItemReplayed:
    """Answered from the artifact store (success, or a replayed failure under ``REUSE_ALL``)."""

    result: WorkItemResult[Any]


@final
@dataclass(frozen=True, slots=True)
class BatchFinished:
    termination: BatchTermination
    counts: CounterSnapshot


LifecycleEvent: TypeAlias = (
    BatchStarted | ItemStarted | AttemptFailed | ItemCompleted | ItemFailed | ItemReplayed | BatchFinished
)


def terminal_event(result: WorkItemResult[Any]) -> ItemCompleted | ItemFailed | ItemReplayed:
    """The one terminal event for ``result``."""
    if result.replayed:
        return ItemReplayed(result)
    return ItemCompleted(result) if result.success else ItemFailed(result)


@runtime_checkable
class Observer(Protocol):
    """Anything with ``on_event(event)``; a plain callable ``fn(event)`` works too."""

    def on_event(self, event: LifecycleEvent) -> None: ...
