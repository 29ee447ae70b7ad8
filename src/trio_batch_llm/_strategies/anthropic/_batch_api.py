"""Anthropic's Message Batches API as a :class:`BatchEndpoint` (``AnthropicStrategy.batch_endpoint()``).

The request file is ours: one JSON line ``{custom_id, params}`` per item,
``params`` exactly what ``messages.create`` takes (``strategy.request_body``).
"Uploading" it keeps it in the connection (Anthropic has no file upload for
batches); the create sends its requests inline to ``POST
/v1/messages/batches``. Results come back as JSONL from ``GET
…/{id}/results`` once the batch has ended: ``succeeded`` (read by
``_wire.read_message``), ``errored`` (the live error body, read by
``_errors.error_from_body``), ``canceled`` / ``expired`` (never run: no
attempt used).

Custom ids: Anthropic takes ``^[a-zA-Z0-9_-]{1,64}$``, so an item's is a
digest of its id (``decode_results`` maps it back from the batch's item ids).

Finding a batch: Message Batches carry no metadata. The create prefixes every
custom id with a tag, a digest of its *first* metadata pair (a run puts its
submission id first), and :meth:`AnthropicBatchConnection.find` lists the
batches and reads the first result line of each *ended* one: the batch whose
custom ids carry the tag is the one the create made. A batch still in progress
cannot be told apart (its requests are not readable), so ``find`` answers
``None`` until it has ended, and never guesses: a run with an unknown create
waits (submitting nothing new) until the batch ends and is found, or until an
operator resolves it. Ended batches already read are remembered per endpoint.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final, final

import anyio
import anyio.lowlevel

from ..._values._categories import ErrorCategory
from ..._values._errors import ProviderError
from .._batch import BatchInfo, BatchItemOutcome, SendMark
from .._batch_requests import (
    BatchResource,
    InlineBatchConnection,
    InlineBatchEndpoint,
    InlineEndpointSettings,
    json_line,
)
from .._batch_requests import create_outcome_unknown as outcome_unknown

__all__ = ["AnthropicBatchConnection", "AnthropicBatchEndpoint", "batch_info", "custom_id_of"]

API_VERSION: Final = "2023-06-01"
_PATH: Final = "/v1/messages/batches"
_LIST_PAGE: Final = 100
_MAX_LIST_PAGES: Final = 20
_TAG_CHARS: Final = 20
_DIGEST_CHARS: Final = 43  # tag + "_" + digest: Anthropic's 64-character custom id
# Statuses after which a create certainly made nothing: refused before any work (529: overloaded).
_REFUSED_STATUSES: Final = frozenset({400, 401, 402, 403, 404, 409, 413, 415, 422, 429, 503, 529})
_ERROR_STATUS: Final = {"invalid_request_error": 400, "authentication_error": 401, "billing_error": 402,
                        "permission_error": 403, "not_found_error": 404, "request_too_large": 413,
                        "rate_limit_error": 429, "api_error": 500, "timeout_error": 504,
                        "overloaded_error": 529}


def custom_id_of(item_id: str) -> str:
    """An item's custom id in a request file: a digest (Anthropic's custom ids are 64 word characters)."""
    return hashlib.sha256(item_id.encode()).hexdigest()[:_DIGEST_CHARS]


def _tag(key: str, value: str) -> str:
    return hashlib.sha256(f"{key}\x00{value}".encode()).hexdigest()[:_TAG_CHARS]


def batch_info(payload: Any) -> BatchInfo:
    """A MessageBatch, as a run sees it (its one result "file" is its own id, once it has ended)."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get("id"), str):
        raise ProviderError("a message batch without an id", category=ErrorCategory.PARSE)
    status = str(payload.get("processing_status") or "")
    ended = status == "ended"
    return BatchInfo(id=payload["id"], status=status, terminal=ended,
                     result_files=(payload["id"],) if ended and payload.get("results_url") else ())


def create_outcome_unknown(exc: ProviderError) -> bool:
    """Whether a failed create may still have made the batch: no answer, an unreadable one, or a
    server error that may have come after the work (500, 502, 504); a refusal made nothing."""
    return outcome_unknown(exc, _REFUSED_STATUSES)


def _text_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(_text_of(part.get("text") if isinstance(part, Mapping) else part) for part in value)
    return ""


def request_text(params: Mapping[str, Any]) -> str:
    """All the text a request carries (system prompt and messages), for the enqueued-token estimate."""
    messages = params.get("messages")
    parts = [_text_of(params.get("system"))]
    parts += [_text_of(m.get("content")) for m in (messages if isinstance(messages, list) else ())
              if isinstance(m, Mapping)]
    return "\n".join(part for part in parts if part)


def error_of(status: int, body: Any, headers: Mapping[str, str]) -> ProviderError:
    from ._errors import error_from_body  # the anthropic helper's module: errors read as live calls read them

    return error_from_body(status, body, headers)


def _line_outcome(result: Mapping[str, Any]) -> BatchItemOutcome | None:
    kind = result.get("type")
    if kind == "succeeded":
        from ._wire import read_message

        try:
            text, usage, metadata = read_message(result.get("message"))
        except ProviderError as exc:
            return BatchItemOutcome(error=exc)
        return BatchItemOutcome(text=text, usage=usage, metadata=dict(metadata))
    if kind == "errored":
        body = result.get("error")
        inner = body.get("error") if isinstance(body, Mapping) else None
        status = _ERROR_STATUS.get(str(inner.get("type")) if isinstance(inner, Mapping) else "", 500)
        error = error_of(status, body, {})
        return BatchItemOutcome(metadata={"status_code": status}, error=error)
    if kind in ("canceled", "expired"):
        failure = ProviderError(f"batch_{kind}: the batch ended before this request ran",
                                category=ErrorCategory.TIMEOUT)
        return BatchItemOutcome(error=failure, executed=False)
    return None


