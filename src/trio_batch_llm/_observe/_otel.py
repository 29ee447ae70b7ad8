"""OpenTelemetryObserver: one span per batch and one per provider attempt, in gen_ai terms.

Spans (OpenTelemetry's semantic conventions for generative AI, where they apply):

- ``trio_batch_llm.batch`` (``INTERNAL``), from :class:`BatchStarted` to
  :class:`BatchFinished`, a child of whatever span is current where the batch
  starts; attributes ``trio_batch_llm.batch.total`` (when known), and at the
  end ``.succeeded``, ``.failed``, ``.not_run``, ``.replayed`` and
  ``.termination`` (``completed``, ``batch_deadline``, …; status ``ERROR``
  unless completed), and ``.stop_item_id`` when an item's result decided the
  stop (an abort, a spent budget).
- ``chat {model}`` (``CLIENT``), one per attempt, a child of the batch span:
  ``gen_ai.operation.name`` (``chat``), ``gen_ai.system``,
  ``gen_ai.request.model``, ``trio_batch_llm.item_id``,
  ``trio_batch_llm.attempt``; a failed attempt has ``error.type`` (its
  :class:`ErrorCategory` value, e.g. ``rate_limit``) and status ``ERROR``; the
  attempt that succeeded has ``gen_ai.usage.input_tokens`` and
  ``gen_ai.usage.output_tokens``; the last attempt of an item a stop or its
  deadline cut short has ``trio_batch_llm.stop_reason`` (a :class:`StopReason` value).

Replayed items and items that never ran make no attempt span; they are
counted on the batch span.

Timing. The engine emits an event when an item starts and when an attempt
fails, not yet when each attempt's call starts (:class:`AttemptStarted`, see
:mod:`._events`). Until it does, an attempt's span starts when the item
started (the first attempt) or when the previous attempt failed (so it
includes the backoff before the call), and the usage of the successful
attempt is the item's usage over all its attempts (failed calls rarely report
any). With :class:`AttemptStarted` and :class:`AttemptSucceeded` the spans
start at the call and carry that call's model and usage.

``opentelemetry-api`` is imported when the observer is created (``pip install
"trio-batch-llm[otel]"``); without an SDK configured its spans cost next to
nothing. One observer follows one batch at a time (events carry no batch id);
give each concurrent batch its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, final

from .._values._categories import ErrorCategory
from .._values._results import WorkItemResult
from .._version import __version__
from ._events import (
    AttemptEvent,
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
from ._extras import import_extra

__all__ = ["OpenTelemetryObserver"]

_NOT_RUN: Final = frozenset({ErrorCategory.NOT_EXECUTED, ErrorCategory.BUDGET})


@dataclass(slots=True)
class _Item:
    """An item's attempts so far: the open span (exact mode) or when the next attempt began."""

    next_start: int
    """``time_ns()`` at which the attempt not yet ended began (derived mode)."""
    ended: int = 0
    """Attempts whose span has ended."""
    span: Any = None
    """The open attempt span (exact mode: after :class:`AttemptStarted`)."""
    usage: Mapping[str, int] | None = None


