"""The request plumbing of a provider's Batch API connection: a gate, a bound, a client, errors mapped.

:class:`BatchRequests` is what the OpenAI, Anthropic and Gemini batch
connections share: no request starts at or after ``start_before`` (it parks
until the caller's cancel scope ends it), each is bounded by
``request_timeout`` (no answer: :class:`ProviderError` with
``status_code=None``), a non-2xx answer becomes the provider's own
:class:`ProviderError` through ``error_of(status, body, headers)``, and the
HTTP client (``_strategies/openai/_http``, the one module that imports
httpx2) is either the caller's ``client=`` (borrowed, never closed) or opened
lazily and closed, bounded and shielded, by :meth:`aclose`.

:class:`KeptRequestFiles` is the "upload" of a provider whose batches take
their requests inline (Anthropic, Gemini): the file stays in the connection
under a local id until the create takes it back.

:class:`ProviderBatchEndpoint` is the pure half the three endpoints share: the
capacity scope of their strategy, an item's request line built from the body the
strategy sends, and a failed create judged by the provider's refusal statuses;
each provider says only its body, its line, the text it counts and its refusals.
:class:`InlineBatchEndpoint` and :class:`InlineBatchConnection` add what the
Anthropic and Gemini endpoints share beyond that: a finished batch's outcomes read
file by file, and the "upload" that keeps the file for the create. :class:`BatchResource`
is what the OpenAI and Anthropic connections share: a batch retrieved, cancelled and its
results downloaded, told apart only by their paths.

The helpers below them are what the three endpoints read alike: their capacity
scope, a run's prompt text as an :class:`LLMRequest`, a request line as
compact JSON, and whether a failed create may still have made the batch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeVar, final

import anyio
import anyio.lowlevel

from .._values._categories import ErrorCategory
from .._values._errors import ProviderError
from .._values._prompts import LLMRequest, request_of_text
from .._values._urls import join_url, redact_url
from ._batch import BatchInfo, BatchItemOutcome, BatchRequest, SendMark
from ._keys import Secret
from .openai._wire_errors import decode_error_body

__all__ = ["BatchRequests", "BatchResource", "EndpointSettings", "ErrorOf", "InlineBatchConnection",
           "InlineBatchEndpoint", "InlineEndpointSettings", "KeptRequestFiles", "ProviderBatchEndpoint",
           "capacity_scope", "create_outcome_unknown", "json_line", "keyed_requests", "llm_request_of",
           "page_of"]

T = TypeVar("T")

ErrorOf = Callable[[int, Any, Mapping[str, str]], ProviderError]
"""``(status, decoded body, headers) -> ProviderError``: the provider's reading of a failed answer."""


@final
class BatchRequests:
    """One drive segment's HTTP requests to one provider; see the module docstring."""

    def __init__(self, *, base_url: str, headers: Mapping[str, str], secret: Secret | None,
                 error_of: ErrorOf, request_timeout: float, start_before: float,
                 client: object = None) -> None:
        from .openai import _http  # lazily: `import trio_batch_llm` stays httpx2-free

        self._http = _http
        self._base = base_url
        self._headers = dict(headers)
        self._secret = secret
        self._error_of = error_of
        self._timeout = request_timeout
        self._deadline = start_before
        self._borrowed = client is not None  # the caller's client: the caller closes it
        self._client: Any = client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is None or self._borrowed:
            await anyio.lowlevel.checkpoint()
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):  # bounded: closes idle sockets
            await client.aclose()

    async def gate(self) -> None:
        """Start nothing at or after the deadline: park until the caller's scope ends this."""
        if anyio.current_time() >= self._deadline:
            await anyio.sleep_forever()
        await anyio.lowlevel.checkpoint()

    async def send(self, method: str, path: str, *, sending: SendMark | None = None, **kwargs: Any) -> Any:
        """The 2xx reply of one request (``kwargs`` as ``_http.send_request`` takes them)."""
        await self.gate()
        if self._client is None:
            self._client = self._http.create_client(concurrency=4, timeout=self._timeout)
        if sending is not None:
            sending.sent = True  # from here on the request may reach the provider
        reply = None
        with anyio.move_on_after(self._timeout):
            reply = await self._http.send_request(
                self._client, method, join_url(self._base, path), headers=self._headers,
                timeout=self._timeout, secret=self._secret, **kwargs,
            )
        if reply is None:
            raise ProviderError(f"{method} {path}: no answer within {self._timeout} s",
                                category=ErrorCategory.TIMEOUT)
        if not 200 <= reply.status_code < 300:
            raise self._error_of(reply.status_code, decode_error_body(reply.content), reply.headers)
        return reply

    async def json(self, method: str, path: str, *, sending: SendMark | None = None, **kwargs: Any) -> Any:
        """The decoded JSON of one request's 2xx reply."""
        reply = await self.send(method, path, sending=sending, **kwargs)
        try:
            return json.loads(reply.content)
        except ValueError:
            raise ProviderError(f"{method} {path}: the answer is not JSON",
                                category=ErrorCategory.PARSE, status_code=reply.status_code) from None

    async def content(self, path: str) -> bytes:
        """The body of a 2xx reply to ``GET path`` (a result file)."""
        reply = await self.send("GET", path)
        content: bytes = reply.content
        return content

    async def page(self, path: str, *, size: tuple[str, int],
                   cursor: tuple[str, str | None]) -> Mapping[str, Any]:
        """One page of a listing: ``size`` is ``(parameter, count)``, ``cursor`` ``(parameter, value)`` once
        a page gave one; ``{}`` where the provider has no listing (404) or answers no object."""
        params: dict[str, str | int] = {size[0]: size[1]}
        if cursor[1] is not None:
            params[cursor[0]] = cursor[1]
        return await self.found(page_of, "GET", path, params=params) or {}

    async def found(self, read: Callable[[Any], T], method: str, path: str, **kwargs: Any) -> T | None:
        """``read`` of the decoded JSON of a 2xx reply; ``None`` where the provider answers 404 (no such
        batch, no listing)."""
        try:
            payload = await self.json(method, path, **kwargs)
        except ProviderError as exc:
            if exc.status_code == 404:
                await anyio.lowlevel.checkpoint()  # the error may have come before any checkpoint
                return None
            raise
        return read(payload)


