"""The hooks a user registers (observers, middlewares, a post-processor), as the engine calls them.

The engine holds one :class:`Hooks` (``Hooks.build(...)``) and drives it; when
nothing is registered ``hooks.active`` is false and the engine skips it all.
The protocol, per batch::

    hooks.emit(BatchStarted(total))
    for each item that runs:
        hooks.emit(ItemStarted(item_id))
        item = await hooks.before_item(item)             # middlewares, in order
        each failed attempt:
            await hooks.on_attempt_error(item, exc, attempt, category)  # emits AttemptFailed
        result = await hooks.after_item(item, result)    # middlewares reversed, then post-processor
        (checkpoint)
        hooks.emit_terminal(result)                      # ItemCompleted / ItemFailed
    for each replayed or never-run item:
        hooks.emit_terminal(result)                      # ItemReplayed / ItemFailed
    hooks.emit(BatchFinished(termination, counts))
    await hooks.aclose()                                 # after the workers stopped

So every item that gets a result gets exactly one terminal event. An item
abandoned by a forced close has no result and so no terminal event.

Sync observers receive events synchronously on the event loop: keep them cheap
(a counter, an append to a memory stream). An observer that raises is logged
once and otherwise ignored; it never breaks the run. An async observer (an
``async def on_event``, or an async callable) is fed through its own bounded
queue and awaited, event by event, in a task its owner starts with
:meth:`Hooks.start_observers` and ends with :meth:`Hooks.close_observers`
(:mod:`._observer_feed`): to the engine it is one more sync observer, the
feed's ``put``. Middleware ``before`` and
``after`` are part of the program: if they raise, the run stops with that
error. ``on_error`` is a notification: its failures are logged once.

The post-processor runs on successful, freshly executed results only (a
replayed result was post-processed before it was stored). It may return a
new result, or ``None`` to keep the one it got. If it raises, returns
something else, or outlasts ``post_processor_timeout``, the result becomes a
failure with category ``PARSE`` (the answer arrived but could not be turned
into an output; a resume runs it again), keeping the raw ``output``. A
synchronous post-processor runs in a worker thread, one at a time; a thread
that timed out is abandoned by its caller but still owned: the next call
waits for it (within its own timeout) and :meth:`Hooks.aclose` waits for it
(an abandoning :class:`~.._backends._worker_gate.WorkerGate`). The events and the observer protocol are
in :mod:`._events`.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, final

import anyio
import anyio.lowlevel

from .._backends._worker_gate import WorkerGate
from .._values._categories import ErrorCategory
from .._values._errors import ConfigurationError
from .._values._requests import LLMWorkItem
from .._values._results import WorkItemResult
from ._callables import call_sync_or_async, is_async_callable
from ._event_names import TwoArgumentObserver, takes_event_and_data
from ._events import AttemptFailed, LifecycleEvent, terminal_event
from ._observer_feed import ObserverFeed, close_feeds

__all__ = ["Hooks", "HooksStatistics", "Middleware"]

logger = logging.getLogger("trio_batch_llm.observers")

POST_PROCESSOR_THREAD_WARNING: Final = 10.0
"""Seconds :meth:`Hooks.aclose` waits for an abandoned post-processor thread before one warning."""


class Middleware:
    """Subclass and override what you need; each method may be sync or async.

    - ``before(item)``: return a (possibly rewritten) item, or ``None`` to keep
      it. The item id must not change. (Unlike async-batch-llm, ``None`` does
      not skip the item: every item gets a result.)
    - ``after(item, result)``: return a result, or ``None`` to keep it.
    - ``on_error(item, exc, attempt)``: told about each failed attempt.
    """

    def before(self, item: LLMWorkItem[Any]) -> object:
        return None

    def after(self, item: LLMWorkItem[Any], result: WorkItemResult[Any]) -> object:
        return None

    def on_error(self, item: LLMWorkItem[Any], exc: Exception, attempt: int) -> object:
        return None


def _name(obj: object) -> str:
    return getattr(obj, "__qualname__", None) or type(obj).__qualname__


@final
@dataclass(frozen=True, slots=True)
class HooksStatistics:
    observers: int
    middlewares: int
    post_processor: bool
    observer_errors: int
    post_processor_failures: int
    post_processor_timeouts: int
    post_processor_thread_busy: bool
    async_observers: int = 0
    """Observers awaited in a task of their own (each one's failures count in ``observer_errors``)."""
    observer_timeouts: int = 0
    observer_dropped: int = 0
    """Events an async observer never got: its queue was full, or its owner closed first."""


def _positive_timeout(value: float | None, name: str = "post_processor_timeout") -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigurationError(name, value, "must be a finite number > 0, or None")
    return float(value)


@final
class Hooks:
    """What the engine calls; see the module docstring for the protocol."""

    __slots__ = (
        "_after",
        "_before",
        "_counts",
        "_feed_timeout",
        "_feeds",
        "_gate",
        "_logged",
        "_observers",
        "_on_error",
        "_post",
        "_post_async",
        "_timeout",
        "active",
        "middleware_count",
    )

    def __init__(
        self,
        observers: Sequence[Callable[[LifecycleEvent], object]],
        middlewares: Sequence[Any],
        post_processor: Callable[[WorkItemResult[Any]], Any] | None,
        post_processor_timeout: float | None,
        feeds: Sequence[ObserverFeed] = (),
        observer_timeout: float | None = None,
    ) -> None:
        self._observers = tuple(observers)
        self._feeds = tuple(feeds)
        """The async observers' feeds (each one's ``put`` is in ``_observers``, in registration order)."""
        self._feed_timeout = observer_timeout
        self._before = tuple(m.before for m in middlewares if callable(getattr(m, "before", None)))
        self._after = tuple(m.after for m in reversed(middlewares) if callable(getattr(m, "after", None)))
        # An async-batch-llm style middleware's on_error is its final-failure hook (run by its own after()).
        self._on_error = tuple(m.on_error for m in middlewares if callable(getattr(m, "on_error", None))
                               and not getattr(m, "on_error_is_terminal", False))
        self.middleware_count = len(middlewares)
        self._post = post_processor
        self._post_async = post_processor is not None and is_async_callable(post_processor)
        self._timeout = post_processor_timeout
        self._gate = WorkerGate(abandon_on_cancel=True)
        self._logged: set[int] = set()  # ids of hooks whose failure was logged already
        self._counts = {"observer_errors": 0, "failures": 0, "timeouts": 0}
        self.active = bool(self._observers or middlewares or post_processor is not None)
        """False when nothing is registered: the engine may skip every call."""

    @classmethod
    def build(
        cls,
        *,
        observers: Iterable[object] | None = None,
        middlewares: Iterable[object] | None = None,
        post_processor: Callable[[WorkItemResult[Any]], Any] | None = None,
        post_processor_timeout: float | None = 30.0,
        observer_timeout: float | None = 5.0,
    ) -> Hooks:
        """Check and gather what the user registered (``TypeError`` naming a bad entry)."""
        timeout = _positive_timeout(observer_timeout, "observer_timeout")
        sinks: list[Callable[[LifecycleEvent], object]] = []
        feeds: list[ObserverFeed] = []
        for index, observer in enumerate(observers or ()):
            on_event = getattr(observer, "on_event", None)
            sink = on_event if callable(on_event) else observer
            if not callable(sink):
                raise TypeError(f"observers[{index}]={observer!r}: needs an on_event(event) method")
            two = takes_event_and_data(sink)
            if not is_async_callable(sink):
                if two:
                    raise TypeError(f"observers[{index}]={observer!r}: on_event(event, data) is "
                                    "async-batch-llm's form, accepted as an async def only (or take one "
                                    "event record: on_event(event))")
                sinks.append(sink)
                continue
            feed = ObserverFeed(TwoArgumentObserver(sink) if two else sink, _name(observer), timeout=timeout)
            feeds.append(feed)
            sinks.append(feed.put)
        chain = list(middlewares or ())
        for index, middleware in enumerate(chain):
            if not any(callable(getattr(middleware, name, None)) for name in ("before", "after", "on_error")):
                raise TypeError(
                    f"middlewares[{index}]={middleware!r}: needs before(), after() or on_error()"
                )
        if post_processor is not None and not callable(post_processor):
            raise TypeError(f"post_processor={post_processor!r}: must be callable")
        return cls(sinks, chain, post_processor, _positive_timeout(post_processor_timeout), feeds, timeout)

    @property
    def observing(self) -> bool:
        """Whether any observer listens (the engine may skip building events otherwise)."""
        return bool(self._observers)

    @property
    def async_observers(self) -> int:
        """How many observers are awaited in a task of their own (the owner starts them)."""
        return len(self._feeds)

    def start_observers(self, start_soon: Callable[..., object]) -> None:
        """Start one task per async observer with the owner's ``start_soon(fn, name=...)``."""
        for feed in self._feeds:
            feed.starting()
            start_soon(feed.run, name=f"observer {feed.name}")

    async def close_observers(self) -> None:
        """The owner's close step: the async observers drain within ``observer_timeout``, then stop."""
        await close_feeds(self._feeds, self._feed_timeout)

    def _log_once(self, hook: object, what: str) -> None:
        key = id(hook)
        if key not in self._logged:
            self._logged.add(key)
            logger.warning("%s %s raised; further failures of it are not logged", what, _name(hook),
                           exc_info=True)

    # --- events ----------------------------------------------------------------

    def emit(self, event: LifecycleEvent) -> None:
        """Hand ``event`` to every observer, in order; never raises an observer's ``Exception``."""
        for observer in self._observers:
            try:
                observer(event)
            except Exception:  # noqa: BLE001 - an observer never breaks the run
                self._counts["observer_errors"] += 1
                self._log_once(observer, "observer")

    def emit_terminal(self, result: WorkItemResult[Any]) -> None:
        """Emit the one terminal event of ``result``."""
        if self._observers:
            self.emit(terminal_event(result))

    # --- item hooks --------------------------------------------------------------

    async def before_item(self, item: LLMWorkItem[Any]) -> LLMWorkItem[Any]:
        """Run every middleware's ``before``, in order; the item id may not change."""
        for before in self._before:
            changed = await call_sync_or_async(before, item)
            if changed is None:
                continue
            if not isinstance(changed, LLMWorkItem):
                raise TypeError(f"middleware {_name(before)} returned {changed!r}, not an LLMWorkItem")
            if changed.item_id != item.item_id:
                raise ValueError(
                    f"middleware {_name(before)} changed item_id {item.item_id!r} to {changed.item_id!r}"
                )
            item = changed
        await anyio.lowlevel.checkpoint()
        return item

    async def on_attempt_error(
        self, item: LLMWorkItem[Any], exc: Exception, attempt: int, category: ErrorCategory
    ) -> None:
        """Emit :class:`AttemptFailed` and tell every middleware's ``on_error``."""
        if self._observers:
            self.emit(AttemptFailed(item.item_id, attempt, category))
        for on_error in self._on_error:
            try:
                await call_sync_or_async(on_error, item, exc, attempt)
            except Exception:  # noqa: BLE001 - a notification; the attempt's outcome stands
                self._log_once(on_error, "middleware on_error")
        await anyio.lowlevel.checkpoint()

    async def after_item(self, item: LLMWorkItem[Any], result: WorkItemResult[Any]) -> WorkItemResult[Any]:
        """Middlewares' ``after`` (last registered first), then the post-processor on a success."""
        for after in self._after:
            changed = await call_sync_or_async(after, item, result)
            if changed is None:
                continue
            if not isinstance(changed, WorkItemResult):
                raise TypeError(f"middleware {_name(after)} returned {changed!r}, not a WorkItemResult")
            result = changed
        if self._post is not None and result.success and not result.replayed:
            result = await self._post_process(result)
        await anyio.lowlevel.checkpoint()
        return result

    async def _post_process(self, result: WorkItemResult[Any]) -> WorkItemResult[Any]:
        post = self._post
        assert post is not None
        timeout = math.inf if self._timeout is None else self._timeout
        try:
            with anyio.move_on_after(timeout) as scope:
                if self._post_async:
                    value = await post(result)
                else:
                    value = await self._gate.run(post, result)
                    if inspect.isawaitable(value):  # a sync-looking callable that returned a coroutine
                        value = await value
        except Exception as exc:  # noqa: BLE001 - the item fails; the run goes on
            self._counts["failures"] += 1
            message = f"post-processor {_name(post)} raised {type(exc).__name__}: {exc}"
            return _post_failure(result, exc, message)  # noqa: ASYNC910 - after_item checkpoints next
        if scope.cancelled_caught:
            self._counts["timeouts"] += 1
            message = f"post-processor {_name(post)} timed out after {self._timeout:g} s"
            return _post_failure(result, TimeoutError(message), message)
        if value is None:
            return result
        if not isinstance(value, WorkItemResult) or value.item_id != result.item_id:
            self._counts["failures"] += 1
            if isinstance(value, WorkItemResult):
                problem = f"returned the result of {value.item_id!r}"
            else:
                problem = f"returned {type(value).__name__}, not a WorkItemResult or None"
            message = f"post-processor {_name(post)} {problem}"
            return _post_failure(result, TypeError(message), message)
        return value

    @property
    def post_processor_busy(self) -> bool:
        """Whether a post-processor thread runs (abandoned or not): :meth:`aclose` then waits for it."""
        return self._gate.busy

    async def aclose(self) -> None:
        """Wait for an abandoned post-processor thread (one warning if it takes long)."""
        gate = self._gate
        if not gate.busy:
            await anyio.lowlevel.checkpoint()
            return
        with anyio.move_on_after(POST_PROCESSOR_THREAD_WARNING):
            await gate.wait_idle()
        if gate.busy:
            logger.warning("waiting for a post-processor thread that timed out and is still running")
            await gate.wait_idle()

    def statistics(self) -> HooksStatistics:
        feeds = [feed.statistics() for feed in self._feeds]
        return HooksStatistics(
            observers=len(self._observers),
            middlewares=self.middleware_count,
            post_processor=self._post is not None,
            observer_errors=self._counts["observer_errors"] + sum(f.failures for f in feeds),
            post_processor_failures=self._counts["failures"],
            post_processor_timeouts=self._counts["timeouts"],
            post_processor_thread_busy=self._gate.busy,
            async_observers=len(feeds),
            observer_timeouts=sum(f.timeouts for f in feeds),
            observer_dropped=sum(f.dropped for f in feeds),
        )


def _post_failure(result: WorkItemResult[Any], exc: BaseException, message: str) -> WorkItemResult[Any]:
    return dataclasses.replace(
        result, success=False, error=message, exception=exc, error_category=ErrorCategory.PARSE
    )
