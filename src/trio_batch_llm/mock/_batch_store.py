"""The mock server's Files and Batch APIs: a synchronous store of files and batches the app drives.

Nothing here does I/O or reads a clock: the app passes ``now`` (its own clock)
to every call, and :meth:`BatchStore.advance` finishes every batch whose time
has come. So there is no background task, virtual clocks are exact, and a
batch's lines run at the first request at or after ``created + batch_latency``,
in input order, through the app's own line executor (the same occurrence
counter, faults and payloads as live requests).

Each operation answers as the API would (a :class:`BatchReply`). Which
request is which operation is :mod:`._batch_routes`; parsing the uploaded
multipart form and the JSONL input file is :mod:`._batch_input`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, final
from urllib.parse import parse_qs

from ._batch_input import BATCH_ENDPOINTS, InputLine, parse_input_file, parse_multipart
from ._openai import Api
from ._state import MockServerConfig

__all__ = ["EPOCH", "BatchCounters", "BatchReply", "BatchStore", "LineExecutor", "listing_page"]

EPOCH = 1_700_000_000
"""Wire timestamps are ``EPOCH + floor(clock)``: integers, deterministic under a virtual clock."""
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
_WINDOW = 24 * 3600
_MAX_METADATA = 16

LineExecutor = Callable[[Api, dict[str, Any], str], tuple[int, dict[str, Any]]]
"""``(api, body, prompt) -> (status_code, response body)``: one line, as the live endpoint answers it."""


@final
@dataclass(frozen=True, slots=True)
class BatchReply:
    """What to answer: JSON ``payload``, raw ``content`` bytes, or an error ``message`` (status >= 400).

    ``created`` says a batch was created by this request (scripted faults act after that).
    """

    status: int = 200
    payload: Any = None
    content: bytes | None = None
    message: str = ""
    created: bool = False


def _error(status: int, message: str) -> BatchReply:
    return BatchReply(status, message=message)


def listing_page(config: MockServerConfig, query: str, error: Callable[[int, str], BatchReply], *,
                 what: str, size: str, default: int, most: int,
                 label: str | None = None) -> tuple[dict[str, list[str]], int] | BatchReply:
    """A batch listing's query and page size, or its refusal: listing turned off (404), or ``size``
    not an integer from 1 to ``most`` (400).

    One rule for every dialect's listing (OpenAI, Anthropic, Gemini): only the words differ, so
    ``error`` shapes the refusal as the dialect does, ``what`` names the batches and ``label`` the
    parameter (``size`` and a colon unless given).
    """
    if not config.batch_list:
        return error(404, f"listing {what} is turned off in this mock (batch_list=False)")
    params = parse_qs(query, keep_blank_values=True)
    raw = params.get(size, [str(default)])[-1]
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        return error(400, f"{label or size + ':'} must be an integer from 1 to {most}, got {raw!r}")
    return params, int(raw)


def _no_file(file_id: str) -> BatchReply:
    return _error(404, f"No such File object: {file_id}")


def _no_batch(batch_id: str) -> BatchReply:
    return _error(404, f"No such Batch object: {batch_id}")


@dataclass(slots=True)
class BatchCounters:
    files_uploaded: int = 0
    batches_created: int = 0
    batches_completed: int = 0
    batches_failed: int = 0
    batches_token_limited: int = 0
    batches_expired: int = 0
    batches_cancelled: int = 0
    batch_lines: int = 0
    enqueued_tokens: int = 0
    max_enqueued_tokens: int = 0


@dataclass(slots=True)
class _File:
    id: str
    filename: str
    purpose: str
    content: bytes
    created_at: int
    deleted: bool = False

    def wire(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": len(self.content), "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose}


@dataclass(slots=True)
class _Batch:
    id: str
    api: Api
    endpoint: str
    input_file_id: str
    metadata: dict[str, str] | None
    due: float  # clock time at which it finishes
    lines: tuple[InputLine, ...]
    tokens: int
    outcome: str
    status: str = "in_progress"
    errors: list[dict[str, Any]] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    completed: int = 0
    failed: int = 0
    stamps: dict[str, int | None] = field(default_factory=dict)

    def wire(self) -> dict[str, Any]:
        stamp = self.stamps.get
        return {
            "id": self.id, "object": "batch", "endpoint": self.endpoint,
            "errors": None if self.errors is None else {"object": "list", "data": list(self.errors)},
            "input_file_id": self.input_file_id, "completion_window": "24h", "status": self.status,
            "output_file_id": self.output_file_id, "error_file_id": self.error_file_id,
            "created_at": stamp("created_at"), "in_progress_at": stamp("in_progress_at"),
            "expires_at": stamp("expires_at"), "finalizing_at": stamp("finalizing_at"),
            "completed_at": stamp("completed_at"), "failed_at": stamp("failed_at"),
            "expired_at": stamp("expired_at"), "cancelling_at": stamp("cancelling_at"),
            "cancelled_at": stamp("cancelled_at"),
            "request_counts": {"total": len(self.lines), "completed": self.completed, "failed": self.failed},
            "metadata": None if self.metadata is None else dict(self.metadata),
        }


def _stamp(now: float) -> int:
    return EPOCH + math.floor(now)


@final
class BatchStore:
    """Files and batches of one mock app; every method is synchronous and takes the time it happens at."""

    def __init__(self, config: MockServerConfig, execute: LineExecutor) -> None:
        self.config = config
        self.counts = BatchCounters()
        self._execute = execute
        self._files: dict[str, _File] = {}
        self._batches: dict[str, _Batch] = {}  # creation order
        self._live: list[_Batch] = []  # not terminal: they hold their tokens
        self._ids = 0
        self._create_faults = iter(config.batch_create_faults)
        self._outcomes = iter(config.batch_outcomes)

    @property
    def batches(self) -> list[dict[str, Any]]:
        return [batch.wire() for batch in self._batches.values()]

    @property
    def files(self) -> list[dict[str, Any]]:
        return [{**file.wire(), "deleted": file.deleted} for file in self._files.values()]

    def _file(self, file_id: str) -> _File | None:
        file = self._files.get(file_id)
        return None if file is None or file.deleted else file

    def next_create_fault(self) -> str:
        return next(self._create_faults, "ok")

    def _new_id(self, prefix: str) -> str:
        self._ids += 1
        digest = hashlib.sha256(f"{self.config.seed}\x00{prefix}\x00{self._ids}".encode()).hexdigest()
        return prefix + digest[:24]

    # -- time -----------------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Finish every batch that is due at ``now`` (in creation order) and every cancelling one."""
        if not self._live:
            return
        still: list[_Batch] = []
        for batch in self._live:
            if batch.status == "cancelling":
                self._finish(batch, "cancelled", now)
            elif batch.due <= now:
                self._finish(batch, batch.outcome, batch.due)
            else:
                still.append(batch)
        self._live = still
        self.counts.enqueued_tokens = sum(batch.tokens for batch in still)

    def _finish(self, batch: _Batch, how: str, when: float) -> None:
        counts = self.counts
        if how == "failed":
            batch.status, batch.stamps["failed_at"] = "failed", _stamp(when)
            batch.errors = [_batch_error("server_error", "The batch failed on the server (mock).")]
            counts.batches_failed += 1
            return
        run = {"completed": len(batch.lines), "expired": len(batch.lines) // 2, "cancelled": 0}[how]
        outputs: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        for index, line in enumerate(batch.lines):
            line_id = "batch_req_" + _digest(batch.id, index)
            if index < run:
                status, body = self._execute(batch.api, line.body, line.prompt)
                counts.batch_lines += 1
                response = {"status_code": status, "request_id": "req_" + _digest(batch.id, index, "req"),
                            "body": body}
                entry = {"id": line_id, "custom_id": line.custom_id, "response": response, "error": None}
                (outputs if 200 <= status < 300 else errors).append(entry)
            else:
                code = f"batch_{how}"
                message = f"This request could not be executed before the batch was {how} (mock)."
                errors.append({"id": line_id, "custom_id": line.custom_id, "response": None,
                               "error": {"code": code, "message": message}})
        batch.completed = len(outputs)
        batch.failed = sum(1 for entry in errors if entry["response"] is not None)
        batch.output_file_id = self._result_file(batch, "output", outputs, when)
        batch.error_file_id = self._result_file(batch, "error", errors, when)
        batch.status = how
        if how == "completed":
            batch.stamps["finalizing_at"] = batch.stamps["completed_at"] = _stamp(when)
            counts.batches_completed += 1
        elif how == "expired":
            batch.stamps["expired_at"] = _stamp(when)
            counts.batches_expired += 1
        else:
            batch.stamps["cancelled_at"] = _stamp(when)
            counts.batches_cancelled += 1

    def _result_file(self, batch: _Batch, kind: str, entries: list[dict[str, Any]],
                     when: float) -> str | None:
        if not entries:
            return None  # a file with no lines is not created
        content = b"".join(json.dumps(entry).encode() + b"\n" for entry in entries)
        file = _File(self._new_id("file-"), f"{batch.id}_{kind}.jsonl", "batch_output", content, _stamp(when))
        self._files[file.id] = file
        return file.id

    # -- files ----------------------------------------------------------------------------------

    def upload(self, content_type: str, raw: bytes, now: float) -> BatchReply:
        fields = parse_multipart(content_type, raw)
        if fields is None:
            return _error(400, "the body must be multipart/form-data with fields 'purpose' and 'file'")
        purpose, upload = fields.get("purpose"), fields.get("file")
        if purpose is None or upload is None or upload[0] is None:
            return _error(400, "missing required field: 'purpose' and 'file' (with a filename) are required")
        if purpose[1] != b"batch":
            named = purpose[1].decode("utf-8", "replace")
            return _error(400, f"purpose {named!r} is not supported (the mock takes 'batch')")
        file = _File(self._new_id("file-"), upload[0], "batch", upload[1], _stamp(now))
        self._files[file.id] = file
        self.counts.files_uploaded += 1
        return BatchReply(payload=file.wire())

    def file(self, file_id: str) -> BatchReply:
        file = self._file(file_id)
        return _no_file(file_id) if file is None else BatchReply(payload=file.wire())

    def file_content(self, file_id: str) -> BatchReply:
        file = self._file(file_id)
        return _no_file(file_id) if file is None else BatchReply(content=file.content)

    def delete_file(self, file_id: str) -> BatchReply:
        file = self._file(file_id)
        if file is None:
            return _no_file(file_id)
        file.deleted = True  # kept (without answering for it) so tests can still see what was uploaded
        return BatchReply(payload={"id": file_id, "object": "file", "deleted": True})

    # -- batches --------------------------------------------------------------------------------

    def create(self, raw: bytes, now: float) -> BatchReply:
        try:
            request = json.loads(raw)
        except ValueError:
            return _error(400, "the body must be a JSON object")
        problem = _create_request_problem(request)
        if problem is not None:
            return _error(400, problem)
        file = self._file(request["input_file_id"])
        if file is None:
            return _no_file(request["input_file_id"])
        if file.purpose != "batch":
            return _error(400, f"file {file.id} has purpose {file.purpose!r}, not 'batch'")
        endpoint = request["endpoint"]
        lines, problems = parse_input_file(file.content, endpoint)
        batch = _Batch(self._new_id("batch_"), BATCH_ENDPOINTS[endpoint], endpoint, file.id,
                       request.get("metadata"), now + self.config.batch_latency, tuple(lines),
                       tokens=sum(line.tokens for line in lines), outcome="completed")
        batch.stamps.update(created_at=_stamp(now), expires_at=_stamp(now) + _WINDOW)
        self._batches[batch.id] = batch
        counts = self.counts
        counts.batches_created += 1
        limit, held = self.config.batch_enqueued_token_limit, counts.enqueued_tokens
        if problems:
            self._fail_at_creation(batch, now, [_batch_error("invalid_request", text, line=number)
                                                for number, text in problems])
        elif limit is not None and held + batch.tokens > limit:
            counts.batches_token_limited += 1
            message = (f"Enqueued token limit reached (mock). Limit: {limit} enqueued tokens; already "
                       f"enqueued: {held}; this batch: {batch.tokens}. Try again once a batch has completed.")
            self._fail_at_creation(batch, now, [_batch_error("token_limit_exceeded", message)])
        else:
            batch.outcome = next(self._outcomes, "completed")
            batch.stamps["in_progress_at"] = _stamp(now)
            self._live.append(batch)
            counts.enqueued_tokens = held + batch.tokens
            counts.max_enqueued_tokens = max(counts.max_enqueued_tokens, counts.enqueued_tokens)
        return BatchReply(payload=batch.wire(), created=True)

    def _fail_at_creation(self, batch: _Batch, now: float, errors: list[dict[str, Any]]) -> None:
        batch.status, batch.errors, batch.stamps["failed_at"] = "failed", errors, _stamp(now)
        batch.lines, batch.tokens = (), 0  # nothing will run, nothing is held
        self.counts.batches_failed += 1

    def get(self, batch_id: str) -> BatchReply:
        batch = self._batches.get(batch_id)
        return _no_batch(batch_id) if batch is None else BatchReply(payload=batch.wire())

    def list(self, query: str) -> BatchReply:
        listed = listing_page(self.config, query, _error, what="batches", size="limit", default=20, most=100,
                              label="limit")
        if isinstance(listed, BatchReply):
            return listed
        params, limit = listed
        newest_first = list(reversed(self._batches.values()))
        after = params.get("after", [None])[-1]
        if after is not None:
            ids = [batch.id for batch in newest_first]
            if after not in ids:
                return _error(400, f"after={after!r} is not the id of a batch")
            newest_first = newest_first[ids.index(after) + 1:]
        page = newest_first[:limit]
        return BatchReply(payload={
            "object": "list", "data": [batch.wire() for batch in page],
            "first_id": page[0].id if page else None, "last_id": page[-1].id if page else None,
            "has_more": len(newest_first) > limit,
        })

    def cancel(self, batch_id: str, now: float) -> BatchReply:
        batch = self._batches.get(batch_id)
        if batch is None:
            return _no_batch(batch_id)
        if batch.status in TERMINAL:
            return _error(400, f"Cannot cancel a batch with status {batch.status!r}.")
        if batch.status != "cancelling":
            batch.status, batch.stamps["cancelling_at"] = "cancelling", _stamp(now)
        return BatchReply(payload=batch.wire())


def _create_request_problem(request: Any) -> str | None:
    if not isinstance(request, dict):
        return "the body must be a JSON object"
    if not isinstance(request.get("input_file_id"), str):
        return "input_file_id is required (a string)"
    if request.get("endpoint") not in BATCH_ENDPOINTS:
        return f"endpoint must be one of {sorted(BATCH_ENDPOINTS)}, got {request.get('endpoint')!r}"
    if request.get("completion_window") != "24h":
        return f"completion_window must be '24h', got {request.get('completion_window')!r}"
    metadata = request.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, dict) and len(metadata) <= _MAX_METADATA
        and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        return f"metadata must be an object of at most {_MAX_METADATA} string pairs"
    return None


def _batch_error(code: str, message: str, *, line: int | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": None, "line": line}


def _digest(*parts: object) -> str:
    return hashlib.sha256("\x00".join(map(str, parts)).encode()).hexdigest()[:24]

