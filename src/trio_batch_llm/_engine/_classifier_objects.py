"""``error_classifier=``: a callable, or an object with ``classify(exc)`` (async-batch-llm's form).

An object's ``classify`` may answer as a callable does (a category, ``(category,
retry_after)`` or ``None``) or with an async-batch-llm ``ErrorInfo``-shaped record
(``is_rate_limit``, ``is_retryable``, ``is_timeout``, ``error_category``,
``suggested_wait``), which is read as the one category that makes the same decision.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol, TypeAlias

from .._values._categories import ErrorCategory
from ._classify import ClassifierFunction, ClassifierVerdict

__all__ = ["ANCHOR_CATEGORIES", "ClassifierArg", "SupportsClassify", "user_classifier", "verdict_of"]


class SupportsClassify(Protocol):
    """An async-batch-llm style classifier object."""

    def classify(self, exception: Exception, /) -> object: ...


ClassifierArg: TypeAlias = Callable[[Exception], Any] | SupportsClassify
"""What ``error_classifier=`` takes."""

_C = ErrorCategory
ANCHOR_CATEGORIES: Final[Mapping[str, ErrorCategory]] = {
    "rate_limit": _C.RATE_LIMIT, "rate_limit_retries_exceeded": _C.RATE_LIMIT,
    "insufficient_balance": _C.INSUFFICIENT_BALANCE, "quota_exhausted": _C.INSUFFICIENT_BALANCE,
    "usage_limit_exceeded": _C.INSUFFICIENT_BALANCE,
    "authentication": _C.AUTHENTICATION, "permission_denied": _C.AUTHENTICATION,
    "client_error": _C.INVALID_REQUEST, "structured_output_schema_rejected": _C.INVALID_REQUEST,
    "token_estimate_exceeds_limit": _C.INVALID_REQUEST,
    "server_error": _C.SERVER, "server_overload": _C.SERVER, "upstream_error": _C.SERVER,
    "api_error": _C.SERVER,
    "api_timeout": _C.TIMEOUT, "timeout": _C.TIMEOUT, "server_timeout": _C.TIMEOUT,
    "framework_timeout": _C.TIMEOUT,
    "network_error": _C.TRANSIENT, "connection_error": _C.TRANSIENT,
    "validation_error": _C.PARSE, "structured_output_validation_error": _C.PARSE, "empty_response": _C.PARSE,
}
"""async-batch-llm's provider ``error_category`` strings -> ours (the rest: by the record's flags;
its engine verdicts such as ``batch_aborted`` are the engine's to give here, not a classifier's)."""


def verdict_of(answer: Any) -> ClassifierVerdict:
    """A classifier's answer as a verdict; an ``ErrorInfo``-shaped record becomes a category."""
    if answer is None or isinstance(answer, (ErrorCategory, str, tuple)):
        return answer  # type: ignore[return-value]  # a str category is checked by classify()
    if not hasattr(answer, "is_retryable"):
        raise TypeError(f"error classifier returned {answer!r}: not a category, a pair, None or an ErrorInfo")
    wait = getattr(answer, "suggested_wait", None)
    label = str(getattr(answer, "error_category", "") or "")
    if getattr(answer, "is_rate_limit", False):
        return (_C.RATE_LIMIT, wait)
    try:
        category = _C(label)
    except ValueError:
        category = ANCHOR_CATEGORIES.get(label) or _by_flags(answer)
    if category.engine_verdict or category.retryable != bool(answer.is_retryable):
        category = _by_flags(answer)  # the flags decide; a label never makes a retry happen or not
    return (category, wait)


def _by_flags(info: Any) -> ErrorCategory:
    if not info.is_retryable:
        return _C.INVALID_REQUEST
    return _C.TIMEOUT if getattr(info, "is_timeout", False) else _C.TRANSIENT


def user_classifier(classifier: object, *, field: str = "error_classifier") -> ClassifierFunction | None:
    """The engine's callable form of ``classifier`` (``TypeError`` naming it when it is neither)."""
    if classifier is None:
        return None
    method = getattr(classifier, "classify", None)
    if isinstance(classifier, type):
        raise TypeError(f"{field}={classifier!r}: pass an instance ({classifier.__name__}()), not the class")
    if callable(method):
        answer: Callable[[Exception], Any] = method
        return lambda exc: verdict_of(answer(exc))
    if callable(classifier):
        return classifier
    raise TypeError(f"{field}={classifier!r}: must be a callable or have a classify(exc) method")
