"""ParallelBatchProcessor: a host, a bounded input stream, workers, and one result terminal.

Two one-shot modes:

- batch: ``add_work()`` items, then ``await process_all()`` -> :class:`BatchResult`;
- streaming: ``start()``, ``add_work()`` as items come, ``finish()``, and read
  ``results()`` (completion order) until the terminal (CONTRACT C6).

Workers are the only tasks per batch (plus one deadline watcher when a batch
timeout is set): no task per item.
"""

from __future__ import annotations

import enum
import gc
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Generic, TypeVar, final

import anyio
import anyio.lowlevel

from .._artifacts import ResumePlan, fingerprint, prepare_resume, unstorable_failure
from .._core._host import ExecutorHost, RuntimeTasks
from .._core._ledger import WORKER_CANCELLATION_TIMEOUT
from .._core._owner import HostedOwner
from .._observe._events import BatchFinished, BatchStarted, ItemStarted
from .._observe._hooks import Hooks
from .._observe._progress import CallbackProgress, ProgressTracker, make_progress
from .._observe._snapshot import Progress
from .._values._categories import ErrorCategory
from .._values._config import AbortMode, InvalidCost, ProcessorConfig, ResumePolicy
from .._values._errors import AdmissionClosedError, ArtifactEncodeError, BatchInterruptedError, QueueFullError
from .._values._item_checks import check_item
from .._values._requests import LLMWorkItem, item_id_problem
from .._values._results import BatchResult, BatchTermination, TerminationKind, WorkItemResult
from .._values._stats import ProcessorStatistics, RunCounters
from ._channel import ResultChannel, ResultChannelStatistics
from ._item import ItemRunner, ItemStop, ItemTally, UserClassifier

__all__ = ["ParallelBatchProcessor"]

TOutput = TypeVar("TOutput")

logger = logging.getLogger("trio_batch_llm")


@contextmanager
def _no_collection() -> Iterator[None]:
    """Pause the cyclic garbage collector over a synchronous loop whose allocations all survive.

    Building thousands of results at a stop allocates ~4 container objects each, and every one
    of them is kept: a collection in the middle (gen0 every 700 allocations, and a full collection
    of the whole heap when enough survivors pile up) can free none of them, yet it was measured
    to take half of a deadline drain at N = 1,000 (60-110 ms of 160-300 ms). The collector runs
    as usual at the next allocation after the loop. Only ever around code that does not await:
    the switch is process-wide, so the pause must last no longer than the loop (a few ms for
    10,000 items), and a collector the application disabled stays disabled.
    """
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


_DRAIN_CHUNK = 1000
"""Not-executed results built between two checkpoints when a stopped queue is reported (~1-2 ms)."""


_NOWAIT_STREAK = 16
"""Items a worker may take from its queue in a row without a scheduler round."""


class _Mode(enum.Enum):
    NEW = "new"
    BATCH = "batch"
    STREAMING = "streaming"
    FINISHED = "finished"


@final
class _ChannelIterator(AsyncIterator[WorkItemResult[TOutput]]):
    __slots__ = ("_channel",)

    def __init__(self, channel: ResultChannel[WorkItemResult[TOutput]]) -> None:
        self._channel = channel

    def __aiter__(self) -> _ChannelIterator[TOutput]:
        return self

    async def __anext__(self) -> WorkItemResult[TOutput]:
        try:
            return await self._channel.get()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None


