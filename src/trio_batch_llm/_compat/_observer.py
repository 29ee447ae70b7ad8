"""``BaseObserver``: an observer with a method per event, over the one ``on_event(event)``."""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

from .._observe._events import (
    AttemptFailed,
    AttemptStarted,
    AttemptSucceeded,
    BatchFinished,
    BatchStarted,
    ItemCompleted,
    ItemFailed,
    ItemReplayed,
    ItemStarted,
    LifecycleEvent,
)

__all__ = ["BaseObserver"]

_METHODS: dict[type[Any], str] = {
    BatchStarted: "on_batch_started",
    ItemStarted: "on_item_started",
    AttemptStarted: "on_attempt_started",
    AttemptFailed: "on_attempt_failed",
    AttemptSucceeded: "on_attempt_succeeded",
    ItemCompleted: "on_item_completed",
    ItemFailed: "on_item_failed",
    ItemReplayed: "on_item_replayed",
    BatchFinished: "on_batch_finished",
}


class BaseObserver:
    """Override the ``on_<event>`` methods you need; each gets the frozen event record.

    The methods are called synchronously on the engine's path (an observer must not
    block it), so they are plain ``def``; a subclass that makes one ``async def``, or
    overrides ``on_event`` with async-batch-llm's ``(event, data)`` signature, is refused
    when it is defined, with the reason. An observer that raises is logged and counted,
    never breaks the run.
    """

    _PER_EVENT: ClassVar[tuple[str, ...]] = tuple(_METHODS.values())

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in ("on_event", *cls._PER_EVENT):
            method = getattr(cls, name)
            if inspect.iscoroutinefunction(method):
                raise TypeError(
                    f"{cls.__qualname__}.{name} is async: observers are called synchronously here "
                    "(a slow observer would stall every worker); make it a plain def, and hand slow "
                    "work to a task or a thread of your own"
                )
        if cls.on_event is not BaseObserver.on_event:
            params = list(inspect.signature(cls.on_event).parameters)
            if len(params) != 2:
                raise TypeError(
                    f"{cls.__qualname__}.on_event{inspect.signature(cls.on_event)}: here an observer "
                    "gets one event record, on_event(self, event) (async-batch-llm passed (event, data)); "
                    "or override the per-event methods, e.g. on_item_completed(self, event)"
                )

    def on_event(self, event: LifecycleEvent) -> None:
        name = _METHODS.get(type(event))
        if name is not None:
            getattr(self, name)(event)

    def on_batch_started(self, event: BatchStarted) -> None:
        """The batch started (``event.total``: items known up front, ``None`` for a stream)."""

    def on_item_started(self, event: ItemStarted) -> None:
        """An item's first attempt is about to run."""

    def on_attempt_started(self, event: AttemptStarted) -> None:
        """A call to the provider is about to start."""

    def on_attempt_failed(self, event: AttemptFailed) -> None:
        """An attempt failed (``event.category``); the item may be retried."""

    def on_attempt_succeeded(self, event: AttemptSucceeded) -> None:
        """A call to the provider succeeded."""

    def on_item_completed(self, event: ItemCompleted) -> None:
        """An item succeeded (``event.result``)."""

    def on_item_failed(self, event: ItemFailed) -> None:
        """An item failed for good (``event.result``)."""

    def on_item_replayed(self, event: ItemReplayed) -> None:
        """An item's result came from the checkpoint store."""

    def on_batch_finished(self, event: BatchFinished) -> None:
        """The batch ended (``event.termination``, ``event.counts``)."""
