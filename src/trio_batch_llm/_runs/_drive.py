"""One *drive segment* of a live run: a streaming ParallelBatchProcessor fed from the run.

Over 400 lines because one segment has two feeders (alone, and beside other drivers under a
lease) that share its recorder, watcher and stop handling; split apart they would drift.

A segment runs while its process holds the run's claim, inside the caller's
``wait()`` (which owns every task here). Three tasks:

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
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal, ParamSpec, TypeVar, final

import anyio
import anyio.lowlevel

from .._artifacts._codec import OutputCodec, unstorable_failure
from .._artifacts._protocol import encode_result
from .._backends import leaves_the_loop
from .._core._deliveries import unwrap_group
from .._engine._processor import ParallelBatchProcessor
from .._strategies._base import LLMCallStrategy
from .._values._categories import ErrorCategory
from .._values._config import ProcessorConfig
from .._values._errors import (
    AdmissionClosedError,
    ArtifactEncodeError,
    ArtifactStoreError,
    BatchInterruptedError,
    DatabaseUnavailableError,
)
from .._values._requests import LLMWorkItem, request_of_text
from .._values._results import BatchTermination, WorkItemResult
from .._values._stop_reasons import StopReason
from ._ingest import Ingestor, decode_context
from ._schema import ClaimLostError, LeaseLostError, NewResult, RunSnapshot, RunSourceError, RunTermination
from ._starts import CallStarts
from .repository._client import RepositoryClient

__all__ = ["DriverBase", "Segment", "SegmentDriver", "deadline_after", "encode_new_result", "only_of"]

# Results the engine gives items it stopped: not the item's outcome, so it stays pending. So does
# the item whose answer stopped the batch (a per-day quota, a spend limit: stop_reason PROVIDER_RETIRED).
_NOT_TERMINAL: Final = frozenset({ErrorCategory.NOT_EXECUTED, ErrorCategory.ABORTED, ErrorCategory.BUDGET})
_PENDING_PAGE: Final = 512
_RECORD_GROUP: Final = 256
# The artifact stores' rule for outputs (open_run takes no codec, so a refusal names none).
_OUTPUTS: Final = OutputCodec(codec_option=False)

StopKind = Literal["paused", "cancelled", "detached"]
P = ParamSpec("P")
R = TypeVar("R")


@final
class Segment:
    """The control surface of one drive: stop requests arrive here, from this process or the watcher."""

    def __init__(self) -> None:
        self.ended = anyio.Event()
        self.stop: StopKind | None = None
        self.stop_reason = ""
        self.failure: BaseException | None = None
        self.failure_kind = "error"
        self.progress = 0
        self.leased = 0  # items this segment leased (many drivers per run)
        self._listeners: list[Callable[[], None]] = []
        self._proc: ParallelBatchProcessor[Any] | None = None
        self._scope: anyio.CancelScope | None = None
        self.feeder_scope = anyio.CancelScope()
        self._interrupt: BaseException | None = None  # see guarded()

    def request(self, kind: StopKind, reason: str) -> None:
        # A cancel or detach overrides a pause (it is stronger); nothing overrides them.
        if self.stop is not None and (self.stop != "paused" or kind == "paused"):
            return
        self.stop, self.stop_reason = kind, reason
        self._apply()
        self._tell()

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every stop request or failure (a driver waiting idle wakes)."""
        self._listeners.append(listener)

    def _tell(self) -> None:
        for listener in self._listeners:
            listener()

    def bind(self, proc: ParallelBatchProcessor[Any] | None, scope: anyio.CancelScope) -> None:
        self._proc, self._scope = proc, scope
        self._apply()

    def _apply(self) -> None:
        if self.stop is None:
            return
        if self._proc is not None:
            why = StopReason.PAUSE if self.stop == "paused" else StopReason.SHUTDOWN
            self._proc.request_stop(self.stop_reason, stop_reason=why)
        # The feeder stops reading and calls finish() at once, so the stream ends as finished.
        self.feeder_scope.cancel(self.stop_reason)
        if self.stop != "paused" and self._scope is not None:
            self._scope.cancel(self.stop_reason)

    async def guarded(  # noqa: ASYNC910 - fn() ran on every path (a held interrupt ends it)
        self, fn: Callable[..., Awaitable[object]], *args: object
    ) -> None:
        """Run ``fn(*args)`` as a task of this segment (every task of a segment runs so).

        A Ctrl+C or ``sys.exit()`` raised in it (the run's source, a hook) would, on asyncio,
        leave the event loop itself instead of this task (:func:`leaves_the_loop`): it is held
        here and the segment cancelled, as Trio's task group does with it; the driver
        re-raises it, with its type, after the ordered close (:meth:`raise_interrupt`).
        """
        try:
            await fn(*args)
        except (KeyboardInterrupt, SystemExit) as exc:
            if not leaves_the_loop(exc):
                raise
            if self._interrupt is None:
                self._interrupt = exc
            assert self._scope is not None  # bound before any task starts
            self._scope.cancel("interrupted")

    def raise_interrupt(self) -> None:
        """Re-raise what :meth:`guarded` held (asyncio), once the segment's task group is left."""
        interrupt, self._interrupt = self._interrupt, None
        if interrupt is not None:
            raise interrupt

    def fail(self, exc: BaseException, kind: str) -> None:
        """Ingestion failed: what was fed still runs; the driver raises ``exc`` once it has."""
        if self.failure is None:
            self.failure, self.failure_kind = exc, kind
        self._tell()

    def observe(self, snapshot: RunSnapshot) -> None:
        """React to the stored status (changed by another handle or process)."""
        if snapshot.status == "paused":
            self.request("paused", "paused from another handle")
        elif snapshot.status == "cancelled":
            self.request("cancelled", "cancelled from another handle")


