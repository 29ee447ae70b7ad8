"""The mock's Gemini batch mode: a synchronous store of ``batches/…`` resources the app drives.

Written from the Gemini API's documented REST format (``v1beta``):
``POST /v1beta/models/{model}:batchGenerateContent`` with ``{batch:
{displayName, inputConfig: {requests: {requests: [{request, metadata}]}}}}``
answers a long-running operation ``{name: "batches/…", metadata:
GenerateContentBatch}``; ``GET /v1beta/batches/{id}`` retrieves it, ``GET
/v1beta/batches`` lists (``pageSize``, ``pageToken``; ``{operations,
nextPageToken}``, newest first), ``POST /v1beta/batches/{id}:cancel`` cancels
and ``DELETE /v1beta/batches/{id}`` deletes. A finished batch carries its
answers inline, in input order: ``metadata.output.inlinedResponses
.inlinedResponses[i]`` is ``{response, metadata}`` or ``{error: Status,
metadata}`` (a ``google.rpc.Status``: gRPC code, message, details).

As :mod:`._anthropic_batches`: no I/O, no clock; each request is answered by
the injected ``answer`` (the live ``generateContent`` dialect), and the knobs
``batch_latency``, ``batch_outcomes`` (``"expired"``: ``BATCH_STATE_EXPIRED``
with the first half answered; ``"failed"``: ``BATCH_STATE_FAILED``, no output),
``batch_list`` and ``batch_enqueued_token_limit`` (a create over it is a 429
``RESOURCE_EXHAUSTED``) apply.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, final

from ._anthropic_batches import rfc3339
from ._batch_routes import match_table, route_table
from ._batch_store import EPOCH, BatchReply
from ._inline_batch_store import InlineBatchStore
from ._state import mock_token_count

__all__ = ["GRPC_CODES", "GeminiBatchStore", "GeminiLineAnswer", "google_error", "match_gemini_batch_route"]

GeminiLineAnswer = Callable[[str, dict[str, Any]], tuple[int, dict[str, Any]]]
"""``(model, request) -> (status, body)``: one ``GenerateContentRequest``, answered as live."""

GRPC_CODES: Final = {400: (3, "INVALID_ARGUMENT"), 401: (16, "UNAUTHENTICATED"),
                     403: (7, "PERMISSION_DENIED"),
                     404: (5, "NOT_FOUND"), 409: (10, "ABORTED"), 429: (8, "RESOURCE_EXHAUSTED"),
                     499: (1, "CANCELLED"), 500: (13, "INTERNAL"), 503: (14, "UNAVAILABLE"),
                     504: (4, "DEADLINE_EXCEEDED")}
"""HTTP status -> (gRPC code, status name), as Google's APIs map them."""
_TYPE: Final = "type.googleapis.com/google.ai.generativelanguage.v1beta."
_TERMINAL: Final = frozenset({"BATCH_STATE_SUCCEEDED", "BATCH_STATE_FAILED", "BATCH_STATE_CANCELLED",
                              "BATCH_STATE_EXPIRED"})
_WINDOW: Final = 48 * 3600
_ROUTES: Final = route_table({
    "/v1beta/models/{model}:batchGenerateContent": {"POST": "create"},
    "/v1beta/batches": {"GET": "list"},
    "/v1beta/batches/{batch}": {"GET": "get", "DELETE": "delete"},
    "/v1beta/batches/{batch}:cancel": {"POST": "cancel"},
}, target="[^/:]+")


def match_gemini_batch_route(method: str, path: str) -> tuple[str, str, str] | str | None:
    """``(template, action, target)`` of a batch-mode request (target: the model or batch id);
    ``"wrong method"`` when only the path matches; ``None`` when the path is not a batch path."""
    found = match_table(_ROUTES, method, path)
    return (found[0], found[1], found[2] or "") if isinstance(found, tuple) else found