@final
class OpenTelemetryObserver:
    """Emits OpenTelemetry spans for a batch and each of its provider attempts (see the module).

    ``tracer`` defaults to ``opentelemetry.trace.get_tracer("trio_batch_llm")``
    from ``tracer_provider`` (default: the global one). ``system`` and
    ``model`` are the ``gen_ai.system`` and ``gen_ai.request.model`` of every
    attempt (for example ``"openai"`` and ``"gpt-4o-mini"``); an
    :class:`AttemptStarted` event's own provider and model win over them.
    """

    def __init__(self, *, tracer: object = None, tracer_provider: object = None,
                 system: str | None = None, model: str | None = None,
                 clock: Callable[[], int] = time.time_ns) -> None:
        trace = import_extra("opentelemetry.trace", user="OpenTelemetryObserver", needs="opentelemetry-api",
                             extra="otel")
        self._trace = trace
        self._kind = trace.SpanKind
        self._status = trace.Status
        self._code = trace.StatusCode
        if tracer is None:
            tracer = trace.get_tracer("trio_batch_llm", __version__, tracer_provider=tracer_provider)
        self.tracer: Any = tracer  # an opentelemetry Tracer (the package is imported only when used)
        self.system = system
        self.model = model
        self._clock = clock
        self._batch: Any = None
        self._context: Any = None
        self._items: dict[str, _Item] = {}
        self._counts = {"succeeded": 0, "failed": 0, "not_run": 0, "replayed": 0}

    def on_event(self, event: LifecycleEvent | AttemptEvent) -> None:
        now = self._clock()
        if isinstance(event, ItemStarted):
            self._items[event.item_id] = _Item(next_start=now)
        elif isinstance(event, AttemptStarted):
            self._attempt_started(event, now)
        elif isinstance(event, AttemptFailed):
            self._attempt_failed(event, now)
        elif isinstance(event, AttemptSucceeded):
            item = self._items.get(event.item_id)
            if item is not None:
                item.usage = event.token_usage
        elif isinstance(event, ItemCompleted | ItemFailed):
            self._item_finished(event.result, now)
        elif isinstance(event, ItemReplayed):
            self._counts["replayed"] += 1
        elif isinstance(event, BatchStarted):
            self._batch_started(event, now)
        elif isinstance(event, BatchFinished):
            self._batch_finished(event, now)

    __call__ = on_event

    # --- batch ---------------------------------------------------------------------

    def _batch_started(self, event: BatchStarted, now: int) -> None:
        if self._batch is not None:  # a batch that never finished (forced close): end it first
            self._batch.end(end_time=now)
        attributes = {} if event.total is None else {"trio_batch_llm.batch.total": event.total}
        self._batch = self.tracer.start_span("trio_batch_llm.batch", kind=self._kind.INTERNAL,
                                             attributes=attributes, start_time=now)
        self._context = self._trace.set_span_in_context(self._batch)
        self._counts = dict.fromkeys(self._counts, 0)

    def _batch_finished(self, event: BatchFinished, now: int) -> None:
        for item_id in list(self._items):  # items abandoned without a result (a forced stop)
            item = self._items.pop(item_id)
            if item.span is not None:
                item.span.end(end_time=now)
        span, self._batch, self._context = self._batch, None, None
        if span is None:
            return
        termination = event.termination
        for key, value in self._counts.items():
            span.set_attribute(f"trio_batch_llm.batch.{key}", value)
        span.set_attribute("trio_batch_llm.batch.termination", termination.kind)
        if termination.item_id is not None:
            span.set_attribute("trio_batch_llm.batch.stop_item_id", termination.item_id)
        if not termination.completed:
            span.set_status(self._status(self._code.ERROR, termination.reason or termination.kind))
        span.end(end_time=now)

    # --- attempts ------------------------------------------------------------------------

    def _start_attempt(self, item_id: str, attempt: int, start: int, *, provider: str | None = None,
                       model: str | None = None) -> Any:
        system, model = provider or self.system, model or self.model
        attributes: dict[str, Any] = {"gen_ai.operation.name": "chat", "trio_batch_llm.item_id": item_id,
                                      "trio_batch_llm.attempt": attempt}
        if system:
            attributes["gen_ai.system"] = system
        if model:
            attributes["gen_ai.request.model"] = model
        name = f"chat {model}" if model else "chat"
        return self.tracer.start_span(name, context=self._context, kind=self._kind.CLIENT,
                                      attributes=attributes, start_time=start)

    def _fail(self, span: Any, category: ErrorCategory | None, message: str | None, now: int) -> None:
        kind = (category or ErrorCategory.UNKNOWN).value
        span.set_attribute("error.type", kind)
        span.set_status(self._status(self._code.ERROR, message or kind))
        span.end(end_time=now)

    def _attempt_started(self, event: AttemptStarted, now: int) -> None:
        item = self._items.setdefault(event.item_id, _Item(next_start=now))
        if item.span is not None:  # the previous attempt never reported its end
            item.span.end(end_time=now)
        item.span = self._start_attempt(event.item_id, event.attempt, now, provider=event.provider,
                                        model=event.model)

    def _attempt_failed(self, event: AttemptFailed, now: int) -> None:
        item = self._items.setdefault(event.item_id, _Item(next_start=now))
        span, item.span = item.span, None
        if span is None:  # derived mode: the attempt began when the previous one failed
            span = self._start_attempt(event.item_id, event.attempt, item.next_start)
        self._fail(span, event.category, None, now)
        item.ended = event.attempt
        item.next_start = now

    def _item_finished(self, result: WorkItemResult[Any], now: int) -> None:
        if result.success:
            self._counts["succeeded"] += 1
        elif result.attempts == 0 and result.error_category in _NOT_RUN:
            self._counts["not_run"] += 1
        else:
            self._counts["failed"] += 1
        item = self._items.pop(result.item_id, None)
        if item is None:
            return  # never started: no attempt to show
        span = item.span
        if span is None:
            if result.attempts <= item.ended:
                return  # its last attempt's span ended with that attempt's failure
            span = self._start_attempt(result.item_id, result.attempts, item.next_start)
        if result.success:
            usage = item.usage if item.usage is not None else result.token_usage
            for key in ("input_tokens", "output_tokens"):
                if key in usage:
                    span.set_attribute(f"gen_ai.usage.{key}", usage[key])
            span.end(end_time=now)
        else:
            if result.stop_reason is not None:
                span.set_attribute("trio_batch_llm.stop_reason", result.stop_reason.value)
            self._fail(span, result.error_category, result.error, now)
