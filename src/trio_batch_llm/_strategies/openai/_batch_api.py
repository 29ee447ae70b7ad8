"""OpenAI's Files and Batch APIs as a :class:`BatchEndpoint`, spoken over ``_http`` (httpx2).

:class:`OpenAIBatchEndpoint` is what both OpenAI strategies offer from
``batch_endpoint()``: their ``base_url``, key, model and request settings, the
request lines and result files of :mod:`._batch_lines`. Its
:class:`OpenAIBatchConnection` (one per drive segment) sends through a
:class:`~.._batch_requests.BatchRequests`, as the Anthropic and Gemini ones
do: it owns an HTTP client (opened at its first request), or borrows the
``client=`` of an :class:`OpenAICompatibleStrategy`, which it never closes.

Every request first passes the gate: at or after ``start_before`` no request
starts (the caller's cancel scope fires at that deadline, so a request that
would start then parks until it does). Each request is bounded by
``request_timeout``; a request that gets no answer raises
:class:`ProviderError` with ``status_code=None``, which for a *create* means
its outcome is unknown (see :func:`create_outcome_unknown`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol, final

from ..._values._categories import ErrorCategory
from ..._values._errors import ProviderError
from ..._values._openai_text import openai_prompt_text
from ..._values._prompts import LLMRequest
from .._batch import BatchInfo, BatchItemOutcome, SendMark
from .._batch_requests import BatchRequests, BatchResource, EndpointSettings, ProviderBatchEndpoint
from .._batch_requests import create_outcome_unknown as outcome_unknown
from ._batch_lines import decode_result_files, request_line
from ._wire import API_PATHS, Api
from ._wire_errors import error_from_status

__all__ = ["OpenAIBatchConnection", "OpenAIBatchEndpoint", "batch_info", "create_outcome_unknown"]

TERMINAL_BATCH_STATUSES: Final = frozenset({"completed", "failed", "expired", "cancelled"})
_TOKEN_LIMIT_CODES: Final = frozenset({"token_limit_exceeded"})
_LIST_PAGE: Final = 100
_MAX_LIST_PAGES: Final = 20
# Statuses after which a create certainly made nothing: the request was refused before any work.
_REFUSED_STATUSES: Final = frozenset({400, 401, 402, 403, 404, 409, 413, 415, 422, 429, 503})


class OpenAIEndpointSettings(EndpointSettings, Protocol):
    """What the Batch API uses of an OpenAI strategy (both strategies have it)."""

    api: Api

    def request_headers(self) -> dict[str, str]: ...

    def http_client(self) -> object | None: ...

    def batch_request_body(self, prompt: str | LLMRequest) -> dict[str, Any]: ...


def batch_info(payload: Any) -> BatchInfo:
    """A batch object of the API, as a run sees it."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get("id"), str):
        raise ProviderError("a batch object without an id", category=ErrorCategory.PARSE)
    errors = payload.get("errors") or {}
    data = errors.get("data") if isinstance(errors, Mapping) else None
    entries = [entry for entry in (data if isinstance(data, list) else ()) if isinstance(entry, Mapping)]
    pairs = tuple((str(entry.get("code") or ""), str(entry.get("message") or "")) for entry in entries)
    lines = {
        entry["line"]: f"{entry.get('code') or 'invalid'}: {entry.get('message') or 'no message'}"
        for entry in entries
        if isinstance(entry.get("line"), int)
    }
    metadata = payload.get("metadata")
    status = str(payload.get("status") or "")
    files = (payload.get("output_file_id") or None, payload.get("error_file_id") or None)
    return BatchInfo(
        id=payload["id"],
        status=status,
        terminal=status in TERMINAL_BATCH_STATUSES,
        capacity_refused=status == "failed" and any(code in _TOKEN_LIMIT_CODES for code, _ in pairs),
        result_files=tuple(f for f in files if isinstance(f, str)),
        errors=pairs,
        error_lines=lines,
        metadata={str(k): str(v) for k, v in metadata.items()} if isinstance(metadata, Mapping) else {},
    )


def create_outcome_unknown(exc: ProviderError) -> bool:
    """Whether a failed create may still have created the batch.

    No answer (a timeout, a lost connection), an answer we could not read, or a
    server error that may have come after the work (500, 502, 504) leave it
    unknown; a refusal (4xx, 429, 503) created nothing.
    """
    return outcome_unknown(exc, _REFUSED_STATUSES)


