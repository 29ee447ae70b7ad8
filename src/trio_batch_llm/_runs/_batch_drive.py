"""One drive segment of a ``mode="provider-batch"`` run: the provider's Batch API instead of live calls.

Like a live segment (:mod:`._live_drive`) it runs inside ``run.wait()`` while
its process holds the run's claim, with the same ingestion task and status
watcher (:mod:`._segment`). Its body is a loop over the run's stored
*submissions* (one provider batch each), every step of which is a repository
transaction or one Batch API request, so a crash or a cancellation between
any two steps leaves a state the next segment continues from:

1. **recover**: a submission left ``reserved`` (its create was never sent) is
   abandoned, its items go back to pending; one left ``creating`` (the create
   may have been sent) becomes ``unknown``;
2. **resolve**: an ``unknown`` submission is looked up by the metadata its
   create carried; found, it is ``submitted``. Until it is resolved (so, or by
   ``Run.resolve_submission``) the run submits nothing new;
3. **poll** each open batch every ``poll_interval``; once it is terminal,
   download its output and error files and *finish* the submission in one
   transaction: results recorded with their sequences, failed items back to
   pending (retried in a later batch after the retry backoff, within
   ``max_attempts``), its enqueued tokens released;
4. **submit**: chunk pending items into a request file (by count, bytes and
   the scope's free capacity), *reserve* the capacity and the items in one
   transaction (atomic across every run and process on the store), upload,
   record the intent (``creating``), create the batch with the submission id
   as metadata, record ``submitted``;
5. **complete** the run once ingestion is complete and every item has its result.

A pause stops the loop between steps (batches already submitted keep running
at the provider and are collected when the run resumes); a cancel also asks
the provider to cancel the run's open batches. ``wait()``'s deadline cancels
the segment, and the segment's :class:`BatchConnection` starts no request at
or after it.

The provider is reached only through the strategy's :class:`BatchEndpoint`
(``_strategies/_batch.py``); submitting is :mod:`._batch_submit`, settling a
finished batch :mod:`._batch_settle`.
"""

from __future__ import annotations

import functools
import math
from typing import final

import anyio
import anyio.lowlevel

from .._core._deliveries import unwrap_group
from .._strategies._batch import BatchConnection, BatchEndpoint, BatchInfo
from .._values._config import ProcessorConfig
from .._values._errors import DatabaseUnavailableError, ProviderError
from ._batch_config import ProviderBatchConfig
from ._batch_settle import describe_errors, settle
from ._batch_submit import METADATA_KEY, BatchSubmitter, BatchTimers
from ._ingest import Ingestor
from ._schema import LIVE_SUBMISSION_STATES, ClaimLostError, RunSnapshot, RunTermination, SubmissionRecord
from ._segment import DriverBase, Segment
from .repository._client import RepositoryClient

__all__ = ["METADATA_KEY", "BatchSegmentDriver", "capacity_scope_of"]


def capacity_scope_of(endpoint: BatchEndpoint, batch: ProviderBatchConfig) -> str:
    """The enqueued-token scope: ``batch.capacity_scope``, else the endpoint's (never a key)."""
    return batch.capacity_scope if batch.capacity_scope is not None else endpoint.capacity_scope


