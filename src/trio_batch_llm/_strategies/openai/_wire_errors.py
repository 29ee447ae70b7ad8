"""HTTP error answers of the OpenAI wire format as :class:`ProviderError`: one table for everyone.

:class:`OpenAICompatibleStrategy` and the Batch API turn an error answer into
:func:`error_from_status` (category, ``Retry-After``, a message without the
key); :class:`OpenAIStrategy` files the SDK's own status errors with the same
:func:`status_category`, without wrapping them. Headers arrive as plain mappings.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ..._admission import RATE_LIMIT_METADATA_KEY, rate_limit_headers
from ..._values._categories import ErrorCategory
from ..._values._errors import ProviderError
from ..._values._retry_after import retry_after_from_headers
from .._keys import Secret

__all__ = ["decode_error_body", "error_from_status", "status_category"]

CONTEXT_LENGTH_CODES = frozenset({"context_length_exceeded", "string_above_max_length"})
CONTENT_POLICY_CODES = frozenset(
    {"content_policy_violation", "content_filter", "moderation_blocked", "invalid_prompt"}
)
INSUFFICIENT_BALANCE_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached"})
_CONTEXT_LENGTH_TEXT = re.compile(
    r"context[ _]length|maximum context|prompt is too long|too many (input )?tokens", re.I
)
_CONTENT_POLICY_TEXT = re.compile(r"content[ _](management )?polic|content[ _]filter|safety system", re.I)
_MESSAGE_LIMIT = 500


def decode_error_body(content: bytes) -> Any:
    """An error response's JSON, or its text when it is not JSON (an HTML page from a proxy)."""
    try:
        return json.loads(content)
    except ValueError:
        return content.decode("utf-8", "replace")


def error_from_status(
    status: int, headers: Mapping[str, str], body: Any, *, secret: Secret | None = None
) -> ProviderError:
    """Map an HTTP error response to a :class:`ProviderError` with category and Retry-After.

    Its rate-limit headers, if any, go in ``metadata["rate_limit"]`` (for the quota scope).

    ``body`` is the decoded JSON (``{"error": {...}}`` or the inner object, as the
    openai SDK keeps it), or text. The key in ``secret`` is scrubbed from the message.
    """
    code, kind, text = _error_fields(body)
    category = _category(status, code, kind, text)
    detail = f": {text[:_MESSAGE_LIMIT]}" if text else ""
    label = f" ({code})" if code else ""
    message = f"HTTP {status}{label}{detail}"
    if secret is not None:
        message = secret.redact(message)
    reported = rate_limit_headers(headers)
    return ProviderError(
        message, category=category, retry_after=retry_after_from_headers(headers), status_code=status,
        metadata={RATE_LIMIT_METADATA_KEY: reported} if reported else None,
    )


def status_category(status: int, body: Any) -> ErrorCategory:
    """The category of an HTTP error response with decoded ``body``, as :func:`error_from_status` files it."""
    code, kind, text = _error_fields(body)
    return _category(status, code, kind, text)


def _error_fields(body: Any) -> tuple[str, str, str]:
    """``(code, type, message)`` of an error body in any shape :func:`error_from_status` accepts."""
    error = body.get("error", body) if isinstance(body, Mapping) else None
    error = error if isinstance(error, Mapping) else {}
    code = str(error.get("code") or "")
    kind = str(error.get("type") or "")
    text = str(error.get("message") or "") if error else (body if isinstance(body, str) else "")
    return code, kind, text


def _category(status: int, code: str, kind: str, text: str) -> ErrorCategory:
    if code in INSUFFICIENT_BALANCE_CODES or kind in INSUFFICIENT_BALANCE_CODES or status == 402:
        return ErrorCategory.INSUFFICIENT_BALANCE
    if status == 429:
        return ErrorCategory.RATE_LIMIT
    if status == 408:
        return ErrorCategory.TIMEOUT
    if status >= 500:
        return ErrorCategory.SERVER
    if status in (401, 403):
        return ErrorCategory.AUTHENTICATION
    if 400 <= status < 500:
        if code in CONTEXT_LENGTH_CODES or _CONTEXT_LENGTH_TEXT.search(text):
            return ErrorCategory.CONTEXT_LENGTH
        if code in CONTENT_POLICY_CODES or kind in CONTENT_POLICY_CODES or _CONTENT_POLICY_TEXT.search(text):
            return ErrorCategory.CONTENT_POLICY
        return ErrorCategory.INVALID_REQUEST
    return ErrorCategory.UNKNOWN
