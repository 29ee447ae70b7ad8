"""HTTP error answers of the OpenAI wire format as :class:`ProviderError`: one table for everyone.

:class:`OpenAICompatibleStrategy` and the Batch API turn an error answer into
:func:`error_from_status` (category, ``Retry-After``, a message without the
key); :class:`OpenAIStrategy` files the SDK's own status errors with the same
:func:`status_category`, without wrapping them. Headers arrive as plain mappings.
:func:`error_in_body` finds an error inside an HTTP 200 answer (OpenRouter sends a
provider's failure that way): such a body is never a success.
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

__all__ = ["decode_error_body", "error_from_status", "error_in_body", "schema_rejected", "status_category"]

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
_ANSWER_FIELDS = ("choices", "output")
PAYMENT_REQUIRED_STOPS = (
    "the provider answered 402 Payment Required (the account's credits are spent): no later call can "
    "succeed until it is topped up"
)
QUOTA_SPENT_STOPS = (
    "the provider says the account's quota or billing limit is spent ({code}): no later call can succeed "
    "until it is raised"
)


def batch_stop(status: int, category: ErrorCategory, code: str) -> str | None:
    """Why an error answer ends the batch (``ProviderError.stops_batch``): credits or quota spent
    (a 402, ``insufficient_quota``, ``billing_hard_limit_reached``); else ``None``."""
    if category is not ErrorCategory.INSUFFICIENT_BALANCE:
        return None
    if status == 402:
        return PAYMENT_REQUIRED_STOPS
    return QUOTA_SPENT_STOPS.format(code=code or "insufficient_balance")


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
        stops_batch=batch_stop(status, category, code or kind),
    )


def error_in_body(
    payload: Any, headers: Mapping[str, str] | None = None, *, secret: Secret | None = None
) -> ProviderError | None:
    """The error of an HTTP 200 answer whose body is ``{"error": {...}}`` with no answer in it, else ``None``.

    OpenRouter reports a failure met after it answered 200 this way. The error's
    numeric ``code`` is filed as that HTTP status would be (a 429 inside is a rate
    limit, a 402 stops the batch); without one it is a server error (retried).
    """
    if not isinstance(payload, Mapping) or not isinstance(payload.get("error"), Mapping):
        return None
    if any(payload.get(field) for field in _ANSWER_FIELDS):
        return None  # an answer with an error beside it is the parser's to judge (a failed response)
    code = payload["error"].get("code")
    numeric = code if isinstance(code, int) and not isinstance(code, bool) else None
    if isinstance(code, str) and code.isdigit():
        numeric = int(code)
    status = numeric if numeric is not None and 400 <= numeric <= 599 else 502
    error = error_from_status(status, headers or {}, payload, secret=secret)
    return ProviderError(
        f"an error inside an HTTP 200 answer: {error}", category=error.category,
        retry_after=error.retry_after, status_code=status, metadata=error.metadata,
        stops_batch=error.stops_batch,
    )


def status_category(status: int, body: Any) -> ErrorCategory:
    """The category of an HTTP error response with decoded ``body``, as :func:`error_from_status` files it."""
    code, kind, text = _error_fields(body)
    return _category(status, code, kind, text)


def status_batch_stop(status: int, body: Any) -> str | None:
    """``stops_batch`` of an error response with decoded ``body``, as :func:`error_from_status` says it."""
    code, kind, text = _error_fields(body)
    return batch_stop(status, _category(status, code, kind, text), code or kind)


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


def schema_rejected(error: ProviderError) -> bool:
    """Whether a 400 answer refuses the request's JSON schema (OpenAI: ``invalid_json_schema``, or a
    message about the schema)."""
    if error.category is not ErrorCategory.INVALID_REQUEST:
        return False
    text = str(error).lower()
    return "invalid_json_schema" in text or "schema" in text