class DriverBase:
    """What the live and the provider-batch drivers share: the run, its ingestion, its status."""

    def __init__(
        self,
        *,
        db: RepositoryClient,
        run_id: str,
        config: ProcessorConfig,
        ingestor: Ingestor | None,
        poll_interval: float,
    ) -> None:
        self._db = db
        self._repo = db.repository
        self._run_id = run_id
        self._config = config
        self._ingestor = ingestor
        self._poll_interval = poll_interval

    async def _prepare_ingestion(self, snap: RunSnapshot) -> None:
        """Line the source up with the stored checkpoint, if ingestion is not complete."""
        if snap.checkpoint.exhausted:
            await anyio.lowlevel.checkpoint()
            return
        if self._ingestor is None:
            raise RunSourceError(
                f"run {self._run_id!r}: its ingestion is incomplete (at entry "
                f"{snap.checkpoint.position}) and this handle was opened without a source"
            )
        await self._ingestor.prepare(snap.checkpoint)

    async def _fail(self, termination: RunTermination) -> None:
        await self._db.call(
            self._repo.transition, self._run_id, from_statuses=frozenset({"running"}), to="failed",
            termination=termination,
        )

    async def _watch(self, seg: Segment, *, leased: bool = False) -> None:
        """Poll the stored status, so a pause or cancel from another process reaches this segment."""
        while True:
            await anyio.sleep(self._poll_interval)
            seg.observe(await (self._leased_call if leased else self._db.call)(self._repo.snapshot,
                                                                                self._run_id))

    async def _leased_call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """A repository call of a driver under a lease. A :class:`ClaimLostError` is raised before
        anything ran, and a lease's work does not need the claim (only ingesting does, and the
        repository keeps refusing that): the call is made again."""
        try:
            return await self._db.call(fn, *args, **kwargs)
        except ClaimLostError:
            return await self._db.call(fn, *args, **kwargs)


