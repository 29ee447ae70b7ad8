"""LLMCallPool: one host's admission shared by independent requests (no queue, no dispatcher).

Each caller's own task runs its request through the shared quota scope, so a
cancelled caller cancels exactly its own work and releases its slot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar, final

import anyio
import anyio.lowlevel

from .._admission import QuotaScopeStatistics
from .._host._executor import ExecutorHost
from .._host._owner import HostedOwner
from .._observe._events import ItemStarted
from .._observe._hooks import Hooks
from .._observe._log import FailureLog
from .._strategies._base import LLMCallStrategy
from .._values._categories import ErrorCategory
from .._values._config import ProcessorConfig
from .._values._errors import AdmissionClosedError, ConfigurationError, QueueFullError
from .._values._requests import LLMWorkItem, Prompt
from .._values._results import LLMCallError, WorkItemResult
from .._values._stop_reasons import StopReason
from ._cached import open_item_cache
from ._classifier_objects import ClassifierArg
from ._guards import Guard
from ._inputs import check_work_item
from ._item import ItemRunner
from ._observer_tasks import ObserverTasks

__all__ = ["LLMCallPool", "PoolStatistics"]

TOutput = TypeVar("TOutput")


@final
class LLMCallPool(HostedOwner, Generic[TOutput]):
    """Share concurrency, RPM/TPM quotas, cooldowns and a prepared strategy across requests.

    ``max_pending`` bounds waiting: at most ``concurrency + max_pending``
    requests are admitted or waiting; past that ``submit`` raises
    :class:`QueueFullError` at once (``submit_result`` returns a failed result).
    ``submit_timeout`` bounds one caller's wait and call.
    ``observers`` get each request's ``ItemStarted``, ``AttemptFailed`` and terminal event
    (a pool has no batch: no ``BatchStarted``/``BatchFinished``); async ones as in a processor.
    """

    def __init__(
        self,
        strategy: LLMCallStrategy[TOutput],
        *,
        config: ProcessorConfig | None = None,
        error_classifier: ClassifierArg | None = None,
        max_pending: int | None = None,
        submit_timeout: float | None = None,
        host: ExecutorHost | None = None,
        observers: Sequence[Any] | None = None,
    ) -> None:
        if not isinstance(strategy, LLMCallStrategy):
            raise TypeError(f"strategy={strategy!r:.80}: must be an LLMCallStrategy")
        if max_pending is not None and (
            isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 0
        ):
            raise ConfigurationError("max_pending", max_pending, "must be a whole number >= 0")
        if submit_timeout is not None and (
            not isinstance(submit_timeout, (int, float)) or submit_timeout <= 0
        ):
            raise ConfigurationError("submit_timeout", submit_timeout, "must be a number > 0")
        self.strategy = strategy
        self.config = config if config is not None else (host.config if host else ProcessorConfig())
        self._init_owner(host, ExecutorHost(self.config, name="LLMCallPool"), "LLMCallPool")
        self._hooks = hooks = Hooks.build(observers=observers, observer_timeout=self.config.observer_timeout)
        self._observers = ObserverTasks(hooks)  # async observers: they outlive the run
        self._runner: ItemRunner[TOutput] = ItemRunner(self._host, self.config, classifier=error_classifier,
                                                       hooks=hooks)
        self._capacity = None if max_pending is None else self.config.provider_concurrency + max_pending
        self._submit_timeout = submit_timeout
        self._pending = 0
        self._idle: anyio.Event | None = None
        self._accepting = False
        self._sequence = 0
        self._failures = FailureLog("pool")
        """Final failures by category: one WARNING each per pool (the logging policy)."""
        self._ledger.add_step("runtime", "drain in-flight requests", self._drain, nowait=self._drain_nowait)
        if hooks.async_observers:  # after the drain: the last terminal event is emitted by then
            self._ledger.add_step("runtime", "async observers", self._observers.close)

    async def __aenter__(self) -> LLMCallPool[TOutput]:
        if self._accepting or self._sequence:
            raise RuntimeError("LLMCallPool is one-shot; create a new one")
        if self._owns_host:
            await self._host.__aenter__()
        else:
            await anyio.lowlevel.checkpoint()
        try:
            cache = await open_item_cache(self.config)  # for the pool's lifetime; closed by its ledger
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        if cache is not None:
            self._runner.cache = cache
            self._ledger.add_step("store", "response cache", cache.aclose)
        if self._hooks.async_observers:
            self._observers.start(self._host.new_runtime_group())
        self._accepting = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._exit_owner(exc_type, exc, tb)

    @property
    def pending(self) -> int:
        """Requests admitted or waiting right now."""
        return self._pending

    async def submit(self, prompt: Prompt, *, context: object = None, timeout: float | None = None,
                     params: Mapping[str, Any] | None = None) -> TOutput:
        """Run one request and return its output; raises :class:`LLMCallError` on failure.

        ``prompt`` is a text or chat messages; ``params`` its request parameters.
        """
        self._check_capacity(raise_full=True)
        result = await self._run(prompt, context, timeout, params)
        if result.success:
            return result.output  # type: ignore[return-value]
        raise LLMCallError(f"request {result.item_id!r} failed: {result.error}", result=result) from (
            result.exception
        )

    async def submit_result(
        self, prompt: Prompt, *, context: object = None, timeout: float | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> WorkItemResult[TOutput]:
        """Run one request; provider failures come back as a failed result, never raised."""
        full = self._check_capacity(raise_full=False)
        if full is not None:
            await anyio.lowlevel.checkpoint()
            return full
        return await self._run(prompt, context, timeout, params)

    def _check_capacity(self, *, raise_full: bool) -> WorkItemResult[TOutput] | None:
        if not self._accepting:
            state = "not open" if self._ledger.state == "open" else self._ledger.state
            raise AdmissionClosedError(f"LLMCallPool is {state}; it accepts no new requests")
        if self._capacity is not None and self._pending >= self._capacity:
            message = (
                f"LLMCallPool is full: {self._pending} requests admitted or waiting "
                f"(concurrency + max_pending = {self._capacity})"
            )
            if raise_full:
                raise QueueFullError(message)
            self._sequence += 1
            exc = QueueFullError(message)
            return WorkItemResult(
                item_id=f"request-{self._sequence}",
                success=False,
                error=message,
                exception=exc,
                error_category=ErrorCategory.NOT_EXECUTED,
                stop_reason=StopReason.POOL_FULL,
            )
        return None

    async def _run(self, prompt: Prompt, context: object, timeout: float | None,
                   params: Mapping[str, Any] | None = None) -> WorkItemResult[TOutput]:
        self._sequence += 1
        item = LLMWorkItem(
            item_id=f"request-{self._sequence}", strategy=self.strategy, prompt=prompt, context=context,
            params=params,
        )
        check_work_item(item, "submit")
        limit = timeout if timeout is not None else self._submit_timeout
        self._pending += 1
        hooks = self._hooks
        try:
            if hooks.observing:
                hooks.emit(ItemStarted(item.item_id))
            result = await self._drive(item, limit)
            if hooks.observing:
                hooks.emit_terminal(result)
            if not result.success:
                self._failures.note(result.item_id, result.error_category, result.attempts, result.exception)
            return result
        finally:
            self._pending -= 1
            if self._pending == 0 and self._idle is not None:
                self._idle.set()
                self._idle = None

    async def _drive(self, item: LLMWorkItem[TOutput], timeout: float | None) -> WorkItemResult[TOutput]:
        # In the caller's task: its guard's scope carries the deadlines itself (one cancel
        # scope per request, one more each time an attempt times out). Cancellation from
        # outside propagates. A deadline that fired is dealt with as a worker does
        # (ItemRunner.resume): one retry path for every surface.
        runner = self._runner
        run = runner.begin(item, timeout=timeout, timeout_name="submit timeout")
        guard = Guard()
        fired = False
        try:
            while True:
                with guard.renew():
                    result = await (runner.resume(run, guard) if fired else runner.drive(run, guard))
                    assert result is not None, "only a batch's stop cuts an item short without a result"
                    return result
                fired = True  # the scope caught its own deadline
        finally:
            if run.claim is not None:  # a cache miss that did not succeed (or was cancelled)
                await runner.let_go(run)  # (shielded within a bound: ._cached)

    def _drain_nowait(self) -> bool:
        """The drain step without a task when nothing is in flight: refuse new requests, and done."""
        self._accepting = False
        return not self._pending

    async def _drain(self) -> None:
        # CONTRACT C2.5: admitted requests run to completion; new ones are refused.
        self._accepting = False
        while self._pending:
            if self._idle is None:
                self._idle = anyio.Event()
            await self._idle.wait()
        await anyio.lowlevel.checkpoint()

    def statistics(self) -> PoolStatistics:
        return PoolStatistics(
            state=str(self.state),
            pending=self._pending,
            capacity=self._capacity,
            admission=self._host.quota_scope(self.strategy).statistics(),
        )


@final
@dataclass(frozen=True, slots=True)
class PoolStatistics:
    """A snapshot of a pool: requests admitted or waiting, and its quota scope's state."""

    state: str
    pending: int
    capacity: int | None
    """``concurrency + max_pending``, or ``None`` when unbounded."""
    admission: QuotaScopeStatistics