@final
class ParallelBatchProcessor(HostedOwner, Generic[TOutput]):
    """Runs work items concurrently with shared quotas, retries, deadlines and checkpoints."""

    def __init__(
        self,
        config: ProcessorConfig | None = None,
        *,
        post_processor: Callable[[WorkItemResult[TOutput]], Any] | None = None,
        error_classifier: UserClassifier | None = None,
        middlewares: Sequence[Any] | None = None,
        observers: Sequence[Any] | None = None,
        progress_callback: Callable[[int, int | None, str], Any] | Progress | None = None,
        artifact_store: Any = None,
        resume: ResumePolicy = ResumePolicy.NONE,
        host: ExecutorHost | None = None,
        post_processor_timeout: float | None = 30.0,
    ) -> None:
        if config is not None and not isinstance(config, ProcessorConfig):
            raise TypeError(f"config={config!r}: must be a ProcessorConfig")
        self.config = config if config is not None else (host.config if host else ProcessorConfig())
        self._init_owner(
            host, ExecutorHost(self.config, name="ParallelBatchProcessor"), "ParallelBatchProcessor"
        )
        self._hooks = Hooks.build(
            observers=observers,
            middlewares=middlewares,
            post_processor=post_processor,
            post_processor_timeout=post_processor_timeout,
        )
        self._runner: ItemRunner[TOutput] = ItemRunner(
            self._host, self.config, classifier=error_classifier, hooks=self._hooks
        )
        self._observing = self._hooks.observing
        self._early_replays: list[WorkItemResult[TOutput]] = []
        self._batch_finished_emitted = False
        self._progress: Progress | None = make_progress(progress_callback) if progress_callback else None
        self._per_item_progress = isinstance(self._progress, CallbackProgress)
        self._tracker: ProgressTracker | None = None
        self._progress_scope: anyio.CancelScope | None = None
        self._store = artifact_store
        self._resume = resume
        self._mode = _Mode.NEW
        self._opened = False
        self._runtime: RuntimeTasks | None = None
        buffer = self.config.max_queue_size or float("inf")
        self._send, self._recv = anyio.create_memory_object_stream[LLMWorkItem[TOutput]](buffer)
        self._results: list[WorkItemResult[TOutput]] = []
        self._input_order: list[str] = []
        # Only batch results need the input order (in_input_order, preserve_order); a stream of
        # millions keeps no per-item state.
        self._record_order = True
        self._channel: ResultChannel[WorkItemResult[TOutput]] | None = None
        self.counters = RunCounters()
        self._workers_live = 0
        self._workers_done = anyio.Event()
        self._interrupted = False
        self._crash: BaseException | None = None
        self._stop_kind: TerminationKind | None = None
        self._stop_reason: str | None = None
        self._stops: list[ItemStop] = []  # one per worker, when something may cut items short
        self._watcher: anyio.CancelScope | None = None
        self._started_at: float | None = None
        self._wall_time: float | None = None
        guard = self.config.guardrails
        self._abort_on = guard.abort_on_error_categories
        # A stop bounds each attempt's scope (a few µs), so workers carry one only where something
        # may cut items short: a batch deadline or a CANCEL_ACTIVE abort.
        self._needs_stop_scope = guard.batch_timeout is not None or (
            bool(self._abort_on) and guard.abort_mode is AbortMode.CANCEL_ACTIVE
        )
        self._ledger.add_step(
            "runtime",
            "processor workers",
            self._close_runtime,
            slow_warning_after=WORKER_CANCELLATION_TIMEOUT,
        )
        if self._store is not None:
            self._ledger.add_step("store", "artifact store", self._close_store)

    # --- lifecycle -----------------------------------------------------

    async def __aenter__(self) -> ParallelBatchProcessor[TOutput]:
        if self._opened:
            raise RuntimeError("ParallelBatchProcessor is one-shot; create a new one")
        self._opened = True
        if self._owns_host:
            await self._host.__aenter__()
        else:
            await anyio.lowlevel.checkpoint()
        self._runtime = self._host.new_runtime_group()
        try:
            if self._store is not None:
                await self._open_store()
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        await self._exit_owner(exc_type, exc, tb)
        # A crash nobody has seen yet (no process_all(), no reader of the terminal) surfaces here.
        delivered = self._channel is not None and self._channel.failure_delivered
        if exc is None and self._crash is not None and not self._crash_reported and not delivered:
            self._crash_reported = True
            raise self._crash
        return None

    _crash_reported = False

    # --- input ---------------------------------------------------------

    async def add_work(self, item: LLMWorkItem[TOutput]) -> None:
        """Queue ``item``. In streaming mode this waits while the input queue is full."""
        self._check_open()
        if self._stop_kind is not None:
            await anyio.lowlevel.checkpoint()
            raise AdmissionClosedError(f"the batch stopped ({self._stop_kind}); no more work is accepted")
        if self._mode is _Mode.FINISHED or self._mode is _Mode.BATCH:
            raise RuntimeError("add_work() after finish() or process_all(): the input is closed")
        if not isinstance(item, LLMWorkItem):
            raise TypeError(f"item={item!r}: must be an LLMWorkItem")
        if (problem := item_id_problem(item.item_id)) is not None:
            raise ValueError(f"item_id={item.item_id!r} {problem}")
        check_item(item.item_id, item.prompt, item.context)
        replay = self._replay_for(item)
        if self._record_order:
            self._input_order.append(item.item_id)
        self.counters.accepted += 1
        if replay is not None:
            await self._publish(replay, None)
            return
        if self._mode is _Mode.NEW:
            try:
                self._send.send_nowait(item)
            except anyio.WouldBlock:
                if self._record_order:
                    self._input_order.pop()
                self.counters.accepted -= 1
                raise QueueFullError(
                    f"input queue is full (max_queue_size={self.config.max_queue_size}); in batch mode "
                    "workers start only in process_all(): use streaming mode (start()) for backpressure"
                ) from None
            await anyio.lowlevel.checkpoint()
            return
        try:
            await self._send.send(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            if self._record_order:
                self._input_order.pop()
            self.counters.accepted -= 1
            raise AdmissionClosedError(
                f"the batch stopped ({self._stop_kind or 'closed'}); no more work is accepted"
            ) from None

    def _check_open(self) -> None:
        if not self._opened:
            raise RuntimeError("use `async with ParallelBatchProcessor(...) as proc:` first")
        if self._ledger.state != "open":
            raise AdmissionClosedError(f"the processor is {self._ledger.state}")

    # --- batch mode ----------------------------------------------------

    async def process_all(self) -> BatchResult[TOutput]:
        """Run every queued item; returns one result per item (controlled stops included)."""
        self._check_open()
        if self._mode is not _Mode.NEW:
            raise RuntimeError(f"process_all() in {self._mode.value} mode: a processor runs once")
        self._mode = _Mode.BATCH
        self._send.close()
        self._start_workers(self._recv.statistics().current_buffer_used)
        await self._workers_done.wait()
        self._finish_run()
        await self._close_progress()
        if self._crash is not None:
            self._crash_reported = True
            raise self._crash
        if self._interrupted:
            raise BatchInterruptedError(
                f"the batch was interrupted with {self.counters.accepted - self.counters.finished} "
                "item(s) unfinished (its workers were cancelled, e.g. by a concurrent close)"
            )
        return self._batch_result()

    def _batch_result(self) -> BatchResult[TOutput]:
        termination = BatchTermination(kind=self._stop_kind or "completed", reason=self._stop_reason)
        return BatchResult.from_results(
            self._results,
            termination=termination,
            wall_time=self._wall_time or 0.0,
            input_order=self._input_order,
        )

    @property
    def termination(self) -> BatchTermination:
        return BatchTermination(kind=self._stop_kind or "completed", reason=self._stop_reason)

    # --- streaming mode ------------------------------------------------

    def start(self) -> None:
        """Enter streaming mode: workers start now and results flow to ``results()``."""
        self._check_open()
        if self._mode is not _Mode.NEW:
            raise RuntimeError(f"start() in {self._mode.value} mode: a processor runs once")
        self._mode = _Mode.STREAMING
        self._channel = ResultChannel(self.config.max_result_queue_size, self._finalize_stream)
        for result in self._results:  # replays published before start()
            self._channel._queue.append(result)
        self._results = []
        self._start_workers(self.config.workers)

    async def finish(self) -> None:
        """No more input: workers drain the queue, then the stream finalizes.

        After a controlled stop (``request_stop()``, a deadline, an abort, a
        spent budget) the input is finished already, and this is a no-op.
        """
        if self._mode is _Mode.FINISHED and self._stop_kind is not None:
            await anyio.lowlevel.checkpoint()
            return
        if self._mode is not _Mode.STREAMING:
            raise RuntimeError(f"finish() in {self._mode.value} mode: call start() first")
        self._mode = _Mode.FINISHED
        self._send.close()
        await anyio.lowlevel.checkpoint()

    def results(self) -> AsyncIterator[WorkItemResult[TOutput]]:
        """Results in completion order, ending in the stream's one durable terminal.

        Every call returns a new iterator over the same channel: concurrent
        consumers share the results, and all of them see the same terminal.
        """
        channel = self._channel
        if channel is None:
            raise RuntimeError("results() before start(): streaming mode starts with start()")
        return _ChannelIterator(channel)

    def _runtime_group(self) -> RuntimeTasks:
        assert self._runtime is not None
        return self._runtime

    def _fail_stream(self, exc: BaseException) -> None:
        """End the stream with ``exc`` (a failing input source) and stop the workers."""
        if self._channel is not None:
            self._channel.decide_failure(exc)
        self._request_stop("interrupted", f"input failed: {type(exc).__name__}: {exc}", cancel_active=True)

    async def _finalize_stream(self) -> None:
        # CONTRACT C2.6: the stream's finalization runs the ordered close
        # before its terminal is decided.
        await self._workers_done.wait()
        self._finish_run()
        await self._close_progress()
        if self._crash is not None:
            raise self._crash
        if self._interrupted:
            raise BatchInterruptedError("the stream's workers were cancelled before the input drained")
        await self._ledger.aclose()

    # --- workers -------------------------------------------------------

    def _start_workers(self, queued: int) -> None:
        assert self._runtime is not None
        count = (
            self.config.workers if self._mode is not _Mode.BATCH else max(1, min(self.config.workers, queued))
        )
        self._workers_live = count
        self._started_at = anyio.current_time()
        if self._observing:
            total = None if self._mode is _Mode.STREAMING else self.counters.accepted
            self._hooks.emit(BatchStarted(total))
            for replayed in self._early_replays:
                self._hooks.emit_terminal(replayed)
            self._early_replays.clear()
        for index in range(count):
            self._runtime.start_soon(self._worker, self._recv.clone(), name=f"worker-{index}")
        self._recv.close()
        timeout = self.config.guardrails.batch_timeout
        if timeout is not None:
            self._runtime.start_soon(self._watch_deadline, self._started_at + timeout, name="batch-deadline")
        if self._progress is not None:
            total = None if self._mode is _Mode.STREAMING else self.counters.accepted
            self._tracker = ProgressTracker(start=self._started_at, total=total)
            if not self._per_item_progress:
                self._runtime.start_soon(self._render_progress, name="progress")

    async def _render_progress(self) -> None:
        progress, tracker = self._progress, self._tracker
        assert progress is not None and tracker is not None
        with anyio.CancelScope() as scope:
            self._progress_scope = scope
            while True:
                await anyio.sleep(self.config.progress_interval)
                progress.update(tracker.snapshot(anyio.current_time()))

    async def _close_progress(self) -> None:
        if self._progress_scope is not None:
            self._progress_scope.cancel("batch finished")
        progress, tracker = self._progress, self._tracker
        if progress is not None and tracker is not None:
            self._tracker = None
            await progress.aclose(tracker.snapshot(anyio.current_time()))
        else:
            await anyio.lowlevel.checkpoint()

    async def _worker(self, recv: Any) -> None:  # noqa: ASYNC910 - `async for` over recv checkpoints
        runner = self._runner
        hooks = self._hooks if self._hooks.active else None
        clock = anyio.current_time
        stop: ItemStop | None = None
        if self._needs_stop_scope:
            stop = ItemStop(self._batch_deadline())
            self._stops.append(stop)
        try:
            with recv:  # closed synchronously: leaving costs no scheduler round per worker
                streak = 0  # items taken in a row without a scheduler round
                while True:
                    # A queued item is taken without a scheduler round, so a call that has just
                    # handed its HTTP connection back to the pool checks one out again at once,
                    # as a plain request loop does: a round here leaves a fifth of the pool idle
                    # at concurrency 200, and httpcore2 probes the socket of every idle connection
                    # twice per request (docs/benchmarks.md). A real round every _NOWAIT_STREAK
                    # items keeps a strategy that never awaits from starving the other tasks, and
                    # one once the batch deadline has passed lets its watcher stop the batch first.
                    try:
                        if streak < _NOWAIT_STREAK and (stop is None or clock() < stop.deadline):
                            item = recv.receive_nowait()
                            streak += 1
                        else:
                            streak = 0
                            item = await recv.receive()
                    except anyio.WouldBlock:
                        streak = 0
                        try:
                            item = await recv.receive()
                        except anyio.EndOfStream:
                            break
                    except anyio.EndOfStream:
                        break
                    if self._stopped():
                        await self._publish(self._not_executed(item), item)
                        await self._drain_not_executed(recv)
                        break
                    tally = ItemTally(clock())
                    if self._tracker is not None:
                        self._tracker.item_started()
                    run_item = item
                    if hooks is not None:
                        if self._observing:
                            hooks.emit(ItemStarted(item.item_id))
                        run_item = await hooks.before_item(item)
                    result = await runner.execute_item(run_item, tally, stop)
                    if result is None:
                        if self._stop_kind is None:
                            # The batch deadline cut this item (only a stop's deadline does that
                            # before a stop is requested): stop now rather than when the watcher
                            # task gets its turn among the workers the deadline woke.
                            self._deadline_reached()
                        result = self._cut_short(item, tally)
                    if hooks is not None:
                        result = await hooks.after_item(run_item, result)
                    # Checkpoint under the original item: resume fingerprints what was added.
                    await self._publish(result, item)
                    if self._stopped():
                        # The batch stopped while this item ran: report the queue, then leave at once
                        # rather than pulling every queued item through the stream.
                        await self._drain_not_executed(recv)
                        break
        except Exception as exc:  # noqa: BLE001 - reported through process_all / the terminal
            self._on_crash(exc)
        except BaseException as exc:
            if not isinstance(exc, anyio.get_cancelled_exc_class()):
                self._on_crash(exc)
            else:
                self._interrupted = True
            raise
        finally:
            self._workers_live -= 1
            if self._workers_live == 0:
                self._workers_done.set()
                if self._channel is not None:
                    self._channel.producers_finished()

    def _stopped(self) -> bool:
        return self._stop_kind is not None

    async def _drain_not_executed(self, recv: Any) -> None:
        """Report every queued item as not executed: ``receive_nowait()`` in a tight loop, with one
        checkpoint per :data:`_DRAIN_CHUNK` items, not one per item. The input is closed by then, so
        the loop ends at the end of the queue; whichever worker gets here first reports it (others
        that finish their own item meanwhile help), the rest find it empty.
        """
        if self._queue_drained:
            return  # noqa: ASYNC910 - another worker reported the queue; the worker's exit checkpoints
        if self._store is not None or self._channel is not None or self._per_item_progress:
            # Publishing awaits here (a checkpoint write, a bounded stream, per-item progress).
            while True:
                try:
                    item = recv.receive_nowait()
                except (anyio.WouldBlock, anyio.EndOfStream):
                    return  # noqa: ASYNC910 - no checkpoint per item on purpose; the worker's exit has one
                await self._publish(self._not_executed(item), item)
        # Batch mode without a store: _publish() for a not-executed result, unrolled. No abort
        # check (the batch has stopped already) and no tokens to charge.
        reason, category = self._not_executed_as()
        emit = self._hooks.emit_terminal if self._observing else None
        tracker = self._tracker
        counters = self.counters
        append = self._results.append
        receive = recv.receive_nowait
        while True:
            with _no_collection():  # no await in this loop
                for _ in range(_DRAIN_CHUNK):
                    try:
                        item = receive()
                    except anyio.EndOfStream:
                        # The input is closed and empty: the workers still finishing their own
                        # item need not try the queue again.
                        self._queue_drained = True
                        return  # noqa: ASYNC910 - as above
                    except anyio.WouldBlock:
                        return  # noqa: ASYNC910 - as above
                    result: WorkItemResult[TOutput] = WorkItemResult(
                        item_id=item.item_id,
                        success=False,
                        error=reason,
                        error_category=category,
                        context=item.context,
                    )
                    if emit is not None:
                        emit(result)
                    counters.finished += 1
                    counters.failed += 1
                    if tracker is not None:
                        tracker.item_finished(success=False, tokens=0)
                    append(result)
            # One checkpoint per chunk: the calls still in flight resume and finish while the
            # rest of the queue is reported, instead of waiting behind the whole queue.
            await anyio.lowlevel.checkpoint()

    _queue_drained = False

    def _batch_deadline(self) -> float:
        timeout = self.config.guardrails.batch_timeout
        if timeout is None or self._started_at is None:
            return float("inf")
        return self._started_at + timeout

    async def _watch_deadline(self, deadline: float) -> None:
        with anyio.CancelScope() as scope:
            self._watcher = scope
            await anyio.sleep_until(deadline)
            self._deadline_reached()

    def _deadline_reached(self) -> None:
        timeout = self.config.guardrails.batch_timeout
        self._request_stop("batch_deadline", f"batch deadline of {timeout} s", cancel_active=True)

    def _cut_short(self, item: LLMWorkItem[TOutput], tally: ItemTally) -> WorkItemResult[TOutput]:
        kind = self._stop_kind or "batch_deadline"
        category = ErrorCategory.DEADLINE if kind == "batch_deadline" else ErrorCategory.ABORTED
        reason = self._stop_reason or "batch deadline"
        return self._runner.stopped_result(item, tally, category=category, reason=f"cut short: {reason}")

    def _not_executed(self, item: LLMWorkItem[TOutput]) -> WorkItemResult[TOutput]:
        # Built directly: no tally, no exception (none happened), one reason string per stop.
        reason, category = self._not_executed_as()
        return WorkItemResult(
            item_id=item.item_id, success=False, error=reason, error_category=category, context=item.context
        )

    def _not_executed_as(self) -> tuple[str, ErrorCategory]:
        """The error and category every not-executed item of this stop shares (fixed once stopped)."""
        shared = self._not_executed_shared
        if shared is None:
            category = (
                ErrorCategory.BUDGET if self._stop_kind == "budget_exhausted" else ErrorCategory.NOT_EXECUTED
            )
            reason = f"not executed: {self._stop_reason or self._stop_kind}"
            shared = self._not_executed_shared = (reason, category)
        return shared

    _not_executed_shared: tuple[str, ErrorCategory] | None = None

    def request_stop(self, reason: str = "stop requested") -> None:
        """Stop admitting new items: a controlled stop (``termination.kind == "interrupted"``).

        Calls in flight finish; queued items are reported ``NOT_EXECUTED``;
        ``add_work`` raises :class:`AdmissionClosedError` from now on. The
        checkpoint keeps everything that finished, so the run can be resumed.
        This is what a first Ctrl+C does in the CLI; ``force_close()`` is the second.
        """
        self._request_stop("interrupted", reason, cancel_active=False)

    def _request_stop(self, kind: TerminationKind, reason: str, *, cancel_active: bool) -> None:
        if self._stop_kind is not None:
            return
        self._stop_kind = kind
        self._stop_reason = reason
        if cancel_active:
            for stop in self._stops:
                stop.cancel(reason)
        # Queued items drain as "not executed"; new input is refused. The stream's input is
        # thereby finished too, so its finalization can end it cleanly.
        self._send.close()
        if self._mode is _Mode.STREAMING:
            self._mode = _Mode.FINISHED

    def _on_crash(self, exc: BaseException) -> None:
        if self._crash is None:
            self._crash = exc
        if self._channel is not None:
            self._channel.decide_failure(exc)
        self._send.close()
        if self._runtime is not None:
            self._runtime.cancel("a worker crashed")

    def _finish_run(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel("batch finished")
        if self._wall_time is None and self._started_at is not None:
            self._wall_time = anyio.current_time() - self._started_at
        if self._observing and not self._batch_finished_emitted:
            self._batch_finished_emitted = True
            self._hooks.emit(BatchFinished(self.termination, self.counters.snapshot()))

    # --- completion: checkpoint, account, publish ----------------------

    # Hot path: in batch mode publishing is a list append; the worker's next
    # receive is the checkpoint.
    async def _publish(  # noqa: ASYNC910
        self, result: WorkItemResult[TOutput], item: LLMWorkItem[TOutput] | None
    ) -> None:
        if self._store is not None and item is not None:
            result = await self._checkpoint(result, item)
        if self._observing:
            if self._started_at is None:
                self._early_replays.append(result)  # announced after BatchStarted
            else:
                self._hooks.emit_terminal(result)
        counters = self.counters
        counters.finished += 1
        if result.success:
            counters.succeeded += 1
        else:
            counters.failed += 1
            # A replayed failure is history: it must not abort the run that replays it.
            if result.error_category in self._abort_on and not result.replayed:
                self._request_stop(
                    "aborted",
                    f"{result.error_category.value} failure of item {result.item_id!r}",
                    cancel_active=self.config.guardrails.abort_mode is AbortMode.CANCEL_ACTIVE,
                )
        if result.replayed:
            counters.replayed += 1
        elif result.token_usage:
            self._charge(result)
        tracker = self._tracker
        if tracker is not None:
            if result.replayed:
                tracker.item_replayed(success=result.success)
            else:
                tracker.item_finished(
                    success=result.success, tokens=result.token_usage.get("total_tokens", 0)
                )
            if self._per_item_progress:
                assert self._progress is not None
                await self._progress.on_item_async(counters.finished, tracker.total, result.item_id)
        channel = self._channel
        if channel is None:
            self._results.append(result)
        else:
            await channel.put(result)

    def _charge(self, result: WorkItemResult[TOutput]) -> None:
        counters = self.counters
        usage = result.token_usage
        counters.add_tokens(usage)
        guard = self.config.guardrails
        if guard.max_total_tokens is not None and counters.total_tokens >= guard.max_total_tokens:
            self._request_stop(
                "budget_exhausted", f"max_total_tokens={guard.max_total_tokens} reached", cancel_active=False
            )
        if guard.cost_function is not None:
            try:
                counters.cost += guard.item_cost(usage)  # type: ignore[arg-type]
            except InvalidCost as exc:
                # Fail closed: an unknown spend must not keep buying (a NaN would never reach the cap).
                logger.warning("item %r: %s; stopping the batch", result.item_id, exc, exc_info=exc.__cause__)
                self._request_stop(
                    "budget_exhausted",
                    f"item {result.item_id!r}: {exc}; the spend is unknown",
                    cancel_active=False,
                )
                return
            if guard.max_total_cost is not None and counters.cost >= guard.max_total_cost:
                self._request_stop(
                    "budget_exhausted", f"max_total_cost={guard.max_total_cost} reached", cancel_active=False
                )

    # --- store ---------------------------------------------------------

    async def _open_store(self) -> None:
        self._resume_plan = await prepare_resume(self._store, self._resume)

    _resume_plan: ResumePlan | None = None

    def _replay_for(self, item: LLMWorkItem[TOutput]) -> WorkItemResult[TOutput] | None:
        plan = self._resume_plan
        if plan is None:
            return None
        return plan.replay(item)

    async def _checkpoint(
        self, result: WorkItemResult[TOutput], item: LLMWorkItem[TOutput]
    ) -> WorkItemResult[TOutput]:
        """Store ``result``, or, if the store cannot keep it faithfully, the failure that replaces it."""
        key = fingerprint(item.prompt, item.context)
        try:
            await self._store.append(result, fingerprint=key, prompt=item.prompt)
        except ArtifactEncodeError as exc:
            # Item-local: nothing was written; publish (and store) why instead of a lossy copy.
            result = unstorable_failure(result, exc)
            await self._store.append(result, fingerprint=key, prompt=item.prompt)
        return result

    async def _close_store(self) -> None:
        await self._store.aclose()

    # --- close steps ---------------------------------------------------

    async def _close_runtime(self) -> None:
        runtime = self._runtime
        if runtime is None:
            await anyio.lowlevel.checkpoint()
            return
        if self._channel is not None and self._mode is _Mode.STREAMING:
            self._channel.decide_failure(BatchInterruptedError("the stream was closed before finish()"))
        self._send.close()
        if runtime.running:
            streaming = self._mode in (_Mode.STREAMING, _Mode.FINISHED)
            reason = "result stream left early" if streaming else "processor closing"
            if self._workers_live and self._stop_kind is None:
                # Work was still outstanding: this batch did not complete.
                self._stop_kind, self._stop_reason = "interrupted", reason
            runtime.cancel(reason)
        await runtime.wait_idle()
        self._recv.close()
        self._finish_run()
        await self._close_progress()
        await self._hooks.aclose()

    def results_statistics(self) -> ResultChannelStatistics:
        """The result channel's state (streaming mode)."""
        if self._channel is None:
            raise RuntimeError("results_statistics() before start()")
        return self._channel.statistics()

    def statistics(self) -> ProcessorStatistics:
        return ProcessorStatistics(
            mode=self._mode.value,
            state=self._ledger.state,
            workers=self._workers_live,
            queued=self._recv.statistics().current_buffer_used,
            counters=self.counters.snapshot(),
            termination=self._stop_kind,
        )
