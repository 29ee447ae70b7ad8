"""One ``generateContent`` through a user's ``google.genai.Client`` (``aio.models``), in our words.

The REST body that ``GeminiStrategy.request_body`` builds is handed to the SDK as
``contents`` and a ``config`` mapping (the SDK's pydantic types take the camelCase
names as aliases); its answer and its ``APIError`` are read by the same tables as REST.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..._admission import RATE_LIMIT_METADATA_KEY, rate_limit_headers
from ..._values._results import TokenUsage
from ._errors import api_error_of
from ._wire import read_response

__all__ = ["sdk_generate"]


async def sdk_generate(client: Any, model: str, body: Mapping[str, Any]) -> tuple[str, TokenUsage, Any]:
    """``(text, usage, metadata)`` of one call; the SDK's ``APIError`` becomes our ProviderError."""
    config: dict[str, Any] = dict(body.get("generationConfig") or {})
    config.update({key: value for key, value in body.items() if key not in ("contents", "generationConfig")})
    try:
        response = await client.aio.models.generate_content(model=model, contents=body["contents"],
                                                            config=config or None)
    except Exception as exc:
        error = api_error_of(exc)
        if error is None:
            raise
        raise error from exc
    text, usage, metadata = read_response(response)
    http = getattr(response, "sdk_http_response", None)
    headers = getattr(http, "headers", None)
    if isinstance(headers, Mapping):
        reported = rate_limit_headers({str(k).lower(): str(v) for k, v in headers.items()})
        if reported:
            metadata[RATE_LIMIT_METADATA_KEY] = reported
    metadata["transport"] = "google-genai"
    return text, usage, metadata