def google_error(status: int, message: str, details: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Google's REST error body for ``status``."""
    _, name = GRPC_CODES.get(status, (2, "UNKNOWN"))
    error: dict[str, Any] = {"code": status, "message": message, "status": name}
    if details:
        error["details"] = details
    return {"error": error}


def _rpc_status(status: int, body: dict[str, Any]) -> dict[str, Any]:
    """A failed line as a ``google.rpc.Status`` (gRPC code, message, details) from the live error body."""
    found = body.get("error")
    error: dict[str, Any] = found if isinstance(found, dict) else {}
    code, _ = GRPC_CODES.get(status, (2, "UNKNOWN"))
    rpc: dict[str, Any] = {"code": code, "message": str(error.get("message") or f"error {status}")}
    if isinstance(error.get("details"), list):
        rpc["details"] = error["details"]
    return rpc


def _time(now: float) -> str:
    return rfc3339(EPOCH + math.floor(now))


def _error(status: int, message: str) -> BatchReply:
    return BatchReply(status, payload=google_error(status, message), message=message)


@dataclass(slots=True)
class _Batch:
    id: str
    model: str
    display_name: str
    requests: list[dict[str, Any]]
    tokens: int
    due: float
    outcome: str
    created: str
    state: str = "BATCH_STATE_PENDING"
    updated: str = ""
    ended: str | None = None
    output: list[dict[str, Any]] | None = None
    error: dict[str, Any] | None = None
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"batches/{self.id}"

    def wire(self) -> dict[str, Any]:
        total = len(self.requests)
        stats = {"requestCount": str(total)}
        if self.state in _TERMINAL:
            stats.update(successfulRequestCount=str(self.stats.get("ok", 0)),
                         failedRequestCount=str(self.stats.get("failed", 0)))
        else:
            stats["pendingRequestCount"] = str(total)
        metadata: dict[str, Any] = {
            "@type": _TYPE + "GenerateContentBatch", "model": f"models/{self.model}",
            "displayName": self.display_name, "createTime": self.created, "updateTime": self.updated,
            "batchStats": stats, "state": self.state, "name": self.name,
        }
        operation: dict[str, Any] = {"name": self.name, "metadata": metadata}
        if self.ended is not None:
            metadata["endTime"] = self.ended
        if self.output is not None:
            output = {"inlinedResponses": {"inlinedResponses": self.output}}
            metadata["output"] = output
            operation["response"] = {"@type": _TYPE + "GenerateContentBatchOutput", **output}
        if self.state in _TERMINAL:
            operation["done"] = True
        if self.error is not None:
            operation["error"] = self.error
        return operation


@final
class GeminiBatchStore(InlineBatchStore[_Batch, GeminiLineAnswer]):
    """Gemini batches of one mock app; every method is synchronous and takes the time it happens at."""

    _over_limit = "Enqueued tokens for batch mode would exceed"
    _unknown_id = "Batch batches/{batch_id} not found."
    _listing = ("batches", "pageSize", 50)

    @property
    def batches(self) -> list[dict[str, Any]]:
        return [batch.wire() for batch in self._batches.values()]

    def _new_id(self) -> str:
        return self._id_digest("gembatch")[:20]

    def advance(self, now: float) -> None:
        """Finish every batch that is due at ``now`` (in creation order)."""
        for batch in self._batches.values():
            if batch.state not in _TERMINAL and batch.due <= now:
                self._finish(batch, batch.outcome, batch.due)
        self.enqueued_tokens = sum(b.tokens for b in self._batches.values() if b.state not in _TERMINAL)

    def _finish(self, batch: _Batch, how: str, when: float) -> None:
        batch.updated = batch.ended = _time(when)
        if how == "failed":
            batch.state = "BATCH_STATE_FAILED"
            batch.error = {"code": 13, "message": "The batch failed on the server (mock)."}
            return
        run = len(batch.requests) if how == "completed" else len(batch.requests) // 2
        output: list[dict[str, Any]] = []
        for entry in batch.requests[:run]:
            status, body = self._answer(batch.model, entry["request"])
            self.lines_answered += 1
            ok = 200 <= status < 300
            line: dict[str, Any] = {"response": body} if ok else {"error": _rpc_status(status, body)}
            batch.stats["ok" if ok else "failed"] = batch.stats.get("ok" if ok else "failed", 0) + 1
            if "metadata" in entry:
                line["metadata"] = entry["metadata"]
            output.append(line)
        batch.output = output
        batch.state = "BATCH_STATE_SUCCEEDED" if how == "completed" else "BATCH_STATE_EXPIRED"

    # -- requests -------------------------------------------------------------------------------

    def create(self, model: str, raw: bytes, now: float) -> BatchReply:
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "Invalid JSON payload received.")
        batch_body = body.get("batch") if isinstance(body, dict) else None
        if not isinstance(batch_body, dict):
            return _error(400, "batch: required field missing (a GenerateContentBatch)")
        display_name = batch_body.get("displayName")
        if not isinstance(display_name, str) or not display_name:
            return _error(400, "batch.displayName: required field missing")
        input_config = batch_body.get("inputConfig")
        inline = input_config.get("requests") if isinstance(input_config, dict) else None
        requests = inline.get("requests") if isinstance(inline, dict) else None
        problem = _requests_problem(requests)
        if problem is not None:
            return _error(400, problem)
        assert isinstance(requests, list)  # checked by _requests_problem
        tokens = sum(mock_token_count(json.dumps([r["request"].get("systemInstruction"),
                                                  r["request"].get("contents")])) for r in requests)
        refusal = self._limit_refusal(tokens)
        if refusal is not None:
            return _error(429, refusal)
        batch = _Batch(self._new_id(), model.removeprefix("models/"), display_name, requests, tokens,
                       now + self.config.batch_latency, self._next_outcome(), _time(now))
        batch.updated = batch.created
        self._keep(batch)
        return BatchReply(payload=batch.wire(), created=True)

    def list(self, query: str) -> BatchReply:
        listed = self._page_query(query)
        if isinstance(listed, BatchReply):
            return listed
        params, size = listed
        token = params.get("pageToken", ["0"])[-1] or "0"
        if not token.isdigit():
            return _error(400, f"pageToken: {token!r} is not a page token of this listing")
        start = int(token)
        newest_first = list(reversed(self._batches.values()))
        page = newest_first[start:start + size]
        payload: dict[str, Any] = {"operations": [batch.wire() for batch in page]}
        if start + size < len(newest_first):
            payload["nextPageToken"] = str(start + size)
        return BatchReply(payload=payload)

    def cancel(self, batch_id: str, now: float) -> BatchReply:
        batch = self._find(batch_id)
        if isinstance(batch, BatchReply):
            return batch
        if batch.state not in _TERMINAL:
            batch.state, batch.updated, batch.ended = "BATCH_STATE_CANCELLED", _time(now), _time(now)
        return BatchReply(payload={})

    def delete(self, batch_id: str) -> BatchReply:
        if self._batches.pop(batch_id, None) is None:
            return self._unknown(batch_id)
        return BatchReply(payload={})

    def _error(self, status: int, message: str) -> BatchReply:
        return _error(status, message)

    def _wire(self, batch: _Batch) -> dict[str, Any]:
        return batch.wire()

    def _create_at(self, target: str, raw: bytes, now: float) -> BatchReply:
        return self.create(target, raw, now)  # target: the model the path names


def _requests_problem(requests: Any) -> str | None:
    if not isinstance(requests, list) or not requests:
        return "batch.inputConfig.requests.requests: required field missing (a non-empty list)"
    for index, entry in enumerate(requests):
        if not isinstance(entry, dict) or not isinstance(entry.get("request"), dict):
            return f"batch.inputConfig.requests.requests[{index}].request: required field missing"
        metadata = entry.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            return f"batch.inputConfig.requests.requests[{index}].metadata: must be an object"
    return None
