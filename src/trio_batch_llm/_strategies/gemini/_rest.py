"""Gemini's REST routes over our httpx2 layer: generateContent and the cachedContents resource.

Every call returns decoded JSON or raises the :class:`ProviderError` of
:func:`._errors.error_from_body`; transport failures are ``_http``'s. The key goes in
the ``x-goog-api-key`` header (never in the URL, so it cannot leak into a logged URL).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, final

from ..._values._categories import ErrorCategory
from ..._values._errors import ProviderError
from ..._values._urls import join_url
from ..._version import __version__
from .._keys import Secret
from ..openai import _http
from ._errors import error_from_body

__all__ = ["GeminiRest"]


@final
@dataclass(frozen=True, slots=True)
class GeminiRest:
    """The routes under ``{base_url}/{api_version}`` with one key and extra headers."""

    base_url: str
    api_version: str
    secret: Secret | None
    headers: Mapping[str, str]

    def url(self, path: str) -> str:
        return join_url(self.base_url, f"/{self.api_version}/{path}")

    def request_headers(self) -> dict[str, str]:
        headers = {"accept": "application/json", "user-agent": f"trio-batch-llm/{__version__}"}
        if self.secret is not None:
            headers["x-goog-api-key"] = self.secret.reveal()
        headers.update({name.lower(): value for name, value in self.headers.items()})
        return headers

    async def call(self, client: Any, method: str, path: str, body: Mapping[str, Any] | None = None, *,
                   params: Mapping[str, str | int] | None = None, timeout: float | None = None,
                   ) -> tuple[Any, Mapping[str, str], int]:
        """``(json, headers, status)`` of one call; an error answer raises its :class:`ProviderError`."""
        reply = await _http.send_request(client, method, self.url(path), headers=self.request_headers(),
                                         json_body=body, params=params, timeout=timeout, secret=self.secret)
        if not 200 <= reply.status_code < 300:
            try:
                decoded: Any = json.loads(reply.content)
            except ValueError:
                decoded = reply.content.decode("utf-8", "replace")
            error = error_from_body(reply.status_code, decoded, reply.headers)
            if self.secret is not None and self.secret.reveal() in str(error):
                error = ProviderError(self.secret.redact(str(error)), category=error.category,
                                      retry_after=error.retry_after, status_code=error.status_code,
                                      stops_batch=error.stops_batch, metadata=error.metadata)
            raise error
        if not reply.content.strip():
            return {}, reply.headers, reply.status_code
        try:
            return json.loads(reply.content), reply.headers, reply.status_code
        except ValueError as exc:
            raise ProviderError(f"Gemini's response body is not valid JSON ({len(reply.content)} bytes)",
                                category=ErrorCategory.PARSE) from exc
