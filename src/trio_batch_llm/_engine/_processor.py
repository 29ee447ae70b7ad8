"""ParallelBatchProcessor: a host, a bounded input stream, workers, and one result terminal.

Lifecycle and modes only. The parts: the input (:mod:`._intake`), the workers (:mod:`._workers`) running
the item path (:mod:`._item`), the stop rules (:mod:`._stops`), publishing (:mod:`._publish`), the result
stream and its terminal (:mod:`._channel`).

- batch mode: ``add_work()`` items, then ``await process_all()`` -> :class:`BatchResult` (without
  ``async with`` too: then the call opens and closes the processor, :mod:`._unowned`);
- streaming mode: ``start()``, ``add_work()`` as items come (or ``feed(source)``),
  ``finish()``, and read ``results()`` (completion order) until the terminal (CONTRACT C6).

Over 400 lines because both modes and the run's close (with its synchronous twin, which spares a
small batch's close a task) act on one state: mode, input, crew, channel. The parts act on what
they decide themselves and hand the processor a :class:`Stop` (a result's verdict, the batch
deadline, a retired provider), which :meth:`ParallelBatchProcessor._apply` acts on.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Sequence
from functools import partial
from types import TracebackType
from typing import Any, Generic, TypeVar, final

import anyio
import anyio.lowlevel

from .._artifacts import prepare_resume
from .._artifacts._protocol import ArtifactStore
from .._core._ledger import WORKER_CANCELLATION_TIMEOUT
from .._host._executor import ExecutorHost, RuntimeTasks
from .._host._owner import HostedOwner
from .._observe._hooks import Hooks
from .._observe._log import log_stop
from .._observe._progress import make_progress
from .._observe._snapshot import Progress
from .._values._batch_result import BatchResult
from .._values._config import FROM_CONFIG, FromConfig, ProcessorConfig, ResumePolicy
from .._values._errors import AdmissionClosedError, BatchInterruptedError
from .._values._requests import LLMWorkItem
from .._values._results import BatchTermination, WorkItemResult
from .._values._stats import ProcessorStatistics, RunCounters
from .._values._stop_reasons import StopReason
from ._breaker_gate import Retirement
from ._cached import open_item_cache
from ._channel import ResultChannel, ResultChannelStatistics, ResultIterator
from ._classifier_objects import ClassifierArg
from ._inputs import CheckedItems, aiter_items, feed_items
from ._intake import Intake
from ._item import ItemRunner, start_deadline
from ._observer_tasks import ObserverTasks
from ._publish import Publisher
from ._stops import Stop, StopPolicy
from ._unowned import STREAMING_NEEDS_A_BLOCK, PendingInput, run_in_own_block
from ._workers import Crew

__all__ = ["ParallelBatchProcessor"]

TOutput = TypeVar("TOutput")


class _Mode(enum.Enum):
    NEW = "new"
    BATCH = "batch"
    STREAMING = "streaming"
    FINISHED = "finished"


@final
class ParallelBatchProcessor(HostedOwner, Generic[TOutput]):
    """Runs work items concurrently with shared quotas, retries, deadlines and checkpoints.

    ``call_start_deadline`` (an ``anyio.current_time()`` instant): no call starts at or after
    it; such an item comes back NOT_EXECUTED (ABORTED after an attempt); calls in flight go on.
    ``record_input_order=False`` keeps no ids in input order (:attr:`input_order` is empty).
    """

    def __init__(
        self,
        config: ProcessorConfig | None = None,
        *,
        post_processor: Callable[[WorkItemResult[TOutput]], Any] | None = None,
        error_classifier: ClassifierArg | None = None,
        middlewares: Sequence[Any] | None = None,
        observers: Sequence[Any] | None = None,
        progress_callback: Callable[[int, int | None, str], Any] | Progress | None = None,
        artifact_store: ArtifactStore | None = None,
        resume: ResumePolicy = ResumePolicy.NONE,
        host: ExecutorHost | None = None,
        post_processor_timeout: float | FromConfig | None = FROM_CONFIG,
        call_start_deadline: float | None = None,
        record_input_order: bool = True,
    ) -> None:
        if config is not None and not isinstance(config, ProcessorConfig):
            raise TypeError(f"config={config!r}: must be a ProcessorConfig")
        self.config = cfg = config if config is not None else (host.config if host else ProcessorConfig())
        self._init_owner(host, ExecutorHost(cfg, name="ParallelBatchProcessor"), "ParallelBatchProcessor")
        self._hooks = hooks = Hooks.build(
            observers=observers, middlewares=middlewares, post_processor=post_processor,
            post_processor_timeout=cfg.post_processor_timeout_for(post_processor_timeout),
            observer_timeout=cfg.observer_timeout)
        self.counters = RunCounters()
        self._policy = policy = StopPolicy(cfg.guardrails, self.counters)
        self._resume = resume
        runner = ItemRunner[TOutput](self._host, cfg, classifier=error_classifier, hooks=hooks,
                                     start_by=start_deadline(call_start_deadline),  # ahead of the streams
                                     on_retire=self._provider_retired)
        self._runner = runner
        self._intake = Intake[TOutput](cfg.max_queue_size, self.counters, record_order=record_input_order)
        self._publisher: Publisher[TOutput] = Publisher(
            store=artifact_store, hooks=hooks, counters=self.counters, policy=policy, on_stop=self._apply,
            scope_statistics=runner.scope_statistics)
        self._crew: Crew[TOutput] = Crew(
            runner=runner, publisher=self._publisher, policy=policy, hooks=hooks, ramp=cfg.startup_ramp,
            on_stop=self._apply, on_crash=self._on_crash,
        )
        self._progress: Progress | None = make_progress(progress_callback) if progress_callback else None
        self._mode = _Mode.NEW
        self._opened = False
        self._pending = PendingInput[TOutput](cfg.max_queue_size)
        self._feeding = False
        self._runtime: RuntimeTasks | None = None
        self._observers = ObserverTasks(hooks)  # async observers: they outlive the run
        self._channel: ResultChannel[WorkItemResult[TOutput]] | None = None
        self._crash: BaseException | None = None
        self._crash_reported = False
        slow = WORKER_CANCELLATION_TIMEOUT
        self._ledger.add_step("runtime", "processor workers", self._close_runtime, slow_warning_after=slow,
                              nowait=self._close_runtime_nowait)
        if hooks.async_observers:  # after the workers: BatchFinished is emitted by then
            self._ledger.add_step("runtime", "async observers", self._observers.close)
        if artifact_store is not None:
            self._ledger.add_step("store", "artifact store", self._publisher.close_store)

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
        if self._hooks.async_observers:
            self._observers.start(self._host.new_runtime_group())
        try:
            await self._open_cache()
            if self._publisher.store is not None:
                self._intake.plan = await prepare_resume(self._publisher.store, self._resume)
            for item in self._pending.drain():
                await self.add_work(item)
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        absorbed = await self._exit_owner(exc_type, exc, tb)
        # A crash nobody has seen yet (no process_all(), no reader of the terminal) surfaces here.
        delivered = self._channel is not None and self._channel.failure_delivered
        if exc is None and self._crash is not None and not self._crash_reported and not delivered:
            self._crash_reported = True
            raise self._crash
        return absorbed

    async def _open_cache(self) -> None:
        """The response cache's connection, for this processor's run: closed in its ledger's store phase."""
        cache = await open_item_cache(self.config)
        if cache is not None:
            self._runner.cache = cache
            self._ledger.add_step("store", "response cache", cache.aclose)

    # --- input ---------------------------------------------------------

    async def add_work(self, item: LLMWorkItem[TOutput]) -> None:
        """Queue ``item``. In streaming mode this waits while the input queue is full.

        An id this processor accepted already is refused (``ValueError``), before any call.
        """
        if not self._opened:
            return await self._pending.add(item)
        await self._add(item)

    async def _add(self, item: LLMWorkItem[TOutput] | CheckedItems[TOutput], checked: bool = False) -> None:
        self._check_open()
        if self._policy.kind is not None:
            await anyio.lowlevel.checkpoint()
            raise AdmissionClosedError(f"the batch stopped ({self._policy.kind}); no more work is accepted")
        if self._mode is _Mode.FINISHED or self._mode is _Mode.BATCH:
            raise RuntimeError("add_work() after finish() or process_all(): the input is closed")
        if isinstance(item, CheckedItems):  # process_prompts' list, checked whole: all at once, none again
            return await self._intake.add_checked(item, self._policy, self._publisher.publish)
        replay = self._intake.accept(item, checked=checked)
        if replay is not None:
            await self._publisher.publish(replay, None)
        else:
            await self._intake.queue(item, wait=self._mode is not _Mode.NEW, stopped=self._policy.kind)

    def _check_open(self) -> None:
        if not self._opened:
            raise RuntimeError(STREAMING_NEEDS_A_BLOCK)
        if self._ledger.state != "open":
            raise AdmissionClosedError(f"the processor is {self._ledger.state}")

    @property
    def input_order(self) -> Sequence[str]:
        """The ids of the accepted items in the order they were added (none if not ``record_input_order``)."""
        return self._intake.order

    # --- batch mode ----------------------------------------------------

    async def process_all(self) -> BatchResult[TOutput]:
        """Run every queued item; returns one result per item (controlled stops included)."""
        if not self._opened:
            return await run_in_own_block(self, self.process_all)
        self._check_open()
        if self._mode is not _Mode.NEW:
            raise RuntimeError(f"process_all() in {self._mode.value} mode: a processor runs once")
        self._mode = _Mode.BATCH
        self._intake.close()
        self._start_workers(self._intake.queued)
        await self._crew.done.wait()
        await self._finish_run()
        assert self._runtime is not None  # its tasks' supervisor leaves a round after the last worker:
        await self._runtime.wait_idle()  # none may outlive this call and meet the caller's cancellation
        if self._crash is not None:
            self._crash_reported = True
            raise self._crash
        if self._crew.interrupted:
            unfinished = self.counters.accepted - self.counters.finished
            raise BatchInterruptedError(f"the batch was interrupted with {unfinished} item(s) unfinished "
                                        "(its workers were cancelled, e.g. by a concurrent close)")
        batch = BatchResult.from_results(self._publisher.results, termination=self.termination,
                                         wall_time=self._publisher.wall_time, input_order=self._intake.order)
        self._crew.collector.end()  # what a stop's drain made due is collected after the call, not in it
        return batch

    @property
    def termination(self) -> BatchTermination:
        return self._policy.termination

    # --- streaming mode ------------------------------------------------

    def start(self) -> None:
        """Enter streaming mode: workers start now and results flow to ``results()``."""
        self._check_open()
        if self._mode is not _Mode.NEW:
            raise RuntimeError(f"start() in {self._mode.value} mode: a processor runs once")
        self._mode = _Mode.STREAMING
        self._channel = ResultChannel(self.config.max_result_queue_size, self._finalize_stream)
        self._start_workers(self.config.workers)

    def feed(self, items: Iterable[LLMWorkItem[TOutput]] | AsyncIterable[LLMWorkItem[TOutput]]) -> None:
        """Streaming mode: a task of this processor adds every item of ``items``, then finishes.

        ``items`` is the whole input; a source that raises ends the stream with that
        error; the processor closes ``items`` (``aclose()``) when done with it.
        """
        if self._mode is not _Mode.STREAMING or self._feeding:
            raise RuntimeError("feed() once, in streaming mode: call start() first")
        self._feeding = True
        assert self._runtime is not None
        add = self.add_work
        if isinstance(items, aiter_items):  # it checks ids as it reads: against ours, and only once
            items.check_ids_with(self._intake.ids)
            add = partial(self._add, checked=True)
        task = partial(feed_items, items, add=add, finish=self.finish, fail=self._fail_input)
        self._runtime.start_soon(task, name="feed")

    def _fail_input(self, exc: Exception) -> None:
        if self._channel is not None:
            self._channel.decide_failure(exc)
        reason = f"input failed: {type(exc).__name__}: {exc}"
        self._apply(self._policy.request("interrupted", reason, cancel_active=True,
                                         stop_reason=StopReason.FAIL_FAST))

    async def finish(self) -> None:
        """No more input: workers drain the queue, then the stream finalizes (a no-op after a stop)."""
        if self._mode is _Mode.FINISHED and self._policy.kind is not None:
            await anyio.lowlevel.checkpoint()
            return
        if self._mode is not _Mode.STREAMING:
            raise RuntimeError(f"finish() in {self._mode.value} mode: call start() first")
        self._mode = _Mode.FINISHED
        self._intake.close()
        await anyio.lowlevel.checkpoint()

    def results(self) -> AsyncIterator[WorkItemResult[TOutput]]:
        """Results in completion order, then the stream's one durable terminal.

        Each call gives a new iterator over the same results (consumers share them) and terminal.
        """
        channel = self._channel
        if channel is None:
            raise RuntimeError("results() before start(): streaming mode starts with start()")
        return ResultIterator(channel)

    async def _finalize_stream(self) -> None:
        # CONTRACT C2.6: the stream's finalization runs the ordered close before its terminal.
        await self._crew.done.wait()
        await self._finish_run()
        self._crew.collector.end()  # (as at the end of process_all)
        if self._crash is not None:
            raise self._crash
        if self._crew.interrupted:
            raise BatchInterruptedError("the stream's workers were cancelled before the input drained")
        await self._ledger.aclose()

    # --- stops ---------------------------------------------------------

    def request_stop(self, reason: str = "stop requested", *,
                     stop_reason: StopReason = StopReason.SHUTDOWN) -> None:
        """Stop admitting new items: a controlled stop (``termination.kind == "interrupted"``).

        Calls in flight finish (a failed one is not retried); queued items, and those waiting for
        admission (an RPM unit, the breaker), are reported ``NOT_EXECUTED``, one between retries ``ABORTED``;
        ``add_work`` raises :class:`AdmissionClosedError` from now on. The
        checkpoint keeps everything that finished, so the run can be resumed.
        This is what a first Ctrl+C does in the CLI; ``force_close()`` is the second.
        ``stop_reason`` is what the unfinished items say (a durable run's pause: ``PAUSE``).
        """
        if not isinstance(stop_reason, StopReason):
            raise TypeError(f"stop_reason={stop_reason!r}: must be a StopReason")
        self._apply(self._policy.request("interrupted", reason, stop_reason=stop_reason))

    def _apply(self, stop: Stop | None) -> None:
        if stop is None:
            return
        log_stop(stop.kind, stop.reason, stop.stop_reason.value, stop.item_id)
        self._crew.stop(stop.reason, cut_calls=stop.cancel_active)
        # Queued items drain as "not executed"; new input is refused. The stream's input is
        # thereby finished too, so its finalization can end it cleanly.
        self._intake.close()
        if self._mode is _Mode.STREAMING:
            self._mode = _Mode.FINISHED

    def _provider_retired(self, retirement: Retirement) -> None:
        # Calls in flight finish (they were let go before the breaker opened); items waiting at the
        # breaker end PROVIDER_RETIRED, the queue drains as not executed with the same reason.
        self._apply(self._policy.request("provider_retired", retirement.reason, item_id=retirement.item_id))

    def _on_crash(self, exc: BaseException) -> None:
        if self._crash is None:
            self._crash = exc
        if self._channel is not None:
            self._channel.decide_failure(exc)
        self._intake.close()
        if self._runtime is not None:
            self._runtime.cancel("a worker crashed")

    # --- workers -------------------------------------------------------

    def _start_workers(self, queued: int) -> None:
        assert self._runtime is not None
        workers = self.config.workers
        count = workers if self._mode is not _Mode.BATCH else max(1, min(workers, queued))
        started = anyio.current_time()
        total = None if self._mode is _Mode.STREAMING else self.counters.accepted
        self._publisher.open(channel=self._channel, progress=self._progress, started_at=started, total=total)
        self._crew.start(self._runtime, self._intake.recv, count, started_at=started, channel=self._channel)
        if self._publisher.renders_progress:
            self._runtime.start_soon(self._publisher.render_progress, self.config.progress_interval)

    async def _finish_run(self) -> None:
        self._crew.close()
        await self._publisher.close(self.termination)

    def _close_runtime_nowait(self) -> bool:
        # The runtime step in the closer's own task: stop the run's tasks, and wind the run up when
        # none is left and nothing must be awaited (the usual close after process_all()).
        runtime = self._runtime
        if runtime is None:  # never opened: its input streams are closed by awaiting
            return False
        if self._channel is not None and self._mode is _Mode.STREAMING:
            self._channel.decide_failure(BatchInterruptedError("the stream was closed before finish()"))
        self._intake.close()
        if runtime.running:
            reason = "result stream left early" if self._channel is not None else "processor closing"
            if self._crew.live:
                why = StopReason.POOL_CLOSED if self._channel is not None else StopReason.SHUTDOWN
                self._policy.request("interrupted", reason, stop_reason=why)  # work was outstanding
            runtime.cancel(reason)
        if not runtime.idle or not self._crew.wind_up_nowait(self.termination):
            return False
        self._intake.recv.close()
        return True

    async def _close_runtime(self) -> None:  # noqa: ASYNC910 - runs only when the nowait twin could not finish
        runtime = self._runtime
        if runtime is None:  # never opened: its input streams are all there is to close
            await self._intake.discard()
            return
        if not self._close_runtime_nowait():
            await runtime.wait_idle()
            if not self._close_runtime_nowait():  # a progress display to close, a post-processor thread
                self._intake.recv.close()
                await self._finish_run()
                self._crew.collector.end()
                await self._hooks.aclose()

    def results_statistics(self) -> ResultChannelStatistics:
        """The result channel's state (streaming mode)."""
        if self._channel is None:
            raise RuntimeError("results_statistics() before start()")
        return self._channel.statistics()

    def statistics(self) -> ProcessorStatistics:
        return ProcessorStatistics(mode=self._mode.value, state=self._ledger.state, workers=self._crew.live,
                                   queued=self._intake.queued, counters=self.counters.snapshot(),
                                   termination=self._policy.kind)