@final
class OpenAIBatchEndpoint(ProviderBatchEndpoint[OpenAIEndpointSettings]):
    """The :class:`BatchEndpoint` of an OpenAI strategy; see the module docstring."""

    _refused_statuses = _REFUSED_STATUSES

    def __init__(self, strategy: OpenAIEndpointSettings) -> None:
        super().__init__(strategy)
        self._api: Api = strategy.api
        self._url = "/v1" + API_PATHS[strategy.api]

    def _body(self, request: LLMRequest) -> dict[str, Any]:
        return self._strategy.batch_request_body(request)

    def _line(self, item_id: str, body: dict[str, Any]) -> bytes:
        return request_line(item_id, self._url, body)

    def _request_text(self, body: Mapping[str, Any]) -> str:
        return openai_prompt_text(self._api, body) or ""  # "": the item's text counts instead

    def decode_results(
        self, batch: BatchInfo, files: Sequence[bytes], item_ids: Sequence[str]
    ) -> dict[str, BatchItemOutcome]:
        outcomes = decode_result_files(self._api, files)
        # The request file was written in the order of item_ids: a rejected line names its item.
        for line, text in batch.error_lines.items():
            if 1 <= line <= len(item_ids):
                rejected = ProviderError(f"batch {batch.id} rejected its line {line}: {text}",
                                         category=ErrorCategory.INVALID_REQUEST)
                outcomes[item_ids[line - 1]] = BatchItemOutcome(error=rejected)
        return outcomes

    def connect(self, *, request_timeout: float, start_before: float) -> OpenAIBatchConnection:
        return OpenAIBatchConnection(self._strategy, self._url, request_timeout=request_timeout,
                                     start_before=start_before)


@final
class OpenAIBatchConnection(BatchResource):
    """The Files and Batch API requests of one drive segment; see the module docstring."""

    _batches = "/batches"
    _results = "/files/{}/content"

    def __init__(self, strategy: OpenAIEndpointSettings, endpoint: str, *, request_timeout: float,
                 start_before: float) -> None:
        secret = strategy.secret

        def error_of(status: int, body: Any, headers: Mapping[str, str]) -> ProviderError:
            return error_from_status(status, headers, body, secret=secret)

        self._endpoint = endpoint
        self._requests = BatchRequests(base_url=strategy.base_url, headers=strategy.request_headers(),
                                       secret=secret, error_of=error_of, request_timeout=request_timeout,
                                       start_before=start_before, client=strategy.http_client())

    def _info(self, payload: Any) -> BatchInfo:
        return batch_info(payload)

    async def aclose(self) -> None:
        await self._requests.aclose()

    async def upload(self, filename: str, content: bytes) -> str:
        """Upload a request file (purpose ``batch``); its file id."""
        payload = await self._requests.json("POST", "/files", upload=("file", filename, content),
                                            form={"purpose": "batch"})
        file_id = payload.get("id") if isinstance(payload, Mapping) else None
        if not isinstance(file_id, str):
            raise ProviderError("POST /files: the answer has no file id", category=ErrorCategory.PARSE)
        return file_id

    async def create(self, input_file_id: str, *, completion_window: str,
                     metadata: Mapping[str, str], sending: SendMark | None = None) -> BatchInfo:
        """Create a batch; ``sending.sent`` turns true once the request may have left (past the gate)."""
        body = {"input_file_id": input_file_id, "endpoint": self._endpoint,
                "completion_window": completion_window, "metadata": dict(metadata)}
        return batch_info(await self._requests.json("POST", "/batches", json_body=body, sending=sending))

    async def find(self, key: str, value: str) -> BatchInfo | None:
        """The newest batch whose metadata has ``key == value``; ``None`` if the listing has none.

        Pages through ``GET /batches`` (newest first, at most a few thousand
        batches back). A provider without a listing answers 404: also ``None``.
        """
        await self._requests.gate()
        after: str | None = None
        for _ in range(_MAX_LIST_PAGES):
            page = await self._requests.page("/batches", size=("limit", _LIST_PAGE), cursor=("after", after))
            data = page.get("data") if isinstance(page, Mapping) else None
            if not isinstance(data, list) or not data:
                return None
            for entry in data:
                if isinstance(entry, Mapping) and (entry.get("metadata") or {}).get(key) == value:
                    return batch_info(entry)
            if not page.get("has_more"):
                return None
            last = data[-1]
            after = last.get("id") if isinstance(last, Mapping) else None
            if not isinstance(after, str):
                return None
        return None
