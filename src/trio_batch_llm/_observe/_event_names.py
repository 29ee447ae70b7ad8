"""async-batch-llm's observer form, ``async def on_event(event, data)``: an event name and a dict.

Our events are frozen records (:mod:`._events`); an async observer whose
``on_event`` takes two arguments is called with ``(ProcessingEvent.X, data)``
instead, built here per call: :class:`ProcessingEvent` is a ``StrEnum``, so
``event.name`` is async-batch-llm's upper-case name and ``event == "item_completed"``
holds. ``data`` holds the record's fields (a terminal event adds ``item_id``,
``BatchFinished`` adds its counters), a fresh dict per observer and call.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, final

from .._values._categories import ErrorCategory
from ._events import EVENT_NAMES, AttemptFailed, BatchFinished, ItemCompleted, ItemFailed, ItemReplayed

__all__ = ["ProcessingEvent", "TwoArgumentObserver", "event_data", "takes_event_and_data"]


class ProcessingEvent(enum.StrEnum):
    """The names a two-argument observer gets (async-batch-llm's, where it has the event)."""

    BATCH_STARTED = "batch_started"
    ITEM_STARTED = "item_started"
    ATTEMPT_STARTED = "attempt_started"
    ATTEMPT_FAILED = "attempt_failed"
    RATE_LIMIT_HIT = "rate_limit_hit"
    """An attempt failed with category ``rate_limit`` (other categories: ``ATTEMPT_FAILED``)."""
    ATTEMPT_SUCCEEDED = "attempt_succeeded"
    ITEM_COMPLETED = "item_completed"
    ITEM_FAILED = "item_failed"
    ITEM_REPLAYED = "item_replayed"
    BATCH_COMPLETED = "batch_completed"
    """``BatchFinished``, however the batch ended (``data["termination"]`` says how)."""


# async-batch-llm calls the batch's end "batch_completed"; every other name is ours.
_NAMES: dict[type[object], ProcessingEvent] = {
    event: ProcessingEvent.BATCH_COMPLETED if event is BatchFinished else ProcessingEvent(name)
    for event, name in EVENT_NAMES.items()
}


def event_data(event: Any) -> tuple[ProcessingEvent, dict[str, Any]]:
    """``event`` as async-batch-llm's ``(event, data)``."""
    data = {field.name: getattr(event, field.name) for field in dataclasses.fields(event)}
    name = _NAMES[type(event)]
    if isinstance(event, AttemptFailed) and event.category is ErrorCategory.RATE_LIMIT:
        name = ProcessingEvent.RATE_LIMIT_HIT
    elif isinstance(event, (ItemCompleted, ItemFailed, ItemReplayed)):
        data["item_id"] = event.result.item_id
    elif isinstance(event, BatchFinished):
        data.update(dataclasses.asdict(event.counts))
    return name, data


def takes_event_and_data(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` needs two positional arguments (``on_event(event, data)``)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or an odd callable: called with the record
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in parameters if p.kind in positional and p.default is p.empty]
    return len(required) == 2


@final
class TwoArgumentObserver:
    """Calls an async ``on_event(event, data)`` with :func:`event_data` of each record."""

    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[[ProcessingEvent, dict[str, Any]], Awaitable[object]]) -> None:
        self._fn = fn

    async def __call__(self, event: Any) -> None:
        name, data = event_data(event)
        await self._fn(name, data)
