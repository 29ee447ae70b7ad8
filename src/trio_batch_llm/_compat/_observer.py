"""``BaseObserver``: an observer with a method per event, over the one ``on_event(event)``."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable
from typing import Any, ClassVar

import anyio.lowlevel

from .._observe._events import (
    EVENT_NAMES,
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

_METHODS: dict[type[object], str] = {event: f"on_{name}" for event, name in EVENT_NAMES.items()}


class BaseObserver:
    """Override the ``on_<event>`` methods you need; each gets the frozen event record.

    Plain ``def`` methods are called synchronously on the engine's path (keep them
    cheap). If any of them is ``async def`` (or ``on_event`` is), the observer is
    awaited in a task of its own, fed through a bounded queue, each call bounded by
    ``ProcessorConfig.observer_timeout`` (the observability guide says how); its
    plain methods then run in that task too. async-batch-llm's
    ``async def on_event(self, event, data)`` is accepted (a :class:`ProcessingEvent`
    and a dict); a plain ``def`` with two arguments is refused when the class is
    defined, with the reason. An observer that raises is logged and counted, never
    breaks the run.
    """

    _PER_EVENT: ClassVar[tuple[str, ...]] = tuple(_METHODS.values())

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        on_event: object = cls.on_event
        if on_event is not BaseObserver.on_event and on_event is not BaseObserver._on_event_async:
            signature = inspect.signature(cls.on_event)
            if len(signature.parameters) == 3 and inspect.iscoroutinefunction(cls.on_event):
                return  # async-batch-llm's on_event(self, event, data): the hooks call it so
            if len(signature.parameters) != 2:
                raise TypeError(
                    f"{cls.__qualname__}.on_event{signature}: here an observer gets one event record, "
                    "on_event(self, event); async-batch-llm's two-argument form is accepted as "
                    "async def on_event(self, event, data); or override the per-event methods, "
                    "e.g. on_item_completed(self, event)"
                )
        elif any(inspect.iscoroutinefunction(getattr(cls, name)) for name in cls._PER_EVENT):
            # One async method makes the whole observer async: its dispatch is awaited in its own task.
            cls.on_event = BaseObserver._on_event_async  # type: ignore[method-assign,assignment]

    async def _on_event_async(self, event: LifecycleEvent) -> None:
        name = _METHODS.get(type(event))
        if name is not None:
            value = getattr(self, name)(event)
            if inspect.isawaitable(value):
                await value
                return
        await anyio.lowlevel.checkpoint()

    def on_event(self, event: LifecycleEvent) -> None:
        name = _METHODS.get(type(event))
        if name is not None:
            getattr(self, name)(event)

    def on_batch_started(self, event: BatchStarted) -> Awaitable[None] | None:
        """The batch started (``event.total``: items known up front, ``None`` for a stream)."""

    def on_item_started(self, event: ItemStarted) -> Awaitable[None] | None:
        """An item's first attempt is about to run."""

    def on_attempt_started(self, event: AttemptStarted) -> Awaitable[None] | None:
        """A call to the provider is about to start."""

    def on_attempt_failed(self, event: AttemptFailed) -> Awaitable[None] | None:
        """An attempt failed (``event.category``); the item may be retried."""

    def on_attempt_succeeded(self, event: AttemptSucceeded) -> Awaitable[None] | None:
        """A call to the provider succeeded."""

    def on_item_completed(self, event: ItemCompleted) -> Awaitable[None] | None:
        """An item succeeded (``event.result``)."""

    def on_item_failed(self, event: ItemFailed) -> Awaitable[None] | None:
        """An item failed for good (``event.result``)."""

    def on_item_replayed(self, event: ItemReplayed) -> Awaitable[None] | None:
        """An item's result came from the checkpoint store."""

    def on_batch_finished(self, event: BatchFinished) -> Awaitable[None] | None:
        """The batch ended (``event.termination``, ``event.counts``)."""
