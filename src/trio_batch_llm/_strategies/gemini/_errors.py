"""Gemini's error answers (``{"error": {code, message, status, details}}``) as :class:`ProviderError`.

One table for the strategy, the SDK's ``APIError`` (duck-typed: ``code``, ``details``),
:class:`GeminiErrorClassifier` and the batch mode. A 429 ``RESOURCE_EXHAUSTED`` carries
its wait in ``google.rpc.RetryInfo.retryDelay`` ("45s", "45.8s") and which quota in
``google.rpc.QuotaFailure``: a per-minute quota is a RATE_LIMIT waited out; a per-day
quota (a ``quotaId`` with ``PerDay``) cannot come back before tomorrow, so the error
says ``stops_batch`` and is INSUFFICIENT_BALANCE (final even where no engine stops the batch).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from ..._admission import RATE_LIMIT_METADATA_KEY, rate_limit_headers
from ..._values._categories import ErrorCategory
from ..._values._errors import ProviderError
from ..._values._retry_after import retry_after_from_headers

__all__ = ["api_error_of", "error_from_body", "error_parts", "quota_violations", "retry_delay"]

_DELAY: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s*$")
_CONTEXT_LENGTH_TEXT: Final = re.compile(
    r"input token count.*exceeds|exceeds the maximum number of tokens|context (length|window)|"
    r"too many tokens", re.I | re.S,
)
_AUTH_REASONS: Final = frozenset({"API_KEY_INVALID", "API_KEY_SERVICE_BLOCKED", "ACCESS_TOKEN_EXPIRED",
                                  "SERVICE_DISABLED", "CONSUMER_INVALID"})
_STATUS_CATEGORY: Final = {
    "UNAVAILABLE": ErrorCategory.SERVER, "INTERNAL": ErrorCategory.SERVER,
    "DEADLINE_EXCEEDED": ErrorCategory.TIMEOUT, "UNAUTHENTICATED": ErrorCategory.AUTHENTICATION,
    "PERMISSION_DENIED": ErrorCategory.AUTHENTICATION,
}
_MESSAGE_LIMIT: Final = 500


def error_parts(body: Any) -> tuple[str, str, list[Any]]:
    """``(status, message, details)`` of an error body: ``{"error": {...}}``, the inner object, a
    one-element list of either (as some proxies send), or text."""
    if isinstance(body, list) and len(body) == 1:
        body = body[0]
    error = body.get("error", body) if isinstance(body, Mapping) else None
    if not isinstance(error, Mapping):
        return "", body if isinstance(body, str) else "", []
    details = error.get("details")
    return (str(error.get("status") or ""), str(error.get("message") or ""),
            list(details) if isinstance(details, list) else [])


def _of_type(details: list[Any], suffix: str) -> list[Mapping[str, Any]]:
    return [d for d in details if isinstance(d, Mapping) and str(d.get("@type", "")).endswith(suffix)]


def retry_delay(details: list[Any]) -> float | None:
    """Seconds of ``RetryInfo.retryDelay`` ("45s", "45.8s", or ``{"seconds": 45, "nanos": ...}``)."""
    for info in _of_type(details, "google.rpc.RetryInfo"):
        delay = info.get("retryDelay")
        if isinstance(delay, str):
            match = _DELAY.match(delay)
            if match:
                return float(match.group(1))
        elif isinstance(delay, Mapping):
            seconds, nanos = delay.get("seconds", 0), delay.get("nanos", 0)
            if isinstance(seconds, (int, str)) and isinstance(nanos, int):
                try:
                    return int(seconds) + nanos / 1e9
                except ValueError:
                    continue
    return None


def quota_violations(details: list[Any]) -> list[Mapping[str, Any]]:
    """The ``QuotaFailure`` violations (``quotaId``, ``quotaMetric``, ``quotaDimensions``, ...)."""
    return [v for failure in _of_type(details, "google.rpc.QuotaFailure")
            for v in failure.get("violations") or () if isinstance(v, Mapping)]


def _per_day(violations: list[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    for violation in violations:
        if "perday" in str(violation.get("quotaId", "")).lower():
            return violation
    return None


def _reasons(details: list[Any]) -> set[str]:
    return {str(d.get("reason")) for d in _of_type(details, "google.rpc.ErrorInfo") if d.get("reason")}


def error_from_body(status: int | None, body: Any, headers: Mapping[str, str] | None = None) -> ProviderError:
    """The :class:`ProviderError` for a Gemini error answer (HTTP ``status``, decoded ``body``)."""
    kind, text, details = error_parts(body)
    headers = headers or {}
    wait = retry_delay(details)
    if wait is None:
        wait = retry_after_from_headers(headers)
    violations = quota_violations(details)
    stops: str | None = None
    day = _per_day(violations) if status == 429 or kind == "RESOURCE_EXHAUSTED" else None
    if day is not None:
        dims = day.get("quotaDimensions")
        model = dims.get("model") if isinstance(dims, Mapping) else None
        stops = (f"per-day quota {day.get('quotaId')} spent" + (f" for model {model}" if model else "")
                 + (f" (limit {day['quotaValue']})" if day.get("quotaValue") else "")
                 + "; it resets at midnight Pacific time")
        category = ErrorCategory.INSUFFICIENT_BALANCE
    else:
        category = _category(status, kind, text, details)
    label = f" {kind}" if kind else ""
    quota = f" [quota {', '.join(str(v.get('quotaId')) for v in violations)}]" if violations else ""
    detail = f": {text[:_MESSAGE_LIMIT]}" if text else ""
    message = f"HTTP {status}{label}{detail}{quota}"
    reported = rate_limit_headers(headers)
    return ProviderError(message, category=category, retry_after=None if stops else wait,
                         status_code=status, stops_batch=stops,
                         metadata={RATE_LIMIT_METADATA_KEY: reported} if reported else None)


def _category(status: int | None, kind: str, text: str, details: list[Any]) -> ErrorCategory:
    if status == 429 or kind == "RESOURCE_EXHAUSTED":
        return ErrorCategory.RATE_LIMIT
    if kind in _STATUS_CATEGORY:
        return _STATUS_CATEGORY[kind]
    if status is not None and status >= 500:
        return ErrorCategory.TIMEOUT if status == 504 else ErrorCategory.SERVER
    if status in (401, 403) or _reasons(details) & _AUTH_REASONS:
        return ErrorCategory.AUTHENTICATION
    if status == 408:
        return ErrorCategory.TIMEOUT
    if _CONTEXT_LENGTH_TEXT.search(text):
        return ErrorCategory.CONTEXT_LENGTH
    if status is not None and 400 <= status < 500:
        return ErrorCategory.INVALID_REQUEST
    return ErrorCategory.UNKNOWN


def api_error_of(exc: BaseException) -> ProviderError | None:
    """The :class:`ProviderError` for google-genai's ``APIError`` (read by its fields, no SDK import);
    ``None`` for anything else."""
    if not any(c.__name__ == "APIError" and c.__module__.startswith("google.genai")
               for c in type(exc).__mro__):
        return None
    code = getattr(exc, "code", None)
    body = getattr(exc, "details", None)
    response = getattr(exc, "response", None)
    raw_headers = getattr(response, "headers", None)
    headers = {str(k).lower(): str(v) for k, v in raw_headers.items()} if raw_headers is not None else {}
    if not isinstance(body, (Mapping, list)):
        body = {"error": {"status": getattr(exc, "status", None) or "",
                          "message": getattr(exc, "message", "")}}
    return error_from_body(code if isinstance(code, int) else None, body, headers)
