"""One drive segment of a ``mode="provider-batch"`` run: the provider's Batch API instead of live calls.

Like a live segment (:mod:`._drive`) it runs inside ``run.wait()`` while its
process holds the run's claim, with the same ingestion task and status
watcher. Its body is a loop over the run's stored *submissions* (one provider
batch each), every step of which is a repository transaction or one Batch
API request, so a crash or a cancellation between any two steps leaves a
state the next segment continues from:

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
the segment; :class:`BatchEndpoint` starts no request at or after it.
"""

from __future__ import annotations

import math
import random
import uuid
from typing import Any, Final, cast, final

import anyio
import anyio.lowlevel

from .._core._deliveries import unwrap_group
from .._strategies.openai._batch_api import BatchEndpoint, BatchInfo, SendMark, create_outcome_unknown
from .._strategies.openai._batch_lines import (
    LineOutcome,
    estimate_input_tokens,
    parse_result_files,
    request_line,
)
from .._strategies.openai._compatible import _EndpointStrategy
from .._strategies.openai._wire import Api, prompt_text_of_request
from .._values._categories import ErrorCategory
from .._values._config import ProcessorConfig
from .._values._errors import ProviderError
from .._values._results import WorkItemResult
from .._values._urls import redact_url
from ._batch_config import ProviderBatchConfig
from ._drive import DriverBase, Segment, encode_new_result
from ._ingest import Ingestor, decode_context
from ._schema import (
    LIVE_SUBMISSION_STATES,
    NewResult,
    NewSubmission,
    PendingItem,
    RunSnapshot,
    RunTermination,
    SubmissionRecord,
)
from .repository._client import RepositoryClient

__all__ = ["METADATA_KEY", "BatchSegmentDriver", "capacity_scope_of"]

METADATA_KEY: Final = "trio_batch_llm_submission"
"""The batch metadata key carrying the submission id: how an unknown create is found again."""
_PENDING_PAGE: Final = 512
_TOKEN_LIMIT_CODES: Final = frozenset({"token_limit_exceeded"})
_SETTLE_SECONDS: Final = 60.0


def capacity_scope_of(strategy: _EndpointStrategy, batch: ProviderBatchConfig) -> str:
    """The enqueued-token scope: one model behind one endpoint and key (never the key itself)."""
    if batch.capacity_scope is not None:
        return batch.capacity_scope
    secret = strategy.secret
    return f"batch|{redact_url(strategy.base_url)}|{secret.fingerprint() if secret else '-'}|{strategy.model}"


