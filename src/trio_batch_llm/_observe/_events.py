"""The lifecycle events of a batch, and the :class:`Observer` that receives them.

Per batch: one :class:`BatchStarted`; per item that runs, :class:`ItemStarted`
and an :class:`AttemptFailed` for each failed attempt; per item that gets a
result, exactly one terminal event (:func:`terminal_event`:
:class:`ItemCompleted`, :class:`ItemFailed` or :class:`ItemReplayed`); then one
:class:`BatchFinished`. Events are frozen values, built only when someone
observes (see :class:`~._hooks.Hooks`).

Two more events are defined here and not emitted by the engine yet:
:class:`AttemptStarted` and :class:`AttemptSucceeded`. The OpenTelemetry and
Prometheus adapters already accept them (an attempt's span then starts when
its call starts, and carries that call's own model and usage); until the
engine emits them, the adapters derive attempts from :class:`ItemStarted`,
:class:`AttemptFailed` and the terminal event. They are not in the
package's public names until they are emitted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeAlias, final, runtime_checkable

from .._values._categories import ErrorCategory
from .._values._results import BatchTermination, WorkItemResult
from .._values._stats import CounterSnapshot

__all__ = [
    "AttemptEvent",
    "AttemptFailed",
    "AttemptStarted",
    "AttemptSucceeded",
    "BatchFinished",
    "BatchStarted",
    "EVENT_NAMES",
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
class AttemptStarted:
    """An attempt's provider call is about to start (its admission was granted). Not emitted yet.

    ``provider`` and ``model`` are what the call is made to (OpenTelemetry's
    ``gen_ai.system`` and ``gen_ai.request.model``), ``scope`` names its quota
    scope; ``None`` when the strategy does not say.
    """

    item_id: str
    attempt: int
    provider: str | None = None
    model: str | None = None
    scope: str | None = None


@final
@dataclass(frozen=True, slots=True)
class AttemptSucceeded:
    """An attempt's call returned an answer that was accepted. Not emitted yet.

    ``token_usage`` is this call's own usage (the result's sums every attempt).
    """

    item_id: str
    attempt: int
    token_usage: Mapping[str, int] = field(default_factory=dict)


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
"""Every event the engine emits today."""

AttemptEvent: TypeAlias = AttemptStarted | AttemptSucceeded
"""The events the engine does not emit yet (see the module docstring)."""

EVENT_NAMES: Final[Mapping[type[object], str]] = {
    BatchStarted: "batch_started",
    ItemStarted: "item_started",
    AttemptStarted: "attempt_started",
    AttemptFailed: "attempt_failed",
    AttemptSucceeded: "attempt_succeeded",
    ItemCompleted: "item_completed",
    ItemFailed: "item_failed",
    ItemReplayed: "item_replayed",
    BatchFinished: "batch_finished",
}
"""Every event's snake-case name, in the order a batch emits them: the one table that
``BaseObserver``'s ``on_<name>`` methods and the two-argument observer's
:class:`~._event_names.ProcessingEvent` are built from (the classes are ``@final``,
so ``type(event)`` is the key)."""


def terminal_event(result: WorkItemResult[Any]) -> ItemCompleted | ItemFailed | ItemReplayed:
    """The one terminal event for ``result``."""
    if result.replayed:
        return ItemReplayed(result)
    return ItemCompleted(result) if result.success else ItemFailed(result)


@runtime_checkable
class Observer(Protocol):
    """Anything with ``on_event(event)``; a plain callable ``fn(event)`` works too."""

    def on_event(self, event: LifecycleEvent) -> None: ...
