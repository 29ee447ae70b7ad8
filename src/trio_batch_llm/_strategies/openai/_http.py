"""The one module that imports the HTTP client, ``httpx2``.

Everything HTTP-shaped crosses the rest of the library as plain data: a request
goes out as a JSON-able mapping, a reply comes back as :class:`HttpReply`, and a
transport failure comes back as a :class:`ProviderError` with its category (the
original ``httpx2`` exception chained as ``__cause__``). Strategies import this
module lazily, so ``import trio_batch_llm`` never imports ``httpx2``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, final

import httpx2

from ..._values._categories import ErrorCategory
from ..._values._errors import ProviderError
from ..._values._urls import redact_urls
from .._keys import Secret

__all__ = [
    "DEFAULT_TIMEOUT",
    "HttpReply",
    "PoolStatistics",
    "create_client",
    "encode_json_body",
    "is_async_client",
    "is_transport_error",
    "pool_limit",
    "pool_statistics",
    "post_json",
    "send_request",
    "transport_error",
]

DEFAULT_TIMEOUT = 600.0
"""Seconds for each phase of a request. Generous on purpose: the engine's cancel scopes bound attempts."""
_CONNECT_TIMEOUT = 10.0
_IDLE_WITHOUT_LIMIT = 100
_UNBOUNDED = 1 << 62  # httpcore2 stores Limits(max_connections=None) as sys.maxsize


@final
@dataclass(frozen=True, slots=True)
class HttpReply:
    """A complete response: status, headers (lower-cased names) and the whole body."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes


@final
@dataclass(frozen=True, slots=True)
class PoolStatistics:
    """Connections in a client's pool: ``active`` ones carry a request right now."""

    connections: int
    active: int
    idle: int


def _timeout(seconds: float | None) -> httpx2.Timeout:
    if seconds is None:
        return httpx2.Timeout(None)
    return httpx2.Timeout(seconds, connect=min(seconds, _CONNECT_TIMEOUT))


def create_client(
    *, concurrency: int | None = None, keepalive: int | None = None, timeout: float | None = DEFAULT_TIMEOUT
) -> httpx2.AsyncClient:
    """A client whose pool holds up to ``concurrency`` connections, and keeps that many alive.

    Without ``concurrency`` the pool is not a second, hidden limiter (the engine's
    admission bounds calls): it keeps ``keepalive`` idle connections (by default
    ``_IDLE_WITHOUT_LIMIT``), so a busy batch reuses connections instead of
    churning them, and opens more when more calls are admitted.
    """
    limits = (
        httpx2.Limits(max_connections=None, max_keepalive_connections=keepalive or _IDLE_WITHOUT_LIMIT)
        if concurrency is None
        else httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    )
    return httpx2.AsyncClient(limits=limits, timeout=_timeout(timeout))


def is_async_client(value: object) -> bool:
    return isinstance(value, httpx2.AsyncClient)


def encode_json_body(body: Mapping[str, Any]) -> bytes:
    """Compact UTF-8 JSON; a lone surrogate (which UTF-8 cannot carry) is an INVALID_REQUEST
    :class:`ProviderError`: the same request can never be sent, so it must not be retried."""
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise ProviderError(
            f"the request cannot be sent: its JSON has a lone surrogate (U+{ord(text[exc.start]):04X} at "
            f"character {exc.start}), which UTF-8 cannot encode; a prompt, system prompt or parameter "
            "holds it",
            category=ErrorCategory.INVALID_REQUEST,
        ) from exc



def _reply(response: httpx2.Response) -> HttpReply:
    """The whole reply, its header names lowercased (a dict: the callers look headers up by name)."""
    return HttpReply(
        status_code=response.status_code,
        headers={name.lower(): value for name, value in response.headers.items()},
        content=response.content,
    )

async def post_json(
    client: httpx2.AsyncClient,
    url: str,
    body: Mapping[str, Any],
    *,
    headers: Mapping[str, str],
    timeout: float | None = None,
    secret: Secret | None = None,
) -> HttpReply:
    """POST ``body`` as compact JSON and read the whole reply.

    ``timeout`` (seconds) overrides the client's per-phase timeout for this call.
    Transport failures raise :class:`ProviderError` (the key in ``secret`` is
    scrubbed from the message). Cancellation propagates untouched; httpx2 closes
    the half-used connection on the way out, so nothing stays checked out of the pool.
    """
    content = encode_json_body(body)
    request_headers = {"content-type": "application/json", **headers}
    try:
        if timeout is None:
            response = await client.post(url, content=content, headers=request_headers)
        else:
            response = await client.post(url, content=content, headers=request_headers,
                                         timeout=_timeout(timeout))
    except httpx2.HTTPError as exc:
        raise transport_error(exc, secret=secret) from exc
    return _reply(response)