@final
class BatchSegmentDriver(DriverBase):
    """Runs provider-batch drive segments for one run handle (see the module docstring)."""

    def __init__(
        self,
        *,
        db: RepositoryClient,
        run_id: str,
        strategy: _EndpointStrategy,
        config: ProcessorConfig,
        batch: ProviderBatchConfig,
        ingestor: Ingestor | None,
        poll_interval: float,
    ) -> None:
        super().__init__(db=db, run_id=run_id, config=config, ingestor=ingestor, poll_interval=poll_interval)
        self._strategy = strategy
        self._batch = batch
        self.scope = capacity_scope_of(strategy, batch)
        self._estimate = batch.token_estimator or estimate_input_tokens
        self._rng = random.Random(config.retry.jitter_seed)  # for the scope's refusal backoff
        # In memory, per handle: after a restart a retry or a refused scope is simply tried at once.
        self._retry_ready: dict[str, float] = {}
        self._next_poll: dict[str, float] = {}
        self._next_find = -math.inf
        self._submit_ready = -math.inf
        self._refusals = 0
        self._partial_since: float | None = None
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
        api = BatchEndpoint(self._strategy, request_timeout=self._batch.request_timeout, deadline=deadline)
        try:
            with unwrap_group():
                async with anyio.create_task_group() as tg:
                    seg.bind(None, tg.cancel_scope)
                    if not exhausted:
                        assert self._ingestor is not None
                        tg.start_soon(self._ingest, seg, self._ingestor, name="run ingestion")
                    tg.start_soon(self._watch, seg, name="run status watcher")
                    await self._loop(seg, api)
                    tg.cancel_scope.cancel("segment finished")
            if seg.stop == "cancelled":
                await self.cancel_open(api)
        except Exception as exc:
            await self._fail(RunTermination("error", f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            await api.aclose()
        if seg.stop is None and seg.failure is not None:
            await self._fail(RunTermination(seg.failure_kind, f"{type(seg.failure).__name__}: {seg.failure}"))
            raise seg.failure

    async def _ingest(self, seg: Segment, ingestor: Ingestor) -> None:
        with unwrap_group():
            async with anyio.create_task_group() as tg:
                tg.start_soon(ingestor.read_ahead, name="run source reader")
                try:
                    while (items := await ingestor.next_slice()) is not None:
                        seg.progress += len(items)
                        self.poke()
                    self.poke()  # ingestion complete: the loop may complete the run
                except Exception as exc:  # noqa: BLE001 - a bad entry or failing source fails the run
                    seg.fail(exc, "ingestion_failed")
                finally:
                    tg.cancel_scope.cancel("ingestion stopped")

    def _stopping(self, seg: Segment) -> bool:
        return seg.stop is not None or seg.failure is not None

    async def _loop(self, seg: Segment, api: BatchEndpoint) -> None:
        await self._recover()
        while not self._stopping(seg):
            wake = self._wake
            subs = await self._db.call(self._repo.submissions, self._run_id, states=LIVE_SUBMISSION_STATES)
            submitted = {s.submission_id for s in subs if s.state == "submitted"}
            for sid in [sid for sid in self._next_poll if sid not in submitted]:
                del self._next_poll[sid]  # settled meanwhile (by an operator, or another handle)
            unresolved = [s for s in subs if s.state in ("creating", "unknown")]
            for sub in unresolved:
                await self._resolve(api, sub)
            for sub in subs:
                if sub.state == "submitted" and not self._stopping(seg):
                    await self._poll(api, sub)
            snap = await self._db.call(self._repo.snapshot, self._run_id)
            seg.observe(snap)
            if self._stopping(seg):
                return
            budget = self._config.guardrails.max_total_tokens
            over_budget = budget is not None and snap.total_tokens >= budget
            if not unresolved and not over_budget:
                snap = await self._submit(api, seg, snap)
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
        candidates = [now + self._batch.poll_interval, *self._next_poll.values()]
        candidates += [t for t in (self._next_find, self._submit_ready) if t > now]
        if self._partial_since is not None:
            candidates.append(self._partial_since + self._batch.poll_interval)
        candidates += [t for t in self._retry_ready.values() if t > now]
        with anyio.move_on_at(max(now, min(candidates))):
            await wake.wait()

    # --- steps -------------------------------------------------------------------

    async def _recover(self) -> None:
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

    async def _resolve(self, api: BatchEndpoint, sub: SubmissionRecord) -> None:
        now = anyio.current_time()
        if sub.state != "unknown" or now < self._next_find:
            await anyio.lowlevel.checkpoint()
            return
        self._next_find = now + self._batch.poll_interval
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
            self._next_poll[sub.submission_id] = now

    async def _poll(self, api: BatchEndpoint, sub: SubmissionRecord) -> None:
        now = anyio.current_time()
        sid = sub.submission_id
        if now < self._next_poll.setdefault(sid, now) or sub.batch_id is None:
            await anyio.lowlevel.checkpoint()
            return
        self._next_poll[sid] = now + self._batch.poll_interval
        try:
            info = await api.retrieve(sub.batch_id)
        except ProviderError as exc:
            if exc.status_code == 404:
                await self._abandon(sid, f"the provider has no batch {sub.batch_id!r}: {exc}")
            else:
                await anyio.lowlevel.checkpoint()
            return
        if info.terminal:
            await self._collect(api, sub, info)

    async def _abandon(self, sid: str, detail: str) -> None:
        await self._db.call(self._repo.abandon_submission, self._run_id, sid, to="abandoned", detail=detail)
        self._next_poll.pop(sid, None)

    def _jitter(self, item_id: str, attempt: int) -> random.Random | None:
        """Per item and attempt, as live retries draw it: independent of the order results arrive in."""
        seed = self._config.retry.jitter_seed
        return None if seed is None else random.Random(f"{seed}\0{item_id}\0{attempt}")

    def _refused(self) -> None:
        """The provider refused a batch: back off submitting (the retry backoff, per refusal in a row)."""
        wait = self._config.retry.wait_before_retry(self._refusals, None, self._rng)
        self._refusals += 1
        self._submit_ready = anyio.current_time() + wait

    async def _collect(self, api: BatchEndpoint, sub: SubmissionRecord, info: BatchInfo) -> None:
        sid = sub.submission_id
        if info.status == "failed" and info.error_codes & _TOKEN_LIMIT_CODES:
            # Refused for capacity: nothing ran, so no attempt is used up.
            await self._abandon(sid, f"batch {info.id} refused: {_describe_errors(info)}")
            self._refused()
            return
        try:
            files = [await api.download(fid) for fid in (info.output_file_id, info.error_file_id) if fid]
        except ProviderError:
            await anyio.lowlevel.checkpoint()
            return  # downloaded again at the next poll
        items = await self._db.call(self._repo.submission_items, self._run_id, sid)
        # Parsing and encoding tens of thousands of lines would stall the event loop: a worker thread
        # does it while this task waits (nothing else touches the retry bookkeeping meanwhile).
        results, retry, unrun = await anyio.to_thread.run_sync(
            self._settle, api.api, files, items, info, anyio.current_time()
        )
        await self._db.call(self._repo.finish_submission, self._run_id, sid, results, retry,
                            detail=f"batch {info.id} {info.status}", unrun_item_ids=unrun)
        self._next_poll.pop(sid, None)
        for item_id in (r.item_id for r in results):
            self._retry_ready.pop(item_id, None)

    def _settle(
        self, api: Api, files: list[bytes], items: list[PendingItem], info: BatchInfo, now: float
    ) -> tuple[list[NewResult], list[str], list[str]]:
        """Each item's fate from the provider's files: a result, a retry (an attempt used) or unrun."""
        outcomes = parse_result_files(api, files)
        results: list[NewResult] = []
        retry: list[str] = []
        unrun: list[str] = []
        for line, item in enumerate(items, start=1):
            invalid = info.error_lines.get(line)
            if invalid is not None:
                # The file is written in ingestion order, as submission_items() lists it.
                rejected = ProviderError(f"batch {info.id} rejected its line {line}: {invalid}",
                                         category=ErrorCategory.INVALID_REQUEST)
                results.append(self._failure(item, rejected, info))
                continue
            outcome = outcomes.get(item.item_id)
            if outcome is not None and outcome.success:
                results.append(self._result(item, outcome, info))
                self._refusals = 0
                continue
            error = outcome.error if outcome is not None else None
            if error is None:
                error = ProviderError(
                    f"batch {info.id} ended {info.status} without an answer for this item"
                    + (f" ({_describe_errors(info)})" if info.errors else ""),
                    category=ErrorCategory.SERVER,
                )
            attempts = item.attempts + 1
            if outcome is not None and not outcome.executed:
                unrun.append(item.item_id)  # expired or cancelled before it ran: no attempt used
                self._retry_ready.pop(item.item_id, None)
            elif error.category.retryable and attempts < self._config.retry.max_attempts:
                retry.append(item.item_id)
                wait = self._config.retry.wait_before_retry(item.attempts, error.retry_after,
                                                            self._jitter(item.item_id, attempts))
                self._retry_ready[item.item_id] = now + wait
            else:
                results.append(self._failure(item, error, info, outcome))
        return results, retry, unrun

    def _result(self, item: PendingItem, outcome: LineOutcome, info: BatchInfo) -> NewResult:
        usage = cast("dict[str, int]", dict(outcome.usage or {}))
        metadata = {**outcome.metadata, "batch_id": info.id}
        result = WorkItemResult[Any](
            item_id=item.item_id, success=True, output=outcome.text, attempts=item.attempts + 1,
            token_usage=usage, context=decode_context(item.context_json), metadata=metadata,
        )
        return encode_new_result(result, self._repo.location)

    def _failure(self, item: PendingItem, error: ProviderError, info: BatchInfo | None,
                 outcome: LineOutcome | None = None) -> NewResult:
        metadata: dict[str, Any] = dict(outcome.metadata) if outcome is not None else {}
        if info is not None:
            metadata["batch_id"] = info.id
        result = WorkItemResult[Any](
            item_id=item.item_id, success=False, error=f"{type(error).__name__}: {error}",
            error_category=error.category, attempts=item.attempts + (1 if info is not None else 0),
            context=decode_context(item.context_json), metadata=metadata,
        )
        return encode_new_result(result, self._repo.location)

    async def _submit(self, api: BatchEndpoint, seg: Segment, snap: RunSnapshot) -> RunSnapshot:
        """Submit batches while there are eligible items, room and open-batch slots; the snapshot after."""
        open_batches = snap.open_submissions
        while (
            not self._stopping(seg)
            and open_batches < self._batch.max_open_batches
            and anyio.current_time() >= self._submit_ready
        ):
            chunk = await self._next_chunk(api)
            if chunk is None:
                break
            items, content, tokens, full = chunk
            if not full and not snap.ingestion_complete:
                # While a source is still being read, wait up to a poll interval for a fuller file.
                now = anyio.current_time()
                if self._partial_since is None:
                    self._partial_since = now
                if now < self._partial_since + self._batch.poll_interval:
                    break
            self._partial_since = None
            if not await self._send_batch(api, items, content, tokens):
                break
            open_batches += 1
        return await self._db.call(self._repo.snapshot, self._run_id)

    async def _next_chunk(self, api: BatchEndpoint) -> tuple[list[str], bytes, int, bool] | None:
        """The next request file: item ids, content, estimated tokens, and whether a limit filled it."""
        await anyio.lowlevel.checkpoint()
        limit = self._batch.enqueued_token_limit
        room = math.inf
        if limit is not None:
            room = limit - await self._db.call(self._repo.held_tokens, self.scope)
        ids: list[str] = []
        lines: list[bytes] = []
        size = tokens = 0
        too_big: list[NewResult] = []
        now = anyio.current_time()
        after = 0
        full = False
        while not full and (page := await self._db.call(
            self._repo.pending, self._run_id, after_ingest_seq=after, limit=_PENDING_PAGE
        )):
            after = page[-1].ingest_seq
            ready = [item for item in page if self._retry_ready.get(item.item_id, -math.inf) <= now]
            # JSON for a page of lines is CPU work: a worker thread does it (a file may hold 50,000).
            encoded = await anyio.to_thread.run_sync(self._encode_lines, api.api, api.endpoint, ready)
            for item, line, need in encoded:
                refusal = self._oversized(len(line), need)
                if refusal is not None:
                    too_big.append(self._failure(item, refusal, None))
                    continue
                if (len(ids) >= self._batch.max_requests_per_batch
                        or size + len(line) > self._batch.max_file_bytes or tokens + need > room):
                    full = True
                    break
                ids.append(item.item_id)
                lines.append(line)
                size += len(line)
                tokens += need
        if too_big:
            await self._db.call(self._repo.record, self._run_id, too_big)
        if not ids:
            return None
        return ids, b"".join(lines), tokens, full

    def _encode_lines(
        self, api: Api, endpoint: str, items: list[PendingItem]
    ) -> list[tuple[PendingItem, bytes, int]]:
        """Each item's request line and estimated enqueued tokens."""
        encoded = []
        for item in items:
            body = self._strategy.request_body(item.prompt)
            need = self._estimate(prompt_text_of_request(api, body) or item.prompt)
            encoded.append((item, request_line(item.item_id, endpoint, body), need))
        return encoded

    def _oversized(self, size: int, tokens: int) -> ProviderError | None:
        if size > self._batch.max_file_bytes:
            return ProviderError(f"its request line has {size} bytes, over max_file_bytes="
                                 f"{self._batch.max_file_bytes}", category=ErrorCategory.INVALID_REQUEST)
        limit = self._batch.enqueued_token_limit
        if limit is not None and tokens > limit:
            return ProviderError(
                f"it needs about {tokens} enqueued tokens, over enqueued_token_limit={limit}",
                category=ErrorCategory.INVALID_REQUEST,
            )
        return None

    async def _send_batch(self, api: BatchEndpoint, ids: list[str], content: bytes, tokens: int) -> bool:
        """Reserve, upload, create; ``False`` when submitting should pause (refused, unknown, no room)."""
        sid = uuid.uuid4().hex
        submission = NewSubmission(submission_id=sid, scope=self.scope, item_ids=tuple(ids), tokens=tokens)
        reserved = await self._db.call(self._repo.reserve_submission, self._run_id, submission,
                                       capacity_limit=self._batch.enqueued_token_limit)
        if not reserved:
            return False  # another run took the room first: look again after a poll interval
        try:
            file_id = await api.upload(f"{self._run_id}-{sid}.jsonl", content)
        except ProviderError as exc:
            await self._abandon(sid, f"upload failed: {exc}")
            self._refused()
            return False
        await self._db.call(self._repo.update_submission, self._run_id, sid,
                            from_states=frozenset({"reserved"}), to="creating", input_file_id=file_id)
        sending = SendMark()
        try:
            info = await api.create(file_id, completion_window=self._batch.completion_window,
                                    metadata={METADATA_KEY: sid, "run_id": self._run_id[:512]},
                                    sending=sending)
        except ProviderError as exc:  # the request was sent: an answer, or none
            if create_outcome_unknown(exc):
                await self._db.call(
                    self._repo.update_submission, self._run_id, sid, from_states=frozenset({"creating"}),
                    to="unknown", detail=f"create outcome unknown: {exc}",
                )
                self._next_find = anyio.current_time() + self._batch.poll_interval
            else:
                await self._abandon(sid, f"create refused: {exc}")
                self._refused()
            return False
        except BaseException:
            if not sending.sent:
                # Stopped (wait()'s deadline, a pause or a close) before the request could leave:
                # nothing was created, so the intent must not wait for an operator. Bounded: one
                # repository transaction (SQLite's busy timeout), shielded from the stop itself.
                with anyio.CancelScope(shield=True), anyio.move_on_after(_SETTLE_SECONDS):
                    await self._abandon(sid, "never sent: stopped before its create call")
            raise
        await self._db.call(self._repo.update_submission, self._run_id, sid,
                            from_states=frozenset({"creating"}), to="submitted", batch_id=info.id)
        self._next_poll[sid] = anyio.current_time() + self._batch.poll_interval
        return True

    # --- cancel ------------------------------------------------------------------

    async def cancel_open(self, api: BatchEndpoint | None = None) -> None:
        """Ask the provider to cancel the run's open batches (best effort, bounded) and release them."""
        own = api is None
        endpoint = api or BatchEndpoint(self._strategy, request_timeout=self._batch.request_timeout,
                                        deadline=math.inf)
        try:
            subs = await self._db.call(self._repo.submissions, self._run_id, states=LIVE_SUBMISSION_STATES)
            for sub in subs:
                batch_id = sub.batch_id
                with anyio.move_on_after(self._batch.request_timeout):
                    try:
                        if batch_id is None and sub.state in ("creating", "unknown"):
                            found = await endpoint.find(METADATA_KEY, sub.submission_id)
                            batch_id = found.id if found is not None else None
                        if batch_id is not None:
                            await endpoint.cancel(batch_id)
                    except ProviderError:
                        pass  # best effort: the run is cancelled either way
                await self._db.call(self._repo.abandon_submission, self._run_id, sub.submission_id,
                                    to="cancelled", detail="the run was cancelled")
        finally:
            if own:
                await endpoint.aclose()


def _describe_errors(info: BatchInfo) -> str:
    return "; ".join(f"{code}: {message}" for code, message in info.errors) or info.status
