"""Gemini's batch mode as a :class:`BatchEndpoint` (``GeminiStrategy.batch_endpoint()``).

The request file is ours: one JSON line ``{request, metadata: {key: item
id}}`` per item, ``request`` the REST ``GenerateContentRequest`` of
``strategy.request_body``. "Uploading" keeps it in the connection; the
create sends the requests inline (``POST
/v1beta/models/{model}:batchGenerateContent``, ``inputConfig.requests``),
and a finished batch carries its answers inline, in input order
(``output.inlinedResponses``): a ``response`` (read by
``_wire.read_response``) or an ``error`` (a ``google.rpc.Status``, read by
``_errors.error_from_body`` as the live answer with that status would be).
A request the batch has no answer for in an expired or cancelled batch never
ran (no attempt used); in a failed batch it is tried again.

Finding a batch: the batch's ``displayName`` is its metadata as compact
JSON (the first pair always; the rest while it stays short), so
:meth:`GeminiBatchConnection.find` lists the batches (``GET /v1beta/batches``,
newest first, a few thousand back) and matches it.

Inline requests are limited to 20 MB per batch by the API: keep
``ProviderBatchConfig.max_file_bytes`` under it for Gemini.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final, final

import anyio
import anyio.lowlevel

from ..._values._categories import ErrorCategory
from ..._values._errors import ProviderError
from .._batch import BatchInfo, BatchItemOutcome, SendMark
from .._batch_requests import (
    InlineBatchConnection,
    InlineBatchEndpoint,
    InlineEndpointSettings,
    json_line,
)
from .._batch_requests import create_outcome_unknown as outcome_unknown

__all__ = ["GeminiBatchConnection", "GeminiBatchEndpoint", "batch_info"]

TERMINAL_STATES: Final = frozenset({"BATCH_STATE_SUCCEEDED", "BATCH_STATE_FAILED", "BATCH_STATE_CANCELLED",
                                    "BATCH_STATE_EXPIRED", "JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED",
                                    "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED"})
_UNRUN_STATES: Final = frozenset({"BATCH_STATE_CANCELLED", "BATCH_STATE_EXPIRED", "JOB_STATE_CANCELLED",
                                  "JOB_STATE_EXPIRED"})
# gRPC code -> (HTTP status, status name), as Google's APIs map them: how a failed line reads as live.
_GRPC: Final = {1: (499, "CANCELLED"), 2: (500, "UNKNOWN"), 3: (400, "INVALID_ARGUMENT"),
                4: (504, "DEADLINE_EXCEEDED"), 5: (404, "NOT_FOUND"), 6: (409, "ALREADY_EXISTS"),
                7: (403, "PERMISSION_DENIED"), 8: (429, "RESOURCE_EXHAUSTED"),
                9: (400, "FAILED_PRECONDITION"),
                10: (409, "ABORTED"), 11: (400, "OUT_OF_RANGE"), 12: (501, "UNIMPLEMENTED"),
                13: (500, "INTERNAL"), 14: (503, "UNAVAILABLE"), 15: (500, "DATA_LOSS"),
                16: (401, "UNAUTHENTICATED")}
_LIST_PAGE: Final = 100
DISPLAY_NAME_CHARS: Final = 128
"""A display name kept short: the API documents no limit, and a run id may be 512 characters."""
INLINE_REQUEST_BYTES: Final = 19_000_000
"""Under the API's 20 MB limit on a batch's inline requests, leaving room for the envelope."""
_MAX_LIST_PAGES: Final = 20
_REFUSED_STATUSES: Final = frozenset({400, 401, 403, 404, 409, 413, 429, 503})


def _name(batch_id: str) -> str:
    return batch_id if batch_id.startswith("batches/") else f"batches/{batch_id}"


def _model_path(model: str) -> str:
    return model if model.startswith(("models/", "tunedModels/")) else f"models/{model}"


def batch_info(payload: Any) -> BatchInfo:
    """A batch operation (``{name, metadata: GenerateContentBatch, done, error}``), as a run sees it.

    Its one result "file" is its own name: the answers are inline in the batch resource.
    """
    if not isinstance(payload, Mapping) or not isinstance(payload.get("name"), str):
        raise ProviderError("a batch operation without a name", category=ErrorCategory.PARSE)
    found = payload.get("metadata")
    batch: Mapping[str, Any] = found if isinstance(found, Mapping) else payload
    state = str(batch.get("state") or "")
    terminal = state in TERMINAL_STATES
    error = payload.get("error")
    errors: tuple[tuple[str, str], ...] = ()
    if isinstance(error, Mapping):
        errors = ((str(error.get("code") or ""), str(error.get("message") or "no message")),)
    try:
        metadata = json.loads(str(batch.get("displayName") or ""))
    except ValueError:
        metadata = None
    return BatchInfo(
        id=payload["name"], status=state, terminal=terminal,
        result_files=(payload["name"],) if terminal else (),
        errors=errors,
        metadata={str(k): str(v) for k, v in metadata.items()} if isinstance(metadata, dict) else {},
    )


def display_name_of(metadata: Mapping[str, str]) -> str:
    """A batch's ``displayName``: ``metadata`` as compact JSON, its pairs in order while it stays within
    :data:`DISPLAY_NAME_CHARS` (the first pair, what ``find`` looks for, always)."""
    kept: dict[str, str] = {}
    for key, value in metadata.items():
        trial = json.dumps({**kept, key: value}, separators=(",", ":"))
        if kept and len(trial) > DISPLAY_NAME_CHARS:
            break
        kept[key] = value
    return json.dumps(kept, separators=(",", ":"))


def create_outcome_unknown(exc: ProviderError) -> bool:
    """Whether a failed create may still have made the batch: no answer, an unreadable one, or a
    server error that may have come after the work; a refusal (4xx, 429, 503) made nothing."""
    return outcome_unknown(exc, _REFUSED_STATUSES)


def error_of(status: int, body: Any, headers: Mapping[str, str]) -> ProviderError:
    from ._errors import error_from_body  # the gemini helper's table: errors read as live calls read them

    return error_from_body(status, body, headers)


def _text_of(value: Any) -> str:
    if isinstance(value, Mapping):
        parts = value.get("parts")
        return "\n".join(str(p.get("text")) for p in (parts if isinstance(parts, list) else ())
                         if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return ""


def request_text(body: Mapping[str, Any]) -> str:
    """All the text a request carries (system instruction and contents), for the enqueued-token estimate."""
    contents = body.get("contents")
    parts = [_text_of(body.get("systemInstruction"))]
    parts += [_text_of(c) for c in (contents if isinstance(contents, list) else ())]
    return "\n".join(part for part in parts if part)


def _line_outcome(entry: Mapping[str, Any]) -> BatchItemOutcome | None:
    if "response" in entry:
        from ._wire import read_response

        try:
            text, usage, metadata = read_response(entry["response"])
        except ProviderError as exc:
            return BatchItemOutcome(error=exc)
        return BatchItemOutcome(text=text, usage=usage, metadata=dict(metadata))
    error = entry.get("error")
    if isinstance(error, Mapping):
        code = error.get("code")
        status, name = _GRPC.get(code if isinstance(code, int) else 2, (500, "UNKNOWN"))
        body = {"error": {"code": status, "message": str(error.get("message") or "no message"),
                          "status": name, "details": error.get("details") or []}}
        return BatchItemOutcome(metadata={"status_code": status}, error=error_of(status, body, {}))
    return None


def decode_batch(batch: BatchInfo, content: bytes, item_ids: Sequence[str]) -> dict[str, BatchItemOutcome]:
    """Each item's outcome from a finished batch (``content``: its operation as JSON), by item id."""
    try:
        payload = json.loads(content)
    except ValueError:
        return {}
    meta = payload.get("metadata") if isinstance(payload, Mapping) else None
    output = (meta.get("output") if isinstance(meta, Mapping) else None) or (
        payload.get("response") if isinstance(payload, Mapping) else None)
    inlined = output.get("inlinedResponses") if isinstance(output, Mapping) else None
    entries = inlined.get("inlinedResponses") if isinstance(inlined, Mapping) else None
    known = set(item_ids)
    outcomes: dict[str, BatchItemOutcome] = {}
    for index, entry in enumerate(entries if isinstance(entries, list) else ()):
        if not isinstance(entry, Mapping):
            continue
        key = (entry.get("metadata") or {}).get("key") if isinstance(entry.get("metadata"), Mapping) else None
        item_id = key if isinstance(key, str) and key in known else None
        if item_id is None and key is None and index < len(item_ids):
            item_id = item_ids[index]  # no metadata echoed: the answers are in input order
        outcome = _line_outcome(entry) if item_id is not None else None
        if item_id is not None and outcome is not None:
            outcomes[item_id] = outcome
    if batch.status in _UNRUN_STATES:
        never = ProviderError(f"the batch ended {batch.status} before this request ran",
                              category=ErrorCategory.TIMEOUT)
        for item_id in item_ids:
            outcomes.setdefault(item_id, BatchItemOutcome(error=never, executed=False))
    return outcomes


