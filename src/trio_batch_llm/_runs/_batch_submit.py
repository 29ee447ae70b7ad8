"""Submitting provider batches: pending items into request files, and each file through the intent protocol.

:meth:`BatchSubmitter.submit` is step 4 of a batch drive segment (see
:mod:`._batch_drive`). It chunks pending items into a request file, by count
(``max_requests_per_batch``), bytes (``max_file_bytes``, or the endpoint's own
``max_file_bytes`` when smaller) and the scope's free
enqueued-token capacity; an item that could never fit one file fails at once,
without a batch. Each file then goes through steps that each leave a state
the next segment continues from:

1. *reserve* the capacity and the items in one transaction (atomic across
   every run and process on the store): the submission is ``reserved``;
2. upload the file;
3. record the intent, ``creating``, *before* the create call may leave;
4. create the batch with the submission id as metadata (how an unknown
   outcome is found again), and record ``submitted``.

A failure before the create was sent abandons the submission (its items go
back to pending); a create whose outcome is unknown (no answer, an answer we
could not read, a server error after the work) leaves it ``unknown``, and the
run submits nothing new until it is resolved. A refusal backs submitting off
(the retry backoff, per refusal in a row).
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, final

import anyio
import anyio.lowlevel

from .._strategies._batch import BatchConnection, BatchEndpoint, SendMark
from .._values._categories import ErrorCategory
from .._values._config import RetryConfig
from .._values._errors import ProviderError
from ._batch_config import ProviderBatchConfig, estimate_input_tokens
from ._batch_settle import failure_of
from ._schema import NewResult, NewSubmission, PendingItem, RunSnapshot
from .repository._client import RepositoryClient, RunBound

__all__ = ["METADATA_KEY", "BatchSubmitter", "BatchTimers"]

METADATA_KEY: Final = "trio_batch_llm_submission"
"""The batch metadata key carrying the submission id: how an unknown create is found again."""
_PENDING_PAGE: Final = 512
_SETTLE_SECONDS: Final = 60.0


@final
@dataclass(slots=True)
class BatchTimers:
    """When the driver next looks at what, shared by the driver and the submitter (in memory, per
    handle: after a restart a retry or a refused scope is simply tried at once)."""

    next_poll: dict[str, float] = field(default_factory=dict)
    """By submission id: when its batch is next retrieved."""
    retry_ready: dict[str, float] = field(default_factory=dict)
    """By item id: when a retried item may go into a batch again."""
    next_find: float = -math.inf
    """When an unknown create is next looked up by its metadata."""


@final
@dataclass(frozen=True, slots=True)
class _Chunk:
    item_ids: list[str]
    content: bytes
    tokens: int
    full: bool
    """A limit (count, bytes, capacity) closed it: waiting would not make it fuller."""


@final
class BatchSubmitter(RunBound):
    """Step 4 of a batch drive segment for one run handle; see the module docstring."""

    def __init__(
        self, *, db: RepositoryClient, run_id: str, endpoint: BatchEndpoint, batch: ProviderBatchConfig,
        retry: RetryConfig, scope: str, timers: BatchTimers,
    ) -> None:
        super().__init__(db=db, run_id=run_id)
        self._endpoint = endpoint
        self._batch = batch
        self._retry = retry
        self._scope = scope
        self._timers = timers
        self._estimate = batch.token_estimator or estimate_input_tokens
        # A provider whose batches take less than max_file_bytes says so (Gemini's inline requests).
        cap = getattr(endpoint, "max_file_bytes", None)
        self._max_bytes = min(batch.max_file_bytes, cap) if isinstance(cap, int) else batch.max_file_bytes
        self._rng = random.Random(retry.jitter_seed)  # for the scope's refusal backoff
        self._ready_at = -math.inf
        self._refusals = 0
        self._partial_since: float | None = None

    def wake_times(self, now: float) -> list[float]:
        """When submitting may next make progress (for the driver's idle sleep)."""
        times = [self._ready_at] if self._ready_at > now else []
        if self._partial_since is not None:
            times.append(self._partial_since + self._batch.poll_interval)
        return times

    def refused(self) -> None:
        """The provider refused a batch: back off submitting (the retry backoff, per refusal in a row)."""
        wait = self._retry.wait_before_retry(self._refusals, None, self._rng)
        self._refusals += 1
        self._ready_at = anyio.current_time() + wait

    def answered(self) -> None:
        """The provider answered an item: its refusals in a row are over."""
        self._refusals = 0

    async def submit(
        self, api: BatchConnection, stopping: Callable[[], bool], snap: RunSnapshot
    ) -> RunSnapshot:
        """Submit batches while there are eligible items, room and open-batch slots; the snapshot after."""
        open_batches = snap.open_submissions
        while (
            not stopping()
            and open_batches < self._batch.max_open_batches
            and anyio.current_time() >= self._ready_at
        ):
            chunk = await self._next_chunk()
            if chunk is None:
                break
            if not chunk.full and not snap.ingestion_complete:
                # While a source is still being read, wait up to a poll interval for a fuller file.
                now = anyio.current_time()
                if self._partial_since is None:
                    self._partial_since = now
                if now < self._partial_since + self._batch.poll_interval:
                    break
            self._partial_since = None
            if not await self._send(api, chunk):
                break
            open_batches += 1
        return await self._snapshot()

    async def _next_chunk(self) -> _Chunk | None:
        """The next request file, or ``None`` when no pending item is ready."""
        await anyio.lowlevel.checkpoint()
        limit = self._batch.enqueued_token_limit
        room = math.inf
        if limit is not None:
            room = limit - await self._db.call(self._repo.held_tokens, self._scope)
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
            ready = [item for item in page if self._timers.retry_ready.get(item.item_id, -math.inf) <= now]
            # Encoding a page of lines is CPU work: a worker thread does it (a file may hold 50,000).
            encoded = await anyio.to_thread.run_sync(self._encode, ready)
            for item, line, need in encoded:
                refusal = self._oversized(len(line), need)
                if refusal is not None:
                    too_big.append(failure_of(item, refusal, None, self._repo.location))
                    continue
                if (len(ids) >= self._batch.max_requests_per_batch
                        or size + len(line) > self._max_bytes or tokens + need > room):
                    full = True
                    break
                ids.append(item.item_id)
                lines.append(line)
                size += len(line)
                tokens += need
        if too_big:
            # Recorded before any file is sent: an item no file can hold fails once, and is not
            # chunked again at the next look (a crash before this write only repeats the look).
            await self._db.call(self._repo.record, self._run_id, too_big)
        if not ids:
            return None
        return _Chunk(ids, b"".join(lines), tokens, full)

    def _encode(self, items: list[PendingItem]) -> list[tuple[PendingItem, bytes, int]]:
        """Each item's request line and estimated enqueued tokens (in a worker thread)."""
        encoded = []
        for item in items:
            request = self._endpoint.encode_request(item.item_id, item.prompt)
            encoded.append((item, request.line, self._estimate(request.text)))
        return encoded

    def _oversized(self, size: int, tokens: int) -> ProviderError | None:
        if size > self._max_bytes:
            return ProviderError(f"its request line has {size} bytes, over the {self._max_bytes} bytes a "
                                 "batch may hold (max_file_bytes, or the provider's own cap)",
                                 category=ErrorCategory.INVALID_REQUEST)
        limit = self._batch.enqueued_token_limit
        if limit is not None and tokens > limit:
            return ProviderError(
                f"it needs about {tokens} enqueued tokens, over enqueued_token_limit={limit}",
                category=ErrorCategory.INVALID_REQUEST,
            )
        return None

    async def _abandon(self, sid: str, detail: str) -> None:
        await self._db.call(self._repo.abandon_submission, self._run_id, sid, to="abandoned", detail=detail)

    async def _send(self, api: BatchConnection, chunk: _Chunk) -> bool:
        """Reserve, upload, create; ``False`` when submitting should pause (refused, unknown, no room)."""
        sid = uuid.uuid4().hex
        # Each step below is one transaction or one request, so a crash between two of them leaves a
        # state the next segment's recovery reads (see _batch_drive's steps 1 and 2).
        # 1. Reserve the scope's capacity and the items at once: two runs or processes sharing the
        #    scope never both take the same room. A crash from here to step 3 leaves ``reserved``:
        #    nothing was created, so recovery abandons it and its items go back to pending.
        submission = NewSubmission(submission_id=sid, scope=self._scope, item_ids=tuple(chunk.item_ids),
                                   tokens=chunk.tokens)
        reserved = await self._db.call(self._repo.reserve_submission, self._run_id, submission,
                                       capacity_limit=self._batch.enqueued_token_limit)
        if not reserved:
            return False  # another run took the room first: look again after a poll interval
        # 2. Upload. A crash now leaves a file at the provider that no batch uses: harmless.
        try:
            file_id = await api.upload(f"{self._run_id}-{sid}.jsonl", chunk.content)
        except ProviderError as exc:
            await self._abandon(sid, f"upload failed: {exc}")
            self.refused()
            return False
        # 3. The intent, written before the create may leave: a crash during the create leaves
        #    ``creating``, which recovery makes ``unknown`` and resolves by the metadata below.
        #    Written after, a crash would leave a batch at the provider that no submission names:
        #    paid for, its results never collected, its items submitted and run again.
        await self._db.call(self._repo.update_submission, self._run_id, sid,
                            from_states=frozenset({"reserved"}), to="creating", input_file_id=file_id)
        # 4. Create, carrying the submission id: how an unknown outcome is found again.
        sending = SendMark()
        try:
            info = await api.create(file_id, completion_window=self._batch.completion_window,
                                    metadata={METADATA_KEY: sid, "run_id": self._run_id[:512]},
                                    sending=sending)
        except ProviderError as exc:  # the request was sent: an answer, or none
            if self._endpoint.create_outcome_unknown(exc):
                await self._db.call(
                    self._repo.update_submission, self._run_id, sid, from_states=frozenset({"creating"}),
                    to="unknown", detail=f"create outcome unknown: {exc}",
                )
                self._timers.next_find = anyio.current_time() + self._batch.poll_interval
            else:
                await self._abandon(sid, f"create refused: {exc}")
                self.refused()
            return False
        except BaseException:
            if not sending.sent:
                # Stopped (wait()'s deadline, a pause or a close) before the request could leave:
                # nothing was created, so the intent must not wait for an operator. Bounded: one
                # repository transaction (SQLite's busy timeout), shielded from the stop itself.
                with anyio.CancelScope(shield=True), anyio.move_on_after(_SETTLE_SECONDS):
                    await self._abandon(sid, "never sent: stopped before its create call")
            raise
        # A crash before this write leaves ``creating`` for a batch that exists: found by its metadata.
        await self._db.call(self._repo.update_submission, self._run_id, sid,
                            from_states=frozenset({"creating"}), to="submitted", batch_id=info.id)
        self._timers.next_poll[sid] = anyio.current_time() + self._batch.poll_interval
        return True