async def send_request(
    client: httpx2.AsyncClient,
    method: str,
    url: str,
    *,
    headers: Mapping[str, str],
    json_body: Mapping[str, Any] | None = None,
    upload: tuple[str, str, bytes] | None = None,
    form: Mapping[str, str] | None = None,
    params: Mapping[str, str | int] | None = None,
    timeout: float | None = None,
    secret: Secret | None = None,
) -> HttpReply:
    """Send one request of any shape the Batch API needs and read the whole reply.

    ``json_body`` is sent as compact JSON; ``upload`` is ``(field, filename, bytes)``
    sent as multipart/form-data together with the ``form`` fields. Failures map as
    in :func:`post_json`; a status code is the caller's to judge.
    """
    request_headers = dict(headers)
    content: bytes | None = None
    if json_body is not None:
        content = encode_json_body(json_body)
        request_headers["content-type"] = "application/json"
    files = None
    if upload is not None:
        field, filename, data = upload
        files = {field: (filename, data, "application/jsonl")}
    extra: dict[str, Any] = {} if timeout is None else {"timeout": _timeout(timeout)}
    try:
        response = await client.request(
            method, url, content=content, files=files, data=dict(form) if form else None,
            params=dict(params) if params else None, headers=request_headers, **extra,
        )
    except httpx2.HTTPError as exc:
        raise transport_error(exc, secret=secret) from exc
    return _reply(response)


def transport_error(exc: BaseException, *, secret: Secret | None = None) -> ProviderError:
    """The :class:`ProviderError` for an ``httpx2`` failure that produced no HTTP response.

    Timeouts are TIMEOUT; refused, reset or half-closed connections are TRANSIENT;
    a body that cannot be decoded is PARSE; a request we could not even form
    (bad scheme, illegal header) is INVALID_REQUEST. The caller chains ``exc``.
    """
    category = ErrorCategory.UNKNOWN
    if isinstance(exc, httpx2.TimeoutException):
        category = ErrorCategory.TIMEOUT
    elif isinstance(exc, (httpx2.UnsupportedProtocol, httpx2.LocalProtocolError)):
        category = ErrorCategory.INVALID_REQUEST
    elif isinstance(exc, httpx2.TransportError):
        category = ErrorCategory.TRANSIENT
    elif isinstance(exc, httpx2.DecodingError):
        category = ErrorCategory.PARSE
    detail = str(exc) or "no detail"
    message = redact_urls(f"{type(exc).__name__}: {detail}")
    if secret is not None:
        message = secret.redact(message)
    return ProviderError(message, category=category)


def is_transport_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an ``httpx2`` failure that produced no HTTP response."""
    return isinstance(exc, httpx2.HTTPError) and not isinstance(exc, httpx2.HTTPStatusError)


def pool_limit(client: Any) -> int | None:
    """The most connections ``client``'s default transport opens (an ``httpx2`` or ``httpx`` client,
    or an SDK client holding one as ``_client``); ``None`` when unbounded or not readable."""
    for holder in (client, getattr(client, "_client", None)):
        pool = getattr(getattr(holder, "_transport", None), "_pool", None)
        limit = getattr(pool, "_max_connections", None)
        if isinstance(limit, int) and not isinstance(limit, bool):
            return limit if limit < _UNBOUNDED else None
    return None


def pool_statistics(client: Any) -> PoolStatistics:
    """Connections in the default transport's pool (for tests and diagnostics).

    Reads httpcore2's public ``connections`` list and each connection's
    ``is_idle()``/``is_closed()``; a client on a custom transport reports zeros.
    """
    transport = getattr(client, "_transport", None)
    pool = getattr(transport, "_pool", None)
    connections = [c for c in getattr(pool, "connections", ()) if not c.is_closed()]
    idle = sum(1 for c in connections if c.is_idle())
    return PoolStatistics(connections=len(connections), active=len(connections) - idle, idle=idle)