@final
class GeminiBatchEndpoint(InlineBatchEndpoint):
    """The :class:`BatchEndpoint` of a :class:`GeminiStrategy`; see the module docstring."""

    max_file_bytes: int = INLINE_REQUEST_BYTES
    """The largest request file a batch takes (runs chunk by the smaller of this and their own)."""
    _refused_statuses = _REFUSED_STATUSES

    def _line(self, item_id: str, body: dict[str, Any]) -> bytes:
        return json_line({"request": body, "metadata": {"key": item_id}})

    def _request_text(self, body: Mapping[str, Any]) -> str:
        return request_text(body)

    def _decode_file(self, batch: BatchInfo, content: bytes,
                     item_ids: Sequence[str]) -> dict[str, BatchItemOutcome]:
        return decode_batch(batch, content, item_ids)

    def connect(self, *, request_timeout: float, start_before: float) -> GeminiBatchConnection:
        return GeminiBatchConnection(self._strategy, request_timeout=request_timeout,
                                     start_before=start_before)


@final
class GeminiBatchConnection(InlineBatchConnection):
    """The batch-mode requests of one drive segment; see the module docstring."""

    def __init__(self, strategy: InlineEndpointSettings, *, request_timeout: float,
                 start_before: float) -> None:
        super().__init__(strategy, key_header="x-goog-api-key", error_of=error_of,
                         request_timeout=request_timeout, start_before=start_before)
        self._model = _model_path(strategy.model)
        self._root = "/" + str(getattr(strategy, "api_version", None) or "v1beta")

    async def create(self, input_file_id: str, *, completion_window: str, metadata: Mapping[str, str],
                     sending: SendMark | None = None) -> BatchInfo:
        """Create a batch of the kept file; its ``displayName`` is ``metadata`` as compact JSON."""
        content = self._files.get(input_file_id)
        requests = await anyio.to_thread.run_sync(_requests_of, content)
        display_name = display_name_of(metadata)
        body = {"batch": {"displayName": display_name, "model": self._model,
                          "inputConfig": {"requests": {"requests": requests}}}}
        payload = await self._requests.json("POST", f"{self._root}/{self._model}:batchGenerateContent",
                                            json_body=body, sending=sending)
        self._files.drop(input_file_id)
        return batch_info(payload)

    async def retrieve(self, batch_id: str) -> BatchInfo | None:
        return await self._requests.found(batch_info, "GET", f"{self._root}/{_name(batch_id)}")

    async def cancel(self, batch_id: str) -> None:
        await self._requests.json("POST", f"{self._root}/{_name(batch_id)}:cancel")

    async def download(self, file_id: str) -> bytes:
        """The finished batch itself (its answers are inline)."""
        return await self._requests.content(f"{self._root}/{_name(file_id)}")

    async def find(self, key: str, value: str) -> BatchInfo | None:
        """The newest batch whose ``displayName`` metadata has ``key == value``; ``None`` if none has."""
        await self._requests.gate()
        token: str | None = None
        for _ in range(_MAX_LIST_PAGES):
            page = await self._requests.page(f"{self._root}/batches", size=("pageSize", _LIST_PAGE),
                                             cursor=("pageToken", token))
            operations = page.get("operations") if isinstance(page, Mapping) else None
            for entry in operations if isinstance(operations, list) else ():
                if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
                    info = batch_info(entry)
                    if info.metadata.get(key) == value:
                        return info
            token = page.get("nextPageToken") if isinstance(page, Mapping) else None
            if not isinstance(token, str) or not token:
                return None
        return None


def _requests_of(content: bytes) -> list[Any]:
    return [json.loads(raw) for raw in content.splitlines() if raw.strip()]
