"""PydanticAI's exceptions -> our categories: one table, read by class name along the MRO.

Matching by name (as ``_engine/_classify`` does for the SDKs) keeps ``pydantic_ai`` out of
this module's imports and lets a subclass inherit its parent's verdict. An HTTP error
(``ModelHTTPError``: ``status_code``, ``body``) is filed by the OpenAI dialect's status table
first, since its body has that dialect's ``code``/``type``/``message``; the class names decide
what arrives without a status (a gRPC or in-stream error, a connection failure).

Choices where pydantic-ai leaves it open:

- ``UnexpectedModelBehavior`` (the agent's own output or tool retries are exhausted, or an
  answer it cannot use) is ``PARSE``: a new run samples anew, and our ``RetryConfig``
  bounds how many runs an item gets, as for any answer that fails validation.
- ``UsageLimitExceeded`` is ``INVALID_REQUEST`` (not retried): the run would spend the same
  tokens or requests again; the limit belongs to the caller's configuration.
- ``ModelQuotaExceededError`` (credits or quota spent) is ``INSUFFICIENT_BALANCE`` and stops
  the batch (the exception is marked ``stops_batch``, as the Anthropic strategy marks its own).
- ``RunCancelled`` (the application cancelled the run through pydantic-ai) is ``UNKNOWN``;
  ``RunTimedOut`` is ``TIMEOUT``. A cancellation of our own scopes never reaches here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ..._values._categories import ErrorCategory
from ..openai._wire_errors import status_batch_stop, status_category

__all__ = ["classify_agent_error", "stops_batch_of"]

_BY_CLASS_NAME: Final[Mapping[str, ErrorCategory]] = {
    # most specific first does not matter: the MRO is walked from the exception's own class
    "ModelRateLimitError": ErrorCategory.RATE_LIMIT,
    "ModelQuotaExceededError": ErrorCategory.INSUFFICIENT_BALANCE,
    "ModelUnavailableError": ErrorCategory.SERVER,  # ModelOverloadedError too: provider-wide
    "ModelServerError": ErrorCategory.SERVER,
    "ModelEmptyResponseError": ErrorCategory.TRANSIENT,  # a glitch: the same request may well succeed
    "ModelInvalidResponseError": ErrorCategory.PARSE,
    "ModelTimeoutError": ErrorCategory.TIMEOUT,
    "ModelRequestTimeout": ErrorCategory.TIMEOUT,
    "ModelConnectionError": ErrorCategory.TRANSIENT,
    "ModelContextWindowExceededError": ErrorCategory.CONTEXT_LENGTH,
    "ModelAuthenticationError": ErrorCategory.AUTHENTICATION,
    "ModelRequestRejectedError": ErrorCategory.INVALID_REQUEST,  # not found, schema too complex, ...
    "ContentFilterError": ErrorCategory.CONTENT_POLICY,
    "UsageLimitExceeded": ErrorCategory.INVALID_REQUEST,
    "RunTimedOut": ErrorCategory.TIMEOUT,
    "RunCancelled": ErrorCategory.UNKNOWN,
    "UnexpectedModelBehavior": ErrorCategory.PARSE,
    "ConcurrencyLimitExceeded": ErrorCategory.TRANSIENT,
    "UserError": ErrorCategory.INVALID_REQUEST,  # the agent is configured wrong: no retry mends it
}
_PYDANTIC_AI: Final = "pydantic_ai"


def classify_agent_error(exc: BaseException) -> tuple[ErrorCategory, float | None] | None:
    """``(category, retry_after)`` of one of pydantic-ai's exceptions; ``None`` for anyone else's
    (the engine's default rules take those: a tool's own ``httpx`` error, a bug in a tool)."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and not isinstance(status, bool) and _is_pydantic_ai(type(exc)):
        return status_category(status, _error_body(exc)), _retry_after(exc)
    for klass in type(exc).__mro__:
        category = _BY_CLASS_NAME.get(klass.__name__)
        if category is not None and _is_pydantic_ai(klass):
            return category, _retry_after(exc)
    return None


def stops_batch_of(exc: BaseException) -> str | None:
    """Why no later run can succeed (credits or quota spent), or ``None``."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and not isinstance(status, bool) and _is_pydantic_ai(type(exc)):
        return status_batch_stop(status, _error_body(exc))
    if any(k.__name__ == "ModelQuotaExceededError" for k in type(exc).__mro__):
        return ("the provider says the account's quota or credits are spent "
                f"({getattr(exc, 'provider_error_code', None) or 'quota exceeded'}): "
                "no later call can succeed until it is raised")
    return None


def _is_pydantic_ai(klass: type) -> bool:
    return klass.__module__.split(".")[0] == _PYDANTIC_AI


def _error_body(exc: BaseException) -> Any:
    """The body the status table reads: the provider's error object, with pydantic-ai's own reading
    of its code and type filled in where the body lacks them (or is not a mapping)."""
    body = getattr(exc, "body", None)
    fields: dict[str, Any] = dict(body.get("error", body)) if isinstance(body, Mapping) and \
        isinstance(body.get("error", body), Mapping) else {"message": "" if body is None else str(body)}
    for ours, theirs in (("code", "provider_error_code"), ("type", "provider_error_type")):
        found = getattr(exc, theirs, None)
        if not fields.get(ours) and isinstance(found, str):
            fields[ours] = found
    return fields


def _retry_after(exc: BaseException) -> float | None:
    value = getattr(exc, "retry_after", None)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return None
