"""Anthropic's error answers: one table from (status, body) to a category, for the SDK's and ours.

An error body is ``{"type": "error", "error": {"type": "rate_limit_error", "message": ...,
"details": {"error_code": ...}}, "request_id": ...}``. :func:`error_from_body` makes a
:class:`ProviderError` of it (a Message Batch result's ``errored`` entry, a raw answer);
:func:`sdk_verdict` files the SDK's own status errors with the same table, duck-typed (no
SDK import), for the strategy's ``classify_error`` and :class:`AnthropicErrorClassifier`.

Choices: 529 ``overloaded_error`` is SERVER (provider-wide, retried with backoff, never a
cooldown of our scope); a spend limit (``enforced_spend_limit_reached`` and the other
``*_spend_limit_reached`` codes, which Anthropic sends as a 429, a ``billing_error``, or a
400 "credit balance is too low") is INSUFFICIENT_BALANCE with ``stops_batch``: no later call
can succeed until someone pays, so waiting out a 429 would only burn the batch's time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from ..._admission import RATE_LIMIT_METADATA_KEY, rate_limit_headers
from ..._values._categories import ErrorCategory
from ..._values._errors import ProviderError
from ..._values._retry_after import retry_after_from_headers

__all__ = ["error_fields", "error_from_body", "sdk_verdict", "status_category", "stop_reason"]

TYPE_STATUS: Final = {
    "invalid_request_error": 400, "authentication_error": 401, "billing_error": 402,
    "permission_error": 403, "not_found_error": 404, "request_too_large": 413,
    "rate_limit_error": 429, "api_error": 500, "timeout_error": 504, "overloaded_error": 529,
}
"""Anthropic's documented error types and their HTTP statuses (a batch result carries only the type)."""
_SPEND_CODES: Final = re.compile(r"spend_limit_reached", re.I)
_SPEND_TEXT: Final = re.compile(r"credit balance (is )?too low|spend limit|enforced_spend_limit", re.I)
_CONTEXT_TEXT: Final = re.compile(
    r"prompt is too long|context (window|length|limit)|exceed(s)? (the )?context|too many (input )?tokens",
    re.I)
_MESSAGE_LIMIT: Final = 500


def error_fields(body: Any) -> tuple[str, str, str]:
    """``(type, error_code, message)`` of an error body (the whole answer, its ``error`` object, or
    text)."""
    error = body.get("error", body) if isinstance(body, Mapping) else None
    error = error if isinstance(error, Mapping) else {}
    details = error.get("details")
    code = details.get("error_code") if isinstance(details, Mapping) else None
    kind = str(error.get("type") or "")
    text = str(error.get("message") or "") if error else (body if isinstance(body, str) else "")
    return kind, str(code or error.get("code") or ""), text


def stop_reason(kind: str, code: str, text: str) -> str | None:
    """Why no later call can succeed (a spend limit, no credit), or ``None``."""
    if _SPEND_CODES.search(code) or _SPEND_CODES.search(kind) or _SPEND_TEXT.search(text) \
            or kind == "billing_error":
        shown = code or kind or "billing"
        return f"Anthropic's spend limit is reached ({shown}): no call succeeds until it is raised or paid"
    return None


def status_category(status: int | None, body: Any) -> ErrorCategory:
    """The category of an error answer with ``status`` (or only a body, as a batch result has)."""
    kind, code, text = error_fields(body)
    return _category(_status(status, kind), kind, code, text)


def error_from_body(status: int | None, body: Any, headers: Mapping[str, str] | None = None) -> \
        ProviderError:
    """An error answer as a :class:`ProviderError`: category, ``Retry-After`` and the rate-limit headers
    (``metadata["rate_limit"]``), ``stops_batch`` for a spend limit. ``status`` may be ``None`` (a
    Message Batch result): the error's type gives it."""
    kind, code, text = error_fields(body)
    status = _status(status, kind)
    category = _category(status, kind, code, text)
    label = ", ".join(part for part in (kind, code) if part)
    message = (f"HTTP {status}" if status else "Anthropic error") + (f" ({label})" if label else "") + \
        (f": {text[:_MESSAGE_LIMIT]}" if text else "")
    reported = rate_limit_headers(headers or {})
    return ProviderError(
        message, category=category, retry_after=retry_after_from_headers(headers or {}),
        status_code=status, metadata={RATE_LIMIT_METADATA_KEY: reported} if reported else None,
        stops_batch=stop_reason(kind, code, text),
    )


def sdk_verdict(exc: BaseException) -> tuple[ErrorCategory, float | None, str | None] | None:
    """``(category, retry_after, stops_batch)`` of an SDK status error (``APIStatusError`` and
    subclasses, recognised by their ``status_code``, ``body`` and ``response``), or ``None``."""
    status = getattr(exc, "status_code", None)
    if not isinstance(status, int) or not hasattr(exc, "body"):
        return None
    body = getattr(exc, "body", None)
    kind, code, text = error_fields(body)
    if not code:  # the SDK's typed spend-limit errors carry it as an attribute too
        found = getattr(exc, "error_code", None)
        code = found if isinstance(found, str) else ""
    if not text:
        text = str(getattr(exc, "message", "") or "")
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    return (_category(status, kind, code, text), retry_after_from_headers(headers),
            stop_reason(kind, code, text))


def _status(status: int | None, kind: str) -> int | None:
    return status if isinstance(status, int) else TYPE_STATUS.get(kind)


def _category(status: int | None, kind: str, code: str, text: str) -> ErrorCategory:
    if stop_reason(kind, code, text) is not None or status == 402:
        return ErrorCategory.INSUFFICIENT_BALANCE
    if status == 429:
        return ErrorCategory.RATE_LIMIT
    if status == 408:
        return ErrorCategory.TIMEOUT
    if status is not None and status >= 500:
        return ErrorCategory.SERVER  # 529 overloaded_error included: provider-wide, not our scope's
    if status in (401, 403):
        return ErrorCategory.AUTHENTICATION
    if status == 413 or (status == 400 and _CONTEXT_TEXT.search(text)):
        return ErrorCategory.CONTEXT_LENGTH
    if status is not None and 400 <= status < 500:
        return ErrorCategory.INVALID_REQUEST
    return ErrorCategory.UNKNOWN
