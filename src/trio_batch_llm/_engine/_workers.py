"""A processor's workers: take an item, run its path, publish its result, leave when the batch stops.

Workers are the only tasks per batch, plus one :class:`~._guards.DeadlineWatcher` when
something has a deadline: no task per item. Each worker runs its items inside its
guard's cancel scope (:mod:`._guards`), and leaves that scope for a new one whenever it
was cancelled; the item in hand (``guard.run``) goes on in the new scope.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Generic, TypeVar

import anyio

from .._backends import cancel_scopes
from .._core._deliveries import is_cancellation
from .._observe._events import ItemStarted
from .._values._categories import ErrorCategory
from .._values._ramp import StartupRampConfig
from .._values._results import BatchTermination, WorkItemResult
from ._channel import ResultChannel
from ._collector import CollectorPause
from ._guards import DeadlineWatcher, Guard
from ._intake import ItemQueue
from ._item import ItemRunner
from ._item_run import ItemRun
from ._publish import Publisher
from ._stops import Stop, StopPolicy

if TYPE_CHECKING:
    from .._host._executor import RuntimeTasks
    from .._observe._hooks import Hooks

__all__ = ["NOWAIT_STREAK", "Crew"]

TOutput = TypeVar("TOutput")

NOWAIT_STREAK: Final = 16
"""Items a worker may take from its queue in a row without a scheduler round."""


class Crew(Generic[TOutput]):
    """The workers of one processor and the watcher of their deadlines.

    ``on_stop`` applies the stop the batch deadline makes (:meth:`StopPolicy.deadline_reached`:
    the watcher's, or a worker's whose item the deadline cut before the watcher recorded it), as
    the publisher's ``on_stop`` applies a result's: the owner acts on a :class:`Stop`, whoever
    decided it. ``on_crash`` is called with a worker's unexpected exception. Once the last worker
    has left, :attr:`done` is set and the result channel (streaming mode) hears that its producers
    are done.
    """

    def __init__(
        self,
        *,
        runner: ItemRunner[TOutput],
        publisher: Publisher[TOutput],
        policy: StopPolicy,
        hooks: Hooks,
        on_stop: Callable[[Stop | None], None],
        on_crash: Callable[[BaseException], None],
        ramp: StartupRampConfig | None = None,
    ) -> None:
        self._runner = runner
        self._ramp = ramp
        self._drained = anyio.Event()  # a worker found the input done: workers still ramping leave
        self._publisher = publisher
        self._policy = policy
        self._hooks = hooks if hooks.active else None
        self._observing = hooks.observing
        self._watch = runner.has_deadlines
        self._on_stop = on_stop
        self._on_crash = on_crash
        self._channel: ResultChannel[WorkItemResult[TOutput]] | None = None
        self._watcher = DeadlineWatcher(on_batch_deadline=self._deadline_reached)
        self._stop_deadline = math.inf  # the batch deadline, once started
        self.live = 0
        self.done = anyio.Event()
        self.collector = CollectorPause()
        """Held off from a stop that cuts calls until the run ends (the processor ends it)."""
        self.interrupted = False
        """Whether a worker was cancelled (the batch did not run to its end)."""

    def start(self, runtime: RuntimeTasks, recv: ItemQueue[TOutput], count: int, *,
              started_at: float, channel: ResultChannel[WorkItemResult[TOutput]] | None = None) -> None:
        """Start ``count`` workers on clones of ``recv`` (closed here), and the watcher if needed;
        ``channel``: the result stream whose producers they are (streaming mode)."""
        self._channel = channel
        ramp = self._ramp
        if ramp is not None:
            count = ramp.workers(count)
        self.live = count
        self._stop_deadline = self._policy.deadline(started_at)
        self._watcher.set_batch_deadline(self._stop_deadline)
        for index in range(count):
            delay = ramp.start_delay(index) if ramp is not None else 0.0
            if delay > 0 and ramp is not None and ramp.jitter_seconds:
                delay += random.uniform(0.0, ramp.jitter_seconds)
            start_at = started_at + delay if delay > 0 else None
            runtime.start_soon(self._work, recv.clone(), start_at, name=f"worker-{index}")
        recv.close()
        if self._watch or self._stop_deadline != math.inf:
            runtime.start_soon(self._watcher.run, name="deadlines")

    def stop(self, reason: str, *, cut_calls: bool) -> None:
        """A stop was decided: no call starts from now on, not even a retry. With ``cut_calls``
        every item in hand is cut short; without, only those parked for their next call (waiting
        for admission, at the breaker, in a backoff: ``ItemRun.waiting``), and calls in flight finish.

        What is in flight and queued settles now, a burst of survivors: full collections wait.
        """
        if self.live > 0:
            self.collector.begin()
        self._runner.halt()
        guards = self._watcher.guards
        if cut_calls:
            in_hand = [scope for guard in guards if (scope := guard.stop(reason)) is not None]
        else:  # each ends in its renewed scope: ItemRunner.cut() says STOPPED, see _cut_short()
            in_hand = [guard.scope for guard in guards
                       if guard.armed and guard.run is not None and guard.run.waiting]
        cancel_scopes(in_hand, reason)

    def _deadline_reached(self) -> None:
        self._on_stop(self._policy.deadline_reached())

    def close(self) -> None:
        """The batch is over: stop watching deadlines."""
        self._watcher.close()

    def wind_up_nowait(self, termination: BatchTermination) -> bool:
        """The run's tasks are gone: end it without awaiting (watcher, ``BatchFinished``, collector),
        unless a progress display or a post-processor thread must be awaited first (``False``)."""
        publisher = self._publisher
        if publisher.closes_progress or (self._hooks is not None and self._hooks.post_processor_busy):
            return False
        self._watcher.close()
        publisher.finish(termination)
        self.collector.end()  # at the latest: a stop's pause of the collector ends with the run
        return True

    async def _work(  # noqa: ASYNC910 - receive() and drive() checkpoint
        self, recv: ItemQueue[TOutput], start_at: float | None = None
    ) -> None:
        guard = self._watcher.guard(stop_deadline=self._stop_deadline)
        try:
            with recv:  # closed synchronously: leaving costs no scheduler round per worker
                if start_at is not None and not await self._wait_for_turn(start_at):
                    return  # noqa: ASYNC910 - _wait_for_turn() waited (the only way here)
                while True:
                    with guard.renew():
                        if await self._loop(recv, guard):
                            self._drained.set()
                            return
                    if guard.stopped is not None:
                        # A stop cut the item in hand short and nothing is left to cut: finish
                        # it out of any guard scope. A fresh scope per worker was most of the
                        # cost of a stop with every worker in a call (deadline drain, N=1,000).
                        await self._finish_stopped(recv, guard)
                        return
                    # A deadline cancelled the scope; the item in hand goes on in a new one.
        except Exception as exc:  # noqa: BLE001 - reported through process_all / the terminal
            self._on_crash(exc)
        except BaseException as exc:
            # A group holding only cancellations is one too: a strategy's own Trio nursery
            # (trio.open_tcp_stream's, in an HTTP connect) raises its Cancelled in a group when our
            # scope is cancelled meanwhile. Taken for a crash, it failed the batch with a
            # Cancelled that outlives its scope (and cancelled the host: issue 37, the chaos test).
            if not is_cancellation(exc):
                self._on_crash(exc)
            else:
                self.interrupted = True
            raise
        finally:
            run = guard.run
            if run is not None and run.claim is not None:  # cancelled with a cache miss in hand
                await self._runner.let_go(run)  # (shielded within a bound: ._cached)
            self.live -= 1
            if self.live == 0:
                self.done.set()
                if self._channel is not None:
                    self._channel.producers_finished()

    async def _wait_for_turn(self, start_at: float) -> bool:
        """A ramping worker waits for its start time; ``False`` when the input drained first."""
        with anyio.move_on_after(max(0.0, start_at - anyio.current_time())):
            await self._drained.wait()
            return False
        return True

    async def _loop(self, recv: ItemQueue[TOutput], guard: Guard) -> bool:  # noqa: ASYNC910 - receive() and drive() checkpoint
        """Run items in the guard's current scope; ``True`` once the queue is done, ``False`` to renew it."""
        runner = self._runner
        publisher = self._publisher
        policy = self._policy
        hooks = self._hooks
        clock = anyio.current_time
        stop_deadline = guard.stop_deadline
        run: ItemRun[TOutput] | None = guard.run
        result: WorkItemResult[TOutput] | None
        streak = 0  # items taken in a row without a scheduler round
        while True:
            if run is None:
                # A queued item is taken without a scheduler round, so a call that has just
                # handed its HTTP connection back to the pool checks one out again at once,
                # as a plain request loop does: a round here leaves a fifth of the pool idle
                # at concurrency 200, and httpcore2 probes the socket of every idle connection
                # twice per request (docs/benchmarks.md). A real round every NOWAIT_STREAK
                # items keeps a strategy that never awaits from starving the other tasks, and
                # one once the batch deadline has passed lets its watcher stop the batch first.
                try:
                    if streak < NOWAIT_STREAK and (stop_deadline == math.inf or clock() < stop_deadline):
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
                        return True  # noqa: ASYNC910 - the queue is done; the worker leaves
                except anyio.EndOfStream:
                    return True  # noqa: ASYNC910 - the queue is done; the worker leaves
                if policy.kind is not None:
                    await publisher.publish(publisher.not_executed(item), item, started=False)
                    await publisher.drain(recv)
                    return True
                run = guard.run = runner.begin(item, stop_deadline=stop_deadline)
                tracker = publisher.tracker
                if tracker is not None:
                    tracker.item_started()
                if hooks is not None:
                    if self._observing:
                        hooks.emit(ItemStarted(item.item_id))
                    run.use(await hooks.before_item(item))
                result = await runner.drive(run, guard)
            elif run.result is not None:
                result = run.result  # finished in the instant its last scope was cancelled
            else:
                result = await runner.resume(run, guard)  # its guard fired mid-item
            if result is None:
                result = self._cut_short(run)
            if guard.scope.cancel_called or guard.stopped is not None:
                # Cancelled as the item finished (or about to be: a stop cancels every guard's
                # scope from one callback on asyncio): leave this scope before awaiting anything.
                run.keep(result)
                return False  # noqa: ASYNC910 - drive() checkpointed
            if run.claim is not None:  # a cache miss that did not succeed: its claim goes, nothing written
                await runner.let_go(run)
            if hooks is not None:
                result = await hooks.after_item(run.item, result)
            # Checkpoint under the item as added: resume fingerprints what was added.
            await publisher.publish(result, run.added)
            guard.run = run = None
            if policy.kind is not None:
                # The batch stopped while this item ran: report the queue, then leave at once
                # rather than pulling every queued item through the stream.
                self.collector.check()
                await publisher.drain(recv)
                return True

    async def _finish_stopped(self, recv: ItemQueue[TOutput], guard: Guard) -> None:
        """After a stop that cancelled this worker's guard: its item's result, then the queue's."""
        run: ItemRun[TOutput] | None = guard.run
        if run is not None:
            result = run.result if run.result is not None else self._cut_short(run)
            if run.claim is not None:
                await self._runner.let_go(run)
            if self._hooks is not None:
                result = await self._hooks.after_item(run.item, result)
            await self._publisher.publish(result, run.added)
            guard.run = None
        self.collector.check()
        await self._publisher.drain(recv)

    def _cut_short(self, run: ItemRun[TOutput]) -> WorkItemResult[TOutput]:
        if self._policy.kind is None:
            # The batch deadline cut this item before the watcher recorded the stop:
            # stop now rather than when the watcher gets its turn.
            self._deadline_reached()
        policy = self._policy
        deadline = policy.kind == "batch_deadline"
        if run.attempts == 0 and not deadline:  # it never called: as an item the stop left in the queue
            reason, category = policy.not_executed()
            return self._stopped(run, category, reason)
        category, reason = policy.cut_short()
        last = run.last_error
        if run.calling or deadline or last is None:
            return self._stopped(run, category, reason)
        # Between attempts: no retry starts. Its error names its last failure (no exception: as for any
        # cut-short item, none happened to the result itself, and a resume runs the item again).
        reason = f"{reason}, before a retry; last error: {type(last).__name__}: {last}"
        return self._stopped(run, category, reason)

    def _stopped(self, run: ItemRun[TOutput], category: ErrorCategory, reason: str
                 ) -> WorkItemResult[TOutput]:
        result = self._runner.stopped(run, category, reason)
        result.stop_reason = self._policy.unfinished_reason
        return result

