"""Publishing a finished item: checkpoint → hooks → counters → progress → channel, in one place.

Every result of a processor goes through :meth:`Publisher.publish`, and the report of a
stopped queue (:meth:`Publisher.drain`) goes through the same steps. The drain has one
fast mode, for batch mode without a store or a per-item progress callback: then no step
awaits, so it builds and settles the not-executed results in chunks between two
checkpoints, with the cyclic collector paused (:func:`~._collector.no_collection`).

A result is stored before anything else sees it (CONTRACT: a crash loses no published
result), and put on the stream last.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Generic, TypeVar

import anyio
import anyio.lowlevel

from .._artifacts import ArtifactStore, append_result, item_fingerprint, unstorable_failure
from .._observe._events import BatchFinished, BatchStarted
from .._observe._hooks import Hooks
from .._observe._log import FailureLog
from .._observe._progress import CallbackProgress, ProgressTracker, ScopeStatistics
from .._observe._snapshot import Progress
from .._values._categories import ErrorCategory
from .._values._errors import ArtifactEncodeError
from .._values._requests import LLMWorkItem, request_text
from .._values._results import BatchTermination, WorkItemResult, is_not_run
from .._values._stats import RunCounters
from .._values._stop_reasons import StopReason
from ._channel import ResultChannel
from ._collector import no_collection
from ._intake import ItemQueue
from ._stops import Stop, StopPolicy

__all__ = ["DRAIN_CHUNK", "Publisher"]

TOutput = TypeVar("TOutput")

DRAIN_CHUNK: Final = 1000
"""Not-executed results built between two checkpoints when a stopped queue is reported (~1-2 ms)."""


class Publisher(Generic[TOutput]):
    """The steps every finished item goes through, in order, for one processor.

    Before :meth:`open` (the batch has not started: replays found by ``add_work``)
    results are kept in :attr:`results` and their terminal events wait for
    ``BatchStarted``; :meth:`open` then hands them to the stream, if there is one.
    ``on_stop`` applies a stop the policy decided on a result (an abort, a budget).
    """

    def __init__(
        self,
        *,
        store: ArtifactStore | None,
        hooks: Hooks,
        counters: RunCounters,
        policy: StopPolicy,
        on_stop: Callable[[Stop], None],
        scope_statistics: ScopeStatistics | None = None,
    ) -> None:
        self.store = store
        """The artifact store results are checkpointed to (``None``: none)."""
        self._hooks = hooks
        self._observing = hooks.observing
        self._counters = counters
        self._policy = policy
        self._on_stop = on_stop
        self.failures = FailureLog()
        """The batch's final failures by category: one WARNING each (the logging policy)."""
        self.results: list[WorkItemResult[TOutput]] = []
        """Batch mode: every result, in completion order."""
        self._early: list[WorkItemResult[TOutput]] = []  # terminal events held until BatchStarted
        self._announced = False
        self._channel: ResultChannel[WorkItemResult[TOutput]] | None = None
        self.tracker: ProgressTracker | None = None
        self._scope_statistics = scope_statistics
        """The run's quota scopes, for progress (calls in flight, throttled)."""
        self._progress: Progress | None = None
        self._per_item: CallbackProgress | None = None
        self._progress_scope: anyio.CancelScope | None = None
        self._drained = False
        self._finished = False
        self._started_at: float | None = None
        self.wall_time = 0.0
        """Seconds from :meth:`open` to :meth:`close`."""

    def open(
        self,
        *,
        channel: ResultChannel[WorkItemResult[TOutput]] | None,
        progress: Progress | None,
        started_at: float,
        total: int | None,
    ) -> None:
        """The batch starts: ``BatchStarted``, then the held events; replays go to the stream."""
        if self._observing:
            self._hooks.emit(BatchStarted(total))
        self._started_at = started_at
        self._announced = True
        for result in self._early:
            self._hooks.emit_terminal(result)
        self._early.clear()
        if channel is not None:
            channel.preload(self.results)
            self.results = []
            self._channel = channel
        if progress is not None:
            self._progress = progress
            self.tracker = ProgressTracker(start=started_at, total=total, scopes=self._scope_statistics)
            if isinstance(progress, CallbackProgress):
                self._per_item = progress

    @property
    def renders_progress(self) -> bool:
        """Whether a progress display needs :meth:`render_progress` running (not per-item callbacks)."""
        return self._progress is not None and self._per_item is None

    # --- the steps -------------------------------------------------------------

    # Hot path: in batch mode publishing is a list append; the worker's next
    # receive is the checkpoint.
    async def publish(  # noqa: ASYNC910
        self, result: WorkItemResult[TOutput], item: LLMWorkItem[TOutput] | None, *, started: bool = True
    ) -> None:
        """Checkpoint (``item`` given: it ran; ``None``: a replay), then hooks, counters, progress, stream.

        ``started=False``: a stop took ``item`` from the queue (it was never started)."""
        if self.store is not None and item is not None:
            result = await self._checkpoint(self.store, result, item)
        self._settle(result, started)
        per_item = self._per_item
        if per_item is not None and (tracker := self.tracker) is not None:
            await per_item.on_item_async(self._counters.finished, tracker.total, result.item_id)
        channel = self._channel
        if channel is None:
            self.results.append(result)
        else:
            await channel.put(result)

    def _settle(self, result: WorkItemResult[TOutput], started: bool = True) -> None:
        """The steps that never await: hooks, counters and the stop policy, the progress tracker."""
        if self._observing:
            if self._announced:
                self._hooks.emit_terminal(result)
            else:
                self._early.append(result)  # announced after BatchStarted
        counters = self._counters
        counters.finished += 1
        if result.success:
            counters.succeeded += 1
            if result.cached:
                counters.cached += 1
        else:
            counters.failed += 1
            if not result.replayed:
                self.failures.note(result.item_id, result.error_category, result.attempts, result.exception)
            stop = self._policy.judge(result)
            if stop is not None:
                self._on_stop(stop)
        if result.replayed:
            counters.replayed += 1
        elif result.token_usage:
            stop = self._policy.charge(result)
            if stop is not None:
                self._on_stop(stop)
        tracker = self.tracker
        if tracker is not None:
            if result.replayed:
                tracker.item_replayed(success=result.success)
            else:
                tokens = result.token_usage.get("total_tokens", 0)
                tracker.item_finished(success=result.success, tokens=tokens, not_run=is_not_run(result),
                                      started=started)

    @staticmethod
    async def _checkpoint(
        store: ArtifactStore, result: WorkItemResult[TOutput], item: LLMWorkItem[TOutput]
    ) -> WorkItemResult[TOutput]:
        """Store ``result``, or, if the store cannot keep it faithfully, the failure that replaces it."""
        key = item_fingerprint(item)
        prompt = request_text(item.prompt, item.params)
        try:
            await append_result(store, result, fingerprint=key, prompt=prompt, strategy=item.strategy)
        except ArtifactEncodeError as exc:
            # Item-local: nothing was written; publish (and store) why instead of a lossy copy.
            result = unstorable_failure(result, exc)
            await store.append(result, fingerprint=key, prompt=prompt)
        return result

    # --- a stopped queue ---------------------------------------------------------

    def not_executed(self, item: LLMWorkItem[TOutput]) -> WorkItemResult[TOutput]:
        """The result of an item the batch's stop left in the queue."""
        reason, category = self._policy.not_executed()
        return _not_executed(item, reason, category, self._policy.unfinished_reason)

    async def drain(self, recv: ItemQueue[TOutput]) -> None:
        """Publish every queued item as not executed (the batch stopped; its input is closed).

        ``receive_nowait()`` in a tight loop, not a scheduler round per item; whichever
        worker gets here first reports the queue (others that finish their own item
        meanwhile help), the rest find it empty.
        """
        if self._drained:
            return  # noqa: ASYNC910 - another worker reported the queue; the worker's exit checkpoints
        reason, category = self._policy.not_executed()
        why = self._policy.unfinished_reason
        if self.store is not None or self._channel is not None or self._per_item is not None:
            # A step awaits here (a checkpoint write, a bounded stream, per-item progress).
            while True:
                try:
                    item = recv.receive_nowait()
                except (anyio.WouldBlock, anyio.EndOfStream):
                    return  # noqa: ASYNC910 - no checkpoint per item on purpose; the worker's exit has one
                await self.publish(_not_executed(item, reason, category, why), item, started=False)
        # No step awaits: settle a chunk between two checkpoints, so the calls still in flight
        # resume and finish while the rest of the queue is reported, not behind the whole queue.
        # With no observer and no progress, settling a result the stop decided is two counters
        # (the stop is decided already, so the policy adds nothing, and the failure log skips
        # the stop's verdicts): counted per chunk, not per result.
        bulk = not self._observing and self.tracker is None and self.failures.skips(category)
        while True:
            with no_collection():  # no await in this loop
                left = self._drain_chunk(recv.receive_nowait, reason, category, why, bulk)
            if left is not None:
                self._drained = left
                return  # noqa: ASYNC910 - no checkpoint per item on purpose; the worker's exit has one
            await anyio.lowlevel.checkpoint()

    def _drain_chunk(self, receive: Callable[[], LLMWorkItem[TOutput]], reason: str,
                     category: ErrorCategory, why: StopReason, bulk: bool) -> bool | None:
        """Settle up to :data:`DRAIN_CHUNK` queued items; ``None``: more may follow, else whether
        the input is closed and empty (the workers still finishing their own item need not try
        the queue again) rather than only empty for now."""
        settle = self._settle
        append = self.results.append
        taken = 0
        outcome: bool | None = None
        try:
            for _ in range(DRAIN_CHUNK):
                try:
                    item = receive()
                except anyio.EndOfStream:
                    outcome = True
                    break
                except anyio.WouldBlock:
                    outcome = False
                    break
                result: WorkItemResult[TOutput] = WorkItemResult(
                    item_id=item.item_id,
                    success=False,
                    error=reason,
                    error_category=category,
                    context=item.context,
                    stop_reason=why,
                )
                append(result)
                if bulk:
                    taken += 1
                else:
                    settle(result, False)
        finally:
            counters = self._counters
            counters.finished += taken
            counters.failed += taken
        return outcome

    async def close(self, termination: BatchTermination) -> None:
        """The batch is over: ``BatchFinished`` (once), and the final progress update."""
        self.finish(termination)
        await self.close_progress()

    def finish(self, termination: BatchTermination) -> None:
        """:meth:`close` but its progress update: wall time, failure summary, ``BatchFinished`` (once)."""
        if not self._finished:
            self._finished = True
            if self._started_at is not None:
                self.wall_time = anyio.current_time() - self._started_at
            self.failures.summary()
            if self._observing:
                self._hooks.emit(BatchFinished(termination, self._counters.snapshot()))

    @property
    def closes_progress(self) -> bool:
        """Whether :meth:`close_progress` has a display to close (else :meth:`finish` is all of ``close``)."""
        return self._progress_scope is not None or (self._progress is not None and self.tracker is not None)

    async def close_store(self) -> None:
        """The processor's ``store`` close step (added only when there is a store)."""
        if self.store is not None:
            await self.store.aclose()
        else:
            await anyio.lowlevel.checkpoint()

    # --- progress ------------------------------------------------------------------

    async def render_progress(self, interval: float) -> None:
        """Update the progress display every ``interval`` seconds, until :meth:`close_progress`."""
        progress, tracker = self._progress, self.tracker
        assert progress is not None and tracker is not None
        with anyio.CancelScope() as scope:
            self._progress_scope = scope
            while True:
                await anyio.sleep(interval)
                progress.update(tracker.snapshot(anyio.current_time()))

    async def close_progress(self) -> None:
        """The final progress update; idempotent."""
        if self._progress_scope is not None:
            self._progress_scope.cancel("batch finished")
        progress, tracker = self._progress, self.tracker
        if progress is not None and tracker is not None:
            self.tracker = None
            await progress.aclose(tracker.snapshot(anyio.current_time()))
        else:
            await anyio.lowlevel.checkpoint()


def _not_executed(item: LLMWorkItem[TOutput], reason: str, category: ErrorCategory, why: StopReason
                  ) -> WorkItemResult[TOutput]:
    # Built directly: no run, no exception (none happened), one reason string per stop.
    return WorkItemResult(
        item_id=item.item_id, success=False, error=reason, error_category=category, context=item.context,
        stop_reason=why,
    )
