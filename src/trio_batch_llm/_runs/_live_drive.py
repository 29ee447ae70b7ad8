"""One *drive segment* of a live run: a streaming ParallelBatchProcessor fed from the run.

Over 400 lines because one segment has two feeders (alone, and beside other drivers under a
lease) that share its recorder and stop handling, and the why of each write sits beside it;
split apart the two feeders would drift.

What every driver shares (the segment's control surface, ingestion, the status
watcher, how a segment ends) is :mod:`._segment`; this module is what a live
segment does with them. Three tasks, all owned by the caller's ``wait()``:

* the **feeder** hands the processor the run's pending items (ingested by an
  earlier segment or process, in ingestion order), then each newly committed
  ingestion slice, then calls ``finish()``;
* the **recorder** (the segment's own body) reads the processor's results
  and records the terminal ones in groups (``repository.record``: items done
  and results sequenced in one transaction); an item's result is never
  recorded twice, and an item stopped by the engine stays pending;
* the **watcher** polls the stored status, so a pause or cancel made in
  another process reaches this one within a poll interval (each record call
  also returns the status, so a busy run notices sooner).

**The order of writes, and what a crash leaves.** An item's life is written
in transactions of their own: ingested (with the source's checkpoint past it,
:mod:`._ingest`), its call started (only beside other drivers, before the call
leaves, :mod:`._starts`), its result recorded (done and sequenced at once). A
crash before the record leaves the item pending: the next segment calls it
again (calls are at-least-once), and it is never recorded twice (results are
exactly-once), since the record is the one write that ends it.

A pause asks the processor to stop admitting (``request_stop``): calls in
flight finish and are recorded, queued items come back ``NOT_EXECUTED`` and
stay pending. A cancel (or the end of ``wait()``'s time) cancels the segment:
calls in flight are abandoned and their items stay pending. The processor's
``call_start_deadline`` keeps any call from *starting* once ``wait()``'s
deadline has passed, whatever the scheduling order at that instant: such an
item comes back ``NOT_EXECUTED`` (``ABORTED`` before a retry) and stays pending.

A database outage is ridden out below this module: every repository call
retries through it (:class:`RepositoryClient`), so the tasks here just wait --
the recorder holds the results of calls that finished meanwhile, and the
bounded result queue holds the workers back. Past ``unreachable_timeout`` a call
raises :class:`DatabaseUnavailableError`: the segment ends and ``drive()``
raises it without storing a failure (the run stays ``running``). A claim lost
with the connection (:class:`ClaimLostError`: another process took it
meanwhile) ends the segment the same way, silently: the caller's next
segment claims again, or watches (or, with leases, drives without ingesting).

With leases (many drivers per run) the feeder leases its items a page at a
time, and two more tasks run: the lease's **heartbeat** and the **call starts**
writer (:class:`CallStarts`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Final, final

import anyio
import anyio.lowlevel

from .._core._deliveries import unwrap_group
from .._engine._processor import ParallelBatchProcessor
from .._strategies._base import LLMCallStrategy
from .._values._categories import ErrorCategory
from .._values._config import ProcessorConfig
from .._values._errors import (
    AdmissionClosedError,
    ArtifactStoreError,
    BatchInterruptedError,
    DatabaseUnavailableError,
)
from .._values._requests import LLMWorkItem, request_of_text
from .._values._results import BatchTermination
from .._values._stop_reasons import StopReason
from ._encode import encode_new_result
from ._ingest import IngestedItem, Ingestor, decode_context
from ._schema import ClaimLostError, LeaseLostError, NewResult, RunSnapshot, RunTermination
from ._segment import DriverBase, Segment
from ._starts import CallStarts
from .repository._client import RepositoryClient

__all__ = ["LiveSegmentDriver"]

# Results the engine gives items it stopped: not the item's outcome, so it stays pending. So does
# the item whose answer stopped the batch (a per-day quota, a spend limit: stop_reason PROVIDER_RETIRED).
_NOT_TERMINAL: Final = frozenset({ErrorCategory.NOT_EXECUTED, ErrorCategory.ABORTED, ErrorCategory.BUDGET})
_PENDING_PAGE: Final = 512
# One transaction per group of results, not per result; a crash loses only the calls whose results
# were not recorded yet (their items run again).
_RECORD_GROUP: Final = 256


@final
class LiveSegmentDriver(DriverBase):
    """Runs live drive segments for one run handle (see the module docstring)."""

    def __init__(
        self,
        *,
        db: RepositoryClient,
        run_id: str,
        strategy: LLMCallStrategy[Any],
        config: ProcessorConfig,
        ingestor: Ingestor | None,
        poll_interval: float,
        lease_seconds: float | None = None,
    ) -> None:
        super().__init__(db=db, run_id=run_id, config=config, ingestor=ingestor, poll_interval=poll_interval)
        self._strategy = strategy
        self.lease_seconds = lease_seconds

    def decode_output(self, stored: Any) -> Any:
        """A stored output back to what the strategy made (what ``encode_new_result`` checked)."""
        return self._strategy.decode_output(stored)

    async def drive(self, seg: Segment, snap: RunSnapshot, deadline: float, *,
                    lease: int | None = None, ingest: bool = True) -> None:
        """Run one segment of a ``running`` run; afterwards the stored status says how it ended.

        With ``lease`` (a token of ``open_lease``: many drivers share the run)
        the segment feeds only items it leased, records under the lease, and
        ingests only if ``ingest`` (this process holds the run's claim).

        Raises what failed the run (after storing ``failed``); a cancellation
        (``wait()``'s deadline, or the caller) leaves the status ``running``.
        """
        ingest = ingest and not snap.checkpoint.exhausted
        if lease is None or ingest:
            await self._prepare_ingestion(snap)
        config = self._segment_config(snap, shared=lease is not None)
        if config is None:
            budget = self._config.guardrails.max_total_tokens
            await self._fail(RunTermination("budget_exhausted", f"max_total_tokens={budget} reached"))
            return
        starts = None
        if lease is not None:  # each call's start is written under the lease before it goes (._starts)
            starts = CallStarts(functools.partial(self._start_calls, lease),
                                functools.partial(self._lost, seg))
        proc = ParallelBatchProcessor[Any](config, call_start_deadline=deadline,
                                           middlewares=[starts] if starts is not None else None)
        # Beside other drivers any database error is this driver's alone (its lease lapses, the
        # others go on); driving alone, only an outage past the bound is not the run's failure.
        lost = DatabaseUnavailableError if lease is None else ArtifactStoreError
        try:
            # The processor is entered outside the segment's task group, so every task here (the
            # feeder that calls finish(), the recorder reading results) has ended before its close.
            with unwrap_group():
                async with proc:
                    proc.start()
                    try:
                        async with anyio.create_task_group() as tg:
                            seg.bind(proc, tg.cancel_scope)
                            if lease is None:
                                feed = functools.partial(self._feed, seg, proc, snap.checkpoint.exhausted)
                                tg.start_soon(seg.guarded, feed, name="run feeder")
                            else:
                                feed = functools.partial(self._feed_leased, seg, proc, lease, ingest)
                                tg.start_soon(seg.guarded, feed, name="run feeder")
                                beat = functools.partial(self._heartbeat, seg, lease)
                                tg.start_soon(seg.guarded, beat, name="run lease heartbeat")
                                assert starts is not None
                                tg.start_soon(seg.guarded, starts.run, name="run call starts")
                            watch = functools.partial(self._watch, seg, leased=lease is not None)
                            tg.start_soon(seg.guarded, watch, name="run status watcher")
                            await self._record(seg, proc, lease)
                            tg.cancel_scope.cancel("segment finished")
                    finally:
                        seg.raise_interrupt()  # into the processor's close, as on Trio (CONTRACT C6.4, C7.4)
        except Exception as exc:  # noqa: BLE001 - _body_raised re-raises all but a lost claim
            await self._body_raised(exc, lost)
            return  # the claim is lost: another process drives now, the run goes on there
        if await self._tasks_ended(seg, lost):
            return
        await self._conclude(seg, proc.termination, shared=lease is not None)

    def _segment_config(self, snap: RunSnapshot, *, shared: bool = False) -> ProcessorConfig | None:
        config = self._config
        queue = max(2 * config.workers, 16)
        if not config.max_queue_size or (shared and config.max_queue_size > queue):
            # A bounded input queue: a pause then reports few items NOT_EXECUTED. Beside other
            # drivers it is what this one holds leased ahead of its calls: no more than it needs,
            # so the others find work, and a dead driver leaves few items waiting for its expiry.
            config = dataclasses.replace(config, max_queue_size=queue)
        if not config.max_result_queue_size:
            # Bounded results: workers never run far ahead of what is recorded.
            config = dataclasses.replace(config, max_result_queue_size=max(2 * config.workers, 64))
        budget = config.guardrails.max_total_tokens
        if budget is not None:
            # The token budget covers the whole run, not each segment.
            remaining = budget - snap.total_tokens
            if remaining <= 0:
                return None
            guardrails = dataclasses.replace(config.guardrails, max_total_tokens=remaining)
            config = dataclasses.replace(config, guardrails=guardrails)
        return config

    async def _conclude(self, seg: Segment, termination: BatchTermination, *, shared: bool = False) -> None:
        """The segment ran to its end (no stop, no failure): the engine's termination says how."""
        if termination.kind != "completed":
            await self._fail(RunTermination(termination.kind, termination.reason, termination.item_id))
            return
        # ``complete`` refuses while an item is pending or ingestion is incomplete: the run stays
        # ``running``, and the caller's next segment goes on.
        completed, snap = await self._db.call(self._repo.complete, self._run_id)
        if not completed and snap.status == "running" and seg.progress == 0 and not shared:
            # Defensive: a segment that neither ingested nor recorded anything would loop forever.
            raise RuntimeError(
                f"run {self._run_id!r}: a drive segment made no progress "
                f"({snap.pending} pending, ingestion complete: {snap.ingestion_complete})"
            )

    # --- the three tasks ---------------------------------------------------------

    async def _feed(self, seg: Segment, proc: ParallelBatchProcessor[Any], exhausted: bool) -> None:
        try:
            with seg.feeder_scope:
                # What is pending first, in ingestion order: items an earlier segment ingested
                # and did not record (a crash, a pause, a deadline), then the source's new slices.
                after = 0
                while page := await self._db.call(
                    self._repo.pending, self._run_id, after_ingest_seq=after, limit=_PENDING_PAGE
                ):
                    for pending in page:
                        context = decode_context(pending.context_json)
                        prompt, params = request_of_text(pending.prompt)
                        item = LLMWorkItem(pending.item_id, self._strategy, prompt, context, params)
                        await proc.add_work(item)
                    after = page[-1].ingest_seq
                if not exhausted:
                    assert self._ingestor is not None
                    # A slice is fed only once committed (with the source's checkpoint past it),
                    # so a result is never recorded for an item the run does not hold.
                    await self._ingest_slices(seg, self._ingestor, functools.partial(self._feed_slice, proc))
        except AdmissionClosedError:
            pass  # a stop was requested; what was not fed stays pending
        except ClaimLostError as exc:
            seg.fail(exc, "error")
            seg.request("detached", str(exc))
        except ArtifactStoreError as exc:
            seg.fail(exc, "error")
        except Exception as exc:  # noqa: BLE001 - a bad entry or a failing source fails the run, drained
            seg.fail(exc, "ingestion_failed")
        await proc.finish()

    async def _feed_slice(  # noqa: ASYNC910 - a committed slice is never empty
        self, proc: ParallelBatchProcessor[Any], items: list[IngestedItem]
    ) -> None:
        for item_id, text, context in items:
            prompt, params = request_of_text(text)
            await proc.add_work(LLMWorkItem(item_id, self._strategy, prompt, context, params))

    async def _record(self, seg: Segment, proc: ParallelBatchProcessor[Any], lease: int | None) -> None:
        await anyio.lowlevel.checkpoint()
        group: list[NewResult] = []
        uncalled: list[str] = []  # started under the lease, then ended by a stop before their call
        try:
            async for result in proc.results():
                if result.error_category is ErrorCategory.NOT_EXECUTED and not result.attempts:
                    uncalled.append(result.item_id)
                if (result.error_category not in _NOT_TERMINAL
                        and result.stop_reason is not StopReason.PROVIDER_RETIRED):
                    group.append(encode_new_result(result, self._repo.location,
                                                   replay=self.decode_output))
                # Flushed when full, or as soon as no other result waits: a quiet run records each
                # result at once, so a crash loses (and a resume calls again) as little as it can.
                if group and (len(group) >= _RECORD_GROUP or proc.results_statistics().queued == 0):
                    await self._flush(seg, group, lease)
                    group = []
        except BatchInterruptedError:
            # After request_stop() the workers may drain, and the stream finalize, before the
            # feeder's finish(): the engine then ends the stream "closed before finish()". Every
            # result was delivered before that terminal (CONTRACT C6.3), so for a requested
            # stop it is a clean end. See the report: the engine should not decide that failure.
            if seg.stop is None:
                raise
        if group:
            await self._flush(seg, group, lease)
        if uncalled and lease is not None:
            # Their starts were written, their calls never left: forgotten, so the next driver's
            # call of them is not counted as a repeated one. Once, at the end: they stay leased
            # to this driver until its lease closes, so nobody calls them meanwhile.
            try:
                await self._leased_call(self._repo.unstart_calls, self._run_id, lease, uncalled)
            except LeaseLostError:
                pass  # those items are another driver's now: its start is the first that counts

    async def _flush(self, seg: Segment, group: list[NewResult], lease: int | None) -> None:
        # One transaction marks the items done and gives their results sequences: a crash before
        # it leaves them pending (called again), after it they are never called nor recorded again.
        if lease is None:
            try:
                snapshot = await self._db.call(self._repo.record, self._run_id, group)
            except ClaimLostError as exc:  # another process drives now: stop, the run goes on there
                seg.fail(exc, "error")
                seg.request("detached", str(exc))
                await anyio.lowlevel.checkpoint()
                return
        else:
            try:
                # Fenced by the lease: a driver that was frozen past its lease and wakes cannot
                # record over the driver that leased the items since.
                snapshot = await self._leased_call(self._repo.record, self._run_id, group, lease=lease)
            except LeaseLostError as exc:
                # Our lease expired (we were frozen, or cut off): these items belong to another
                # driver now, and so do the calls still in flight here. Drop them and stop.
                seg.request("detached", str(exc))
                await anyio.lowlevel.checkpoint()
                return
            except ArtifactStoreError as exc:  # the database is unreachable: drive() raises it
                seg.fail(exc, "error")
                seg.request("detached", str(exc))
                await anyio.lowlevel.checkpoint()
                return
        seg.progress += len(group)
        seg.observe(snapshot)

    # --- with leases (many drivers on one run) -------------------------------------

    async def _feed_leased(self, seg: Segment, proc: ParallelBatchProcessor[Any], lease: int,
                           ingest: bool) -> None:
        """Feed the items this driver leases, slice by slice, until none is left to lease now.

        With ``ingest`` the source is ingested alongside (committed slices become pending and
        are leased like any other). Without it, a run whose ingestion is incomplete ends the
        segment once nothing is pending: the next segment tries for the ingestion claim again
        (the ingesting process may have died)."""
        wake = _Wake()
        # A page about the size of the worker pool: the bounded input queue holds the rest back,
        # so this driver holds few leased items ahead of its calls (see _segment_config).
        page_size = max(self._config.workers, 8)
        try:
            # The scope inside the unwrapping: a pause cancels it while add_work() raises, and the
            # ingest task's Cancelled (from this scope, outside the task group) rides in the group
            # beside the AdmissionClosedError until the scope strips it; unwrapped before that, a
            # one-exception group would slip past the except below (CI, once).
            with unwrap_group(), seg.feeder_scope:
                async with anyio.create_task_group() as tg:
                    if ingest:
                        assert self._ingestor is not None
                        ingest_only = functools.partial(self._ingest_only, seg, self._ingestor, wake)
                        tg.start_soon(seg.guarded, ingest_only, name="run ingestion")
                    while True:
                        # Taken before leasing: a slice committed while lease_items runs sets
                        # this event, so the wait below cannot miss it.
                        waiting = wake.event
                        page = await self._leased_call(self._repo.lease_items, self._run_id, lease,
                                                       limit=page_size)
                        seg.leased += len(page)
                        for pending in page:
                            context = decode_context(pending.context_json)
                            await proc.add_work(LLMWorkItem(pending.item_id, self._strategy, pending.prompt,
                                                            context))
                        if page:
                            continue
                        if not ingest or wake.ingestion_over:
                            break
                        await waiting.wait()
                    tg.cancel_scope.cancel("nothing left to lease")
        except AdmissionClosedError:
            pass  # a stop was requested; what was not fed goes back when the lease closes
        except LeaseLostError as exc:
            seg.request("detached", str(exc))
        except ClaimLostError as exc:
            seg.fail(exc, "error")
            seg.request("detached", str(exc))
        except ArtifactStoreError as exc:  # the database is unreachable: raised by drive(), not stored
            seg.fail(exc, "error")
            seg.request("detached", str(exc))
        await proc.finish()

    async def _ingest_only(self, seg: Segment, ingestor: Ingestor, wake: _Wake) -> None:
        """Commit the source slice by slice (each slice pending, for any driver to lease)."""
        try:
            await self._ingest_slices(seg, ingestor, lambda _items: wake.set())
        except ClaimLostError:
            pass  # the claim's new holder ingests: this segment leases what it commits
        except ArtifactStoreError as exc:
            seg.fail(exc, "error")
        except Exception as exc:  # noqa: BLE001 - a bad entry or a failing source fails the run, drained
            seg.fail(exc, "ingestion_failed")
        wake.ingestion_over = True
        wake.set()
        await anyio.lowlevel.checkpoint()

    async def _start_calls(self, lease: int, item_ids: list[str]) -> list[str]:
        return await self._leased_call(self._repo.start_calls, self._run_id, lease, item_ids)

    @staticmethod
    def _lost(seg: Segment, exc: BaseException) -> None:
        """A call start was refused: the lease is dead (or the database unreachable: drive() raises it)."""
        if isinstance(exc, ArtifactStoreError):
            seg.fail(exc, "error")
        seg.request("detached", str(exc))

    async def _heartbeat(self, seg: Segment, lease: int) -> None:
        """Renew the lease every third of its length; a lease found dead stops the segment."""
        assert self.lease_seconds is not None
        # A task of its own, not a step of the feeder or the recorder: a slow call, a full queue
        # or a long record never delays a renewal. A third of the length leaves room for two
        # renewals to be late (a slow database, a busy loop) before the lease expires under
        # work still in flight here.
        while True:
            await anyio.sleep(self.lease_seconds / 3)
            try:
                alive = await self._leased_call(self._repo.renew_lease, self._run_id, lease)
            except ArtifactStoreError as exc:  # the database is unreachable: drive() raises it
                seg.fail(exc, "error")
                alive = False
            if not alive:
                # Expired already: its items may be another driver's, so nothing more is called or
                # recorded under it (the record and the call starts are refused as well).
                seg.request("detached", f"run {self._run_id!r}: lease {lease} could not be renewed")
                return


@final
class _Wake:
    """The feeder's wake-up: set after each ingested slice, and when ingestion is over."""

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.ingestion_over = False

    def set(self) -> None:
        self.event.set()
        self.event = anyio.Event()