def decode_results_file(content: bytes, item_ids: Sequence[str]) -> dict[str, BatchItemOutcome]:
    """Each readable result line's outcome, by item id (an unreadable line's item gets none)."""
    by_custom_id = {custom_id_of(item_id): item_id for item_id in item_ids}
    outcomes: dict[str, BatchItemOutcome] = {}
    for raw in content.splitlines():
        try:
            line = json.loads(raw) if raw.strip() else None
        except ValueError:
            continue
        if not isinstance(line, Mapping) or not isinstance(line.get("custom_id"), str):
            continue
        item_id = by_custom_id.get(line["custom_id"].rpartition("_")[2])
        result = line.get("result")
        if item_id is not None and isinstance(result, Mapping):
            outcome = _line_outcome(result)
            if outcome is not None:
                outcomes[item_id] = outcome
    return outcomes


@final
class AnthropicBatchEndpoint(InlineBatchEndpoint):
    """The :class:`BatchEndpoint` of an :class:`AnthropicStrategy`; see the module docstring."""

    _refused_statuses = _REFUSED_STATUSES

    def __init__(self, strategy: InlineEndpointSettings) -> None:
        super().__init__(strategy)
        self._tags: dict[str, str] = {}  # ended batch id -> the tag of its custom ids (found by find)

    def _line(self, item_id: str, body: dict[str, Any]) -> bytes:
        return json_line({"custom_id": custom_id_of(item_id), "params": body})

    def _request_text(self, body: Mapping[str, Any]) -> str:
        return request_text(body)

    def _decode_file(self, batch: BatchInfo, content: bytes,
                     item_ids: Sequence[str]) -> dict[str, BatchItemOutcome]:
        return decode_results_file(content, item_ids)

    def connect(self, *, request_timeout: float, start_before: float) -> AnthropicBatchConnection:
        return AnthropicBatchConnection(self._strategy, self._tags, request_timeout=request_timeout,
                                        start_before=start_before)


@final
class AnthropicBatchConnection(InlineBatchConnection, BatchResource):
    """The Message Batches requests of one drive segment; see the module docstring."""

    _batches = _PATH
    _results = _PATH + "/{}/results"

    def __init__(self, strategy: InlineEndpointSettings, tags: dict[str, str], *, request_timeout: float,
                 start_before: float) -> None:
        super().__init__(strategy, key_header="x-api-key", error_of=error_of, request_timeout=request_timeout,
                         start_before=start_before, extra_headers={"anthropic-version": API_VERSION})
        self._tags = tags

    def _info(self, payload: Any) -> BatchInfo:
        return batch_info(payload)

    async def create(self, input_file_id: str, *, completion_window: str, metadata: Mapping[str, str],
                     sending: SendMark | None = None) -> BatchInfo:
        """Create a batch of the kept file; its custom ids carry the tag of ``metadata``'s first pair."""
        content = self._files.get(input_file_id)
        pairs = list(metadata.items())
        tag = _tag(*pairs[0]) if pairs else "untagged"
        requests = await anyio.to_thread.run_sync(_tagged_requests, content, tag)
        payload = await self._requests.json("POST", _PATH, json_body={"requests": requests}, sending=sending)
        self._files.drop(input_file_id)
        return batch_info(payload)

    async def find(self, key: str, value: str) -> BatchInfo | None:
        """The ended batch whose custom ids carry the tag of ``key=value``; ``None`` if none has (yet)."""
        tag = _tag(key, value)
        await self._requests.gate()
        after: str | None = None
        for _ in range(_MAX_LIST_PAGES):
            page = await self._requests.page(_PATH, size=("limit", _LIST_PAGE), cursor=("after_id", after))
            data = page.get("data") if isinstance(page, Mapping) else None
            if not isinstance(data, list) or not data:
                return None
            for entry in data:
                info = batch_info(entry)
                if info.terminal and info.result_files and await self._tag_of(info.id) == tag:
                    return info
            if not page.get("has_more") or not isinstance(page.get("last_id"), str):
                return None
            after = page["last_id"]
        return None

    async def _tag_of(self, batch_id: str) -> str | None:
        """The tag of an ended batch's custom ids (its first result line), remembered per endpoint."""
        await anyio.lowlevel.checkpoint()
        if batch_id not in self._tags:
            try:
                content = await self.download(batch_id)
            except ProviderError:
                return None
            first = content.split(b"\n", 1)[0]
            try:
                line = json.loads(first)
            except ValueError:
                return None
            custom_id = line.get("custom_id") if isinstance(line, Mapping) else None
            self._tags[batch_id] = custom_id.partition("_")[0] if isinstance(custom_id, str) else ""
        return self._tags[batch_id]


def _tagged_requests(content: bytes, tag: str) -> list[dict[str, Any]]:
    """The request file's lines as the create's ``requests``, each custom id prefixed with ``tag``."""
    requests = []
    for raw in content.splitlines():
        if raw.strip():
            line = json.loads(raw)
            requests.append({"custom_id": f"{tag}_{line['custom_id']}", "params": line["params"]})
    return requests