def keyed_requests(strategy: Any, *, key_header: str, error_of: ErrorOf, request_timeout: float,
                   start_before: float, extra_headers: Mapping[str, str] | None = None) -> BatchRequests:
    """The :class:`BatchRequests` of a strategy that sends its key in a header of its own (Anthropic's
    ``x-api-key``, Gemini's ``x-goog-api-key``): its ``headers`` (if it has any), ``extra_headers``,
    then the key, to its ``base_url``."""
    secret: Secret | None = strategy.secret
    headers = {**dict(getattr(strategy, "headers", None) or {}), **(extra_headers or {})}
    if secret is not None:
        headers[key_header] = secret.reveal()
    return BatchRequests(base_url=strategy.base_url, headers=headers, secret=secret, error_of=error_of,
                         request_timeout=request_timeout, start_before=start_before)


@final
class KeptRequestFiles:
    """Request files "uploaded" to a connection whose provider takes a batch's requests inline."""

    def __init__(self) -> None:
        self._files: dict[str, bytes] = {}

    async def keep(self, filename: str, content: bytes) -> str:
        """Keep ``content``; its local file id (what ``upload`` answers)."""
        await anyio.lowlevel.checkpoint()
        file_id = f"local-{len(self._files) + 1}-{filename}"
        self._files[file_id] = content
        return file_id

    def get(self, file_id: str) -> bytes:
        """A kept file, for the create (it stays kept until :meth:`drop`: a failed create may be retried)."""
        content = self._files.get(file_id)
        if content is None:
            raise ProviderError(f"no request file {file_id!r} in this connection",
                                category=ErrorCategory.INVALID_REQUEST)
        return content

    def drop(self, file_id: str) -> None:
        self._files.pop(file_id, None)

    def clear(self) -> None:
        self._files.clear()



class EndpointSettings(Protocol):
    """What every provider's batches use of its strategy: where, which key, which model."""

    base_url: str
    model: str

    @property
    def secret(self) -> Secret | None: ...


class InlineEndpointSettings(EndpointSettings, Protocol):
    """What the batches of a provider that takes their requests inline use of its strategy."""

    def request_body(self, prompt: str | LLMRequest) -> dict[str, Any]: ...


S = TypeVar("S", bound=EndpointSettings)


class ProviderBatchEndpoint(Generic[S]):
    """The pure half of a :class:`BatchEndpoint` over a strategy's settings; see the module docstring.

    A subclass gives the body the strategy sends (:meth:`_body`), its request-file line
    (:meth:`_line`), the text a request counts for the enqueued-token estimate
    (:meth:`_request_text`) and the statuses of a create refused before any work.
    """

    _refused_statuses: ClassVar[frozenset[int]]

    def __init__(self, strategy: S) -> None:
        self._strategy = strategy

    @property
    def capacity_scope(self) -> str:
        return capacity_scope(self._strategy.base_url, self._strategy.secret, self._strategy.model)

    def encode_request(self, item_id: str, prompt: str) -> BatchRequest:
        request = llm_request_of(prompt)
        body = self._body(request)
        return BatchRequest(line=self._line(item_id, body), text=self._request_text(body) or request.text)

    def create_outcome_unknown(self, error: ProviderError) -> bool:
        return create_outcome_unknown(error, self._refused_statuses)

    def _body(self, request: LLMRequest) -> dict[str, Any]:
        raise NotImplementedError

    def _line(self, item_id: str, body: dict[str, Any]) -> bytes:
        raise NotImplementedError

    def _request_text(self, body: Mapping[str, Any]) -> str:
        raise NotImplementedError