@final
class SegmentDriver(DriverBase):
    """Runs live drive segments for one run handle."""

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
        try:
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
        except Exception as exc:
            if only_of(exc, ClaimLostError) is not None:
                await anyio.lowlevel.checkpoint()
                return  # another process holds the claim now: this segment is over, the run is not
            lost = only_of(exc, DatabaseUnavailableError if lease is None else ArtifactStoreError)
            if lost is not None:
                # This driver lost the database (down past the bound, cut off; with leases any
                # database error). The run is not failed: other drivers go on, and wait() may be
                # called again.
                raise lost from None if lost is not exc else exc.__cause__
            await self._fail(RunTermination("error", f"{type(exc).__name__}: {exc}"))
            raise
        if isinstance(seg.failure, ClaimLostError):
            await anyio.lowlevel.checkpoint()
            return
        if isinstance(seg.failure, DatabaseUnavailableError) or (
                lease is not None and isinstance(seg.failure, ArtifactStoreError)):
            raise seg.failure
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
        if seg.stop is not None:
            await anyio.lowlevel.checkpoint()
            return  # paused or cancelled: the status was stored by whoever asked
        if seg.failure is not None:
            await self._fail(RunTermination(seg.failure_kind, f"{type(seg.failure).__name__}: {seg.failure}"))
            raise seg.failure
        if termination.kind != "completed":
            await self._fail(RunTermination(termination.kind, termination.reason, termination.item_id))
            return
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
                    await self._ingest(seg, proc, self._ingestor)
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

    async def _ingest(self, seg: Segment, proc: ParallelBatchProcessor[Any], ingestor: Ingestor) -> None:
        with unwrap_group():
            async with anyio.create_task_group() as tg:
                tg.start_soon(seg.guarded, ingestor.read_ahead, name="run source reader")
                try:
                    while (items := await ingestor.next_slice()) is not None:
                        seg.progress += len(items)
                        for item_id, text, context in items:
                            prompt, params = request_of_text(text)
                            await proc.add_work(LLMWorkItem(item_id, self._strategy, prompt, context, params))
                finally:
                    tg.cancel_scope.cancel("ingestion stopped")

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
            try:
                await self._leased_call(self._repo.unstart_calls, self._run_id, lease, uncalled)
            except LeaseLostError:
                pass  # those items are another driver's now: its start is the first that counts

    async def _flush(self, seg: Segment, group: list[NewResult], lease: int | None) -> None:
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
            with unwrap_group():
                async with anyio.create_task_group() as tg:
                    tg.start_soon(seg.guarded, ingestor.read_ahead, name="run source reader")
                    try:
                        while (items := await ingestor.next_slice()) is not None:
                            seg.progress += len(items)
                            wake.set()
                    finally:
                        tg.cancel_scope.cancel("ingestion stopped")
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
        while True:
            await anyio.sleep(self.lease_seconds / 3)
            try:
                alive = await self._leased_call(self._repo.renew_lease, self._run_id, lease)
            except ArtifactStoreError as exc:  # the database is unreachable: drive() raises it
                seg.fail(exc, "error")
                alive = False
            if not alive:
                seg.request("detached", f"run {self._run_id!r}: lease {lease} could not be renewed")
                return


def only_of(exc: Exception, kind: type[ArtifactStoreError]) -> ArtifactStoreError | None:
    """``exc`` if it (or every exception of its group) is a ``kind``: the first one."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, ExceptionGroup):
        matched, rest = exc.split(kind)
        if matched is not None and rest is None:
            first = matched.exceptions[0]
            return only_of(first, kind) if isinstance(first, Exception) else None
    return None


@final
class _Wake:
    """The feeder's wake-up: set after each ingested slice, and when ingestion is over."""

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.ingestion_over = False

    def set(self) -> None:
        self.event.set()
        self.event = anyio.Event()


def encode_new_result(
    result: WorkItemResult[Any], location: str, *, replay: Callable[[Any], Any] | None = None
) -> NewResult:
    """What the repository stores of a terminal result.

    The output is kept by the artifact stores' rule (``_codec.py``): plain JSON,
    or a pydantic model that ``replay`` (the strategy's ``decode_output``, which
    :meth:`Run.read_results` applies) gives back as itself. Any other output (a
    tuple, a dataclass, a model without ``response_model=``, ``NaN``) would be
    read back changed: the item becomes a ``PARSE`` failure, stored instead,
    and the run goes on.
    """
    try:
        output = _OUTPUTS.encode(result.output, replay=replay)
        text = encode_result(result, lambda payload: payload, output=output).decode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        error = ArtifactEncodeError(
            f"{location}: the result of item {result.item_id!r} cannot be stored: {exc}"
        )
        error.__cause__ = exc
        result = unstorable_failure(result, error)
        text = encode_result(result, lambda payload: payload).decode("utf-8")
    usage = result.token_usage
    inp, out = usage.get("input_tokens", 0), usage.get("output_tokens", 0)
    return NewResult(
        item_id=result.item_id,
        success=result.success,
        error_category=result.error_category.value if result.error_category else None,
        result_json=text,
        input_tokens=inp,
        output_tokens=out,
        total_tokens=usage.get("total_tokens", inp + out),
    )


def deadline_after(timeout: float | None) -> float:
    if timeout is None:
        return math.inf
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise ValueError(f"timeout={timeout!r}: must be a number >= 0, or None")
    return anyio.current_time() + timeout
