"""The mock's Gemini error bodies, in Google's shape: ``{"error": {code, message, status, details}}``.

Written from Google's documented error model (``google.rpc.Status`` with typed
``details``), not from any client of ours. Gemini sends no rate-limit headers
and no ``Retry-After``: a 429 carries its wait in the body, as a
``type.googleapis.com/google.rpc.RetryInfo`` detail whose ``retryDelay`` is a
protobuf Duration (``"45s"``, ``"45.8s"``), and which quota ran out in a
``google.rpc.QuotaFailure`` detail (``quotaId`` such as
``GenerateRequestsPerMinutePerProjectPerModel`` or
``GenerateRequestsPerDayPerProjectPerModel``). A per-day quota carries no
``RetryInfo``: waiting a minute does not help.

Nothing here sends or reads a clock.
"""

from __future__ import annotations

from typing import Any, Final, Literal

__all__ = [
    "STATUS_NAMES",
    "cache_not_found",
    "duration_text",
    "google_error",
    "quota_exhausted",
    "status_error",
]

STATUS_NAMES: Final = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
    409: "ALREADY_EXISTS", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED",
    500: "INTERNAL", 501: "NOT_IMPLEMENTED", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}
"""The canonical ``google.rpc.Code`` name Google's HTTP mapping gives each status."""

_MESSAGES: Final = {
    400: "Request contains an invalid argument.",
    401: "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie "
         "or other valid authentication credential.",
    403: "The caller does not have permission",
    404: "Requested entity was not found.",
    500: "An internal error has occurred. Please retry or report in "
         "https://developers.generativeai.google/guide/troubleshooting",
    503: "The model is overloaded. Please try again later.",
    504: "The request timed out. Please try again.",
}
_HELP: Final = {
    "@type": "type.googleapis.com/google.rpc.Help",
    "links": [{"description": "Learn more about Gemini API quotas",
               "url": "https://ai.google.dev/gemini-api/docs/rate-limits"}],
}
Quota = Literal["minute", "day", "tokens"]
_QUOTAS: Final[dict[str, tuple[str, str]]] = {
    # (quotaMetric, quotaId) of the paid tier, as Google names them.
    "minute": ("generativelanguage.googleapis.com/generate_requests_per_model",
               "GenerateRequestsPerMinutePerProjectPerModel"),
    "day": ("generativelanguage.googleapis.com/generate_requests_per_model_per_day",
            "GenerateRequestsPerDayPerProjectPerModel"),
    "tokens": ("generativelanguage.googleapis.com/generate_content_paid_tier_input_token_count",
               "GenerateContentPaidTierInputTokensPerModelPerMinute"),
}


def google_error(status: int, message: str, details: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The error body Google sends for ``status`` (``details`` only when there are some)."""
    error: dict[str, Any] = {"code": status, "message": message,
                             "status": STATUS_NAMES.get(status, "UNKNOWN")}
    if details:
        error["details"] = details
    return {"error": error}


def status_error(status: int, message: str | None = None, *,
                 retry_delay: float | None = None, model: str = "mock-model") -> dict[str, Any]:
    """A generic error for ``status`` worded as Gemini words it; a 429 is a per-minute quota refusal."""
    if status == 429:
        return quota_exhausted("minute", model=model, retry_delay=retry_delay)
    details = None
    if status == 503 and retry_delay is not None:  # an overload may say how long to back off
        details = [_retry_info(retry_delay)]
    return google_error(status, message or _MESSAGES.get(status, f"mock error {status}"), details)


def quota_exhausted(quota: Quota, *, model: str, retry_delay: float | None = None,
                    limit: int | None = None) -> dict[str, Any]:
    """The 429 ``RESOURCE_EXHAUSTED`` of one quota: ``QuotaFailure``, ``Help``, and for a per-minute
    quota with a known wait, ``RetryInfo`` (the only place the wait is said)."""
    metric, quota_id = _QUOTAS[quota]
    violation: dict[str, Any] = {
        "quotaMetric": metric, "quotaId": quota_id,
        "quotaDimensions": {"location": "global", "model": _bare(model)},
    }
    if limit is not None:
        violation["quotaValue"] = str(limit)  # an int64: JSON carries it as a string
    message = ("You exceeded your current quota, please check your plan and billing details. For more "
               "information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.")
    details: list[dict[str, Any]] = [
        {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [violation]}, _HELP,
    ]
    if quota != "day" and retry_delay is not None:
        message += f" Please retry in {duration_text(retry_delay)}."
        details.append(_retry_info(retry_delay))
    return google_error(429, message, details)


def cache_not_found() -> dict[str, Any]:
    """What Google answers (403) for a cache that does not exist, was deleted, or has expired."""
    return google_error(403, "CachedContent not found (or permission denied)")


def duration_text(seconds: float) -> str:
    """``seconds`` as a protobuf Duration in JSON: ``"45s"``, ``"45.8s"`` (at most nanoseconds)."""
    whole = f"{max(0.0, seconds):.9f}".rstrip("0").rstrip(".")
    return whole + "s"


def _retry_info(seconds: float) -> dict[str, Any]:
    return {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": duration_text(seconds)}


def _bare(model: str) -> str:
    return model.removeprefix("models/")