@final
class BatchSegmentDriver(DriverBase):
    """Runs provider-batch drive segments for one run handle (see the module docstring)."""

    def __init__(
        self,
        *,
        db: RepositoryClient,
        run_id: str,
        endpoint: BatchEndpoint,
        config: ProcessorConfig,
        batch: ProviderBatchConfig,
        ingestor: Ingestor | None,
        poll_interval: float,
    ) -> None:
        super().__init__(db=db, run_id=run_id, config=config, ingestor=ingestor, poll_interval=poll_interval)
        self._endpoint = endpoint
        self._batch = batch
        self.scope = capacity_scope_of(endpoint, batch)
        self._timers = BatchTimers()
        self._submitter = BatchSubmitter(db=db, run_id=run_id, endpoint=endpoint, batch=batch,
                                         retry=config.retry, scope=self.scope, timers=self._timers)
        self._wake = anyio.Event()

    def poke(self) -> None:
        """Wake an idle segment (a new slice, a stop request, an operator's resolution)."""
        self._wake.set()
        self._wake = anyio.Event()

    # --- the segment -------------------------------------------------------------

    async def drive(self, seg: Segment, snap: RunSnapshot, deadline: float) -> None:
        """One segment of a ``running`` run; afterwards the stored status says how it ended."""
        exhausted = snap.checkpoint.exhausted
        await self._prepare_ingestion(snap)
        seg.on_change(self.poke)
        api = self._connect(deadline)
        try:
            with unwrap_group():
                try:
                    async with anyio.create_task_group() as tg:
                        seg.bind(None, tg.cancel_scope)
                        if not exhausted:
                            assert self._ingestor is not None
                            ingest = functools.partial(self._ingest, seg, self._ingestor)
                            tg.start_soon(seg.guarded, ingest, name="run ingestion")
                        tg.start_soon(seg.guarded, self._watch, seg, name="run status watcher")
                        await self._loop(seg, api)
                        tg.cancel_scope.cancel("segment finished")
                finally:
                    seg.raise_interrupt()  # before the close below, as on Trio (CONTRACT C6.4, C7.4)
            if seg.stop == "cancelled":
                await self.cancel_open(api)
        except Exception as exc:  # noqa: BLE001 - _body_raised re-raises all but a lost claim
            await self._body_raised(exc, DatabaseUnavailableError)
            return  # the claim is lost: another process submits now, the run goes on there
        finally:
            await api.aclose()
        await self._tasks_ended(seg, DatabaseUnavailableError)

    async def _ingest(  # noqa: ASYNC910 - a task of the segment: it awaited the source, or failed at once
        self, seg: Segment, ingestor: Ingestor
    ) -> None:
        try:
            await self._ingest_slices(seg, ingestor, lambda _items: self.poke())
        except (ClaimLostError, DatabaseUnavailableError) as exc:  # not the source's fault
            seg.fail(exc, "error")
            seg.request("detached", str(exc))
        except Exception as exc:  # noqa: BLE001 - a bad entry or failing source fails the run
            seg.fail(exc, "ingestion_failed")
        else:
            self.poke()  # ingestion complete: the loop may complete the run

    def _stopping(self, seg: Segment) -> bool:
        return seg.stop is not None or seg.failure is not None

    def _connect(self, deadline: float) -> BatchConnection:
        return self._endpoint.connect(request_timeout=self._batch.request_timeout, start_before=deadline)

    async def _loop(self, seg: Segment, api: BatchConnection) -> None:
        await self._recover()
        while not self._stopping(seg):
            wake = self._wake
            subs = await self._db.call(self._repo.submissions, self._run_id, states=LIVE_SUBMISSION_STATES)
            submitted = {s.submission_id for s in subs if s.state == "submitted"}
            next_poll = self._timers.next_poll
            for sid in [sid for sid in next_poll if sid not in submitted]:
                del next_poll[sid]  # settled meanwhile (by an operator, or another handle)
            # An unknown create may be a live batch holding items and capacity: until it is
            # resolved nothing new is submitted, or those items could run twice.
            unresolved = [s for s in subs if s.state in ("creating", "unknown")]
            for sub in unresolved:
                await self._resolve(api, sub)
            for sub in subs:
                if sub.state == "submitted" and not self._stopping(seg):
                    await self._poll(api, sub)
            snap = await self._snapshot()
            seg.observe(snap)
            if self._stopping(seg):
                return
            budget = self._config.guardrails.max_total_tokens
            over_budget = budget is not None and snap.total_tokens >= budget
            if not unresolved and not over_budget:
                snap = await self._submitter.submit(api, lambda: self._stopping(seg), snap)
            if snap.open_submissions == 0:
                if over_budget:
                    await self._fail(RunTermination("budget_exhausted", f"max_total_tokens={budget} reached"))
                    return
                if snap.ingestion_complete and snap.done == snap.items:
                    completed, _ = await self._db.call(self._repo.complete, self._run_id)
                    if completed:
                        return
            await self._idle(wake)

    async def _idle(self, wake: anyio.Event) -> None:
        """Sleep until the next due poll, retry or lookup, a poke, or one poll interval at most."""
        now = anyio.current_time()
        timers = self._timers
        candidates = [now + self._batch.poll_interval, *timers.next_poll.values()]
        candidates += self._submitter.wake_times(now)
        candidates += [t for t in (timers.next_find, *timers.retry_ready.values()) if t > now]
        with anyio.move_on_at(max(now, min(candidates))):
            await wake.wait()

    # --- steps -------------------------------------------------------------------

    async def _recover(self) -> None:
        # ``reserved``: the intent (``creating``) is written before a create may leave, so this
        # one's create was never sent; abandoning it returns its items and its capacity. A
        # ``creating`` one may have reached the provider: only a lookup (or an operator) can say.
        for sub in await self._db.call(self._repo.submissions, self._run_id, states=frozenset({"reserved"})):
            await self._db.call(
                self._repo.abandon_submission, self._run_id, sub.submission_id, to="abandoned",
                detail="never sent: the process stopped before its create call",
            )
        for sub in await self._db.call(self._repo.submissions, self._run_id, states=frozenset({"creating"})):
            await self._db.call(
                self._repo.update_submission, self._run_id, sub.submission_id,
                from_states=frozenset({"creating"}), to="unknown",
                detail="outcome unknown: the process stopped during its create call",
            )

    async def _resolve(self, api: BatchConnection, sub: SubmissionRecord) -> None:
        now = anyio.current_time()
        if sub.state != "unknown" or now < self._timers.next_find:
            await anyio.lowlevel.checkpoint()
            return
        self._timers.next_find = now + self._batch.poll_interval
        try:
            info = await api.find(METADATA_KEY, sub.submission_id)
        except ProviderError:
            await anyio.lowlevel.checkpoint()
            return  # looked up again after a poll interval
        if info is not None:
            await self._db.call(
                self._repo.update_submission, self._run_id, sub.submission_id,
                from_states=frozenset({"unknown"}), to="submitted", batch_id=info.id,
                detail=f"created: batch {info.id} found by its metadata",
            )
            self._timers.next_poll[sub.submission_id] = now

    async def _poll(self, api: BatchConnection, sub: SubmissionRecord) -> None:
        now = anyio.current_time()
        sid = sub.submission_id
        next_poll = self._timers.next_poll
        if now < next_poll.setdefault(sid, now) or sub.batch_id is None:
            await anyio.lowlevel.checkpoint()
            return
        next_poll[sid] = now + self._batch.poll_interval
        try:
            info = await api.retrieve(sub.batch_id)
        except ProviderError:
            await anyio.lowlevel.checkpoint()
            return  # retrieved again after a poll interval
        if info is None:
            await self._abandon(sid, f"the provider has no batch {sub.batch_id!r}")
        elif info.terminal:
            await self._collect(api, sub, info)

    async def _abandon(self, sid: str, detail: str) -> None:
        await self._db.call(self._repo.abandon_submission, self._run_id, sid, to="abandoned", detail=detail)
        self._timers.next_poll.pop(sid, None)

    async def _collect(self, api: BatchConnection, sub: SubmissionRecord, info: BatchInfo) -> None:
        sid = sub.submission_id
        if info.capacity_refused:
            # Refused for capacity: nothing ran, so no attempt is used up.
            await self._abandon(sid, f"batch {info.id} refused: {describe_errors(info)}")
            self._submitter.refused()
            return
        try:
            files = [await api.download(file_id) for file_id in info.result_files]
        except ProviderError:
            await anyio.lowlevel.checkpoint()
            return  # downloaded again at the next poll
        # Downloaded before anything is written: a crash or a failed download leaves the submission
        # ``submitted``: the next poll finds the batch terminal and downloads its files again.
        items = await self._db.call(self._repo.submission_items, self._run_id, sid)
        # Decoding and encoding tens of thousands of lines would stall the event loop: a worker
        # thread does it while this task waits.
        settled = await anyio.to_thread.run_sync(functools.partial(
            settle, self._endpoint, info, files, items, retry=self._config.retry, now=anyio.current_time(),
            location=self._repo.location,
        ))
        if settled.answered:
            self._submitter.answered()
        # One transaction settles the whole batch (results with their sequences, retries and unrun
        # items back to pending, its enqueued tokens released): a crash leaves it settled or not at
        # all, never results recorded while their items still count as in a batch. The timers
        # after it are memory only: lost in a crash, a retry is simply tried at once.
        await self._db.call(self._repo.finish_submission, self._run_id, sid, settled.results, settled.retry,
                            detail=f"batch {info.id} {info.status}", unrun_item_ids=settled.unrun)
        self._timers.next_poll.pop(sid, None)
        retry_ready = self._timers.retry_ready
        for item_id in settled.unrun:
            retry_ready.pop(item_id, None)  # expired or cancelled before it ran: ready at once
        retry_ready.update(settled.retry_at)
        for result in settled.results:
            retry_ready.pop(result.item_id, None)

    # --- cancel ------------------------------------------------------------------

    async def cancel_open(self, api: BatchConnection | None = None) -> None:
        """Ask the provider to cancel the run's open batches (best effort, bounded) and release them."""
        connection = api if api is not None else self._connect(math.inf)
        try:
            subs = await self._db.call(self._repo.submissions, self._run_id, states=LIVE_SUBMISSION_STATES)
            for sub in subs:
                batch_id = sub.batch_id
                with anyio.move_on_after(self._batch.request_timeout):
                    try:
                        if batch_id is None and sub.state in ("creating", "unknown"):
                            found = await connection.find(METADATA_KEY, sub.submission_id)
                            batch_id = found.id if found is not None else None
                        if batch_id is not None:
                            await connection.cancel(batch_id)
                    except ProviderError:
                        pass  # best effort: the run is cancelled either way
                # Marked cancelled whatever the provider said: the run is over either way, and a
                # batch that still finishes there is never collected.
                await self._db.call(self._repo.abandon_submission, self._run_id, sub.submission_id,
                                    to="cancelled", detail="the run was cancelled")
        finally:
            if api is None:
                await connection.aclose()