class InlineBatchEndpoint(ProviderBatchEndpoint[InlineEndpointSettings]):
    """A :class:`ProviderBatchEndpoint` whose provider takes a batch's requests inline; a subclass
    also says how one result file reads (:meth:`_decode_file`)."""

    def _body(self, request: LLMRequest) -> dict[str, Any]:
        return self._strategy.request_body(request)

    def decode_results(
        self, batch: BatchInfo, files: Sequence[bytes], item_ids: Sequence[str]
    ) -> dict[str, BatchItemOutcome]:
        outcomes: dict[str, BatchItemOutcome] = {}
        for content in files:
            outcomes.update(self._decode_file(batch, content, item_ids))
        return outcomes

    def _decode_file(self, batch: BatchInfo, content: bytes,
                     item_ids: Sequence[str]) -> dict[str, BatchItemOutcome]:
        raise NotImplementedError


class BatchResource:
    """The one-request operations on a batch of a provider that names it ``{batches}/{id}`` and
    cancels it with ``POST {batches}/{id}/cancel``, answered with the batch (OpenAI, Anthropic):
    each connection says only its paths and its reading of a batch (:meth:`_info`)."""

    _requests: BatchRequests
    _batches: ClassVar[str]
    """The collection's path: a batch is ``{_batches}/{id}``."""
    _results: ClassVar[str]
    """The path of a finished batch's results file, ``{}`` for the file id."""

    def _info(self, payload: Any) -> BatchInfo:
        raise NotImplementedError

    async def retrieve(self, batch_id: str) -> BatchInfo | None:
        return await self._requests.found(self._info, "GET", f"{self._batches}/{batch_id}")

    async def cancel(self, batch_id: str) -> None:
        self._info(await self._requests.json("POST", f"{self._batches}/{batch_id}/cancel"))

    async def download(self, file_id: str) -> bytes:
        return await self._requests.content(self._results.format(file_id))


class InlineBatchConnection:
    """The requests of one drive segment to a provider that takes a batch's requests inline, sent with
    its key in a header of its own (:func:`keyed_requests`): the "upload" keeps the file, which the
    create takes back (and drops once the batch is made)."""

    def __init__(self, strategy: InlineEndpointSettings, *, key_header: str, error_of: ErrorOf,
                 request_timeout: float, start_before: float,
                 extra_headers: Mapping[str, str] | None = None) -> None:
        self._requests = keyed_requests(strategy, key_header=key_header, error_of=error_of,
                                        request_timeout=request_timeout, start_before=start_before,
                                        extra_headers=extra_headers)
        self._files = KeptRequestFiles()

    async def aclose(self) -> None:
        self._files.clear()
        await self._requests.aclose()

    async def upload(self, filename: str, content: bytes) -> str:
        """Keep the request file for the create (the requests go inline)."""
        return await self._files.keep(filename, content)


def page_of(payload: Any) -> Mapping[str, Any]:
    """A listing page (``found``'s ``read`` for one): an answer that is not an object lists nothing."""
    return payload if isinstance(payload, Mapping) else {}


def capacity_scope(base_url: str, secret: Secret | None, model: str) -> str:
    """A batch endpoint's capacity scope: its host (redacted), its key's fingerprint, its model."""
    fingerprint = secret.fingerprint() if secret else "-"
    return f"batch|{redact_url(base_url)}|{fingerprint}|{model}"


def llm_request_of(prompt: str) -> LLMRequest:
    """A run's item text as the request it stands for (a run keeps messages or params as one text)."""
    message_or_text, params = request_of_text(prompt)
    return LLMRequest(message_or_text, params or {})


def json_line(line: Mapping[str, Any]) -> bytes:
    """One request-file line: compact JSON, UTF-8, newline-ended."""
    return json.dumps(line, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def create_outcome_unknown(exc: ProviderError, refused: frozenset[int]) -> bool:
    """Whether a failed create may still have made the batch.

    No answer (a timeout, a lost connection), an answer we could not read (a
    2xx means it was made), or a server error that may have come after the
    work leave it unknown; a status in ``refused`` (the provider's refusals,
    before any work) made nothing.
    """
    if exc.status_code is None or 200 <= exc.status_code < 300:
        return True
    return exc.status_code not in refused
