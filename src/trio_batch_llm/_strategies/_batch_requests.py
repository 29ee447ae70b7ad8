"""The request plumbing of a provider's Batch API connection: a gate, a bound, a client, errors mapped.

:class:`BatchRequests` is what the Anthropic and Gemini batch connections share
(the OpenAI one predates it and keeps its own): no request starts at or after
``start_before`` (it parks until the caller's cancel scope ends it), each is
bounded by ``request_timeout`` (no answer: :class:`ProviderError` with
``status_code=None``), a non-2xx answer becomes the provider's own
:class:`ProviderError` through ``error_of(status, body, headers)``, and the
HTTP client (``_strategies/openai/_http``, the one module that imports
httpx2) is opened lazily and closed, bounded and shielded, by :meth:`aclose`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, final

import anyio
import anyio.lowlevel

from .._values._categories import ErrorCategory
from .._values._errors import ProviderError
from .._values._urls import join_url
from ._batch import SendMark
from ._keys import Secret

__all__ = ["BatchRequests", "ErrorOf"]

ErrorOf = Callable[[int, Any, Mapping[str, str]], ProviderError]
"""``(status, decoded body, headers) -> ProviderError``: the provider's reading of a failed answer."""


@final
class BatchRequests:
    """One drive segment's HTTP requests to one provider; see the module docstring."""

    def __init__(self, *, base_url: str, headers: Mapping[str, str], secret: Secret | None,
                 error_of: ErrorOf, request_timeout: float, start_before: float) -> None:
        from .openai import _http  # lazily: `import trio_batch_llm` stays httpx2-free

        self._http = _http
        self._base = base_url
        self._headers = dict(headers)
        self._secret = secret
        self._error_of = error_of
        self._timeout = request_timeout
        self._deadline = start_before
        self._client: Any = None

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is None:
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
            try:
                body: Any = json.loads(reply.content)
            except ValueError:
                body = reply.content.decode("utf-8", "replace")
            raise self._error_of(reply.status_code, body, reply.headers)
        return reply

    async def json(self, method: str, path: str, *, sending: SendMark | None = None, **kwargs: Any) -> Any:
        """The decoded JSON of one request's 2xx reply."""
        reply = await self.send(method, path, sending=sending, **kwargs)
        try:
            return json.loads(reply.content)
        except ValueError:
            raise ProviderError(f"{method} {path}: the answer is not JSON",
                                category=ErrorCategory.PARSE, status_code=reply.status_code) from None
