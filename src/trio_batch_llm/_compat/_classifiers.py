"""async-batch-llm's classifier objects: ``classify(exc) -> ErrorInfo``, over this library's rules.

``error_classifier=`` takes such an object as well as a function; an ``ErrorInfo`` it
returns is read as the category that makes the same decision (see
``trio_batch_llm._engine._classifier_objects``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import final

from .._engine._classify import category_by_status
from .._engine._classify import classify as _classify
from .._strategies.anthropic._errors import sdk_verdict
from .._strategies.openai._wire_errors import PAYMENT_REQUIRED_STOPS
from .._values._categories import ErrorCategory

__all__ = [
    "AnthropicErrorClassifier",
    "DefaultErrorClassifier",
    "ErrorClassifier",
    "ErrorInfo",
    "GeminiErrorClassifier",
    "OpenAIErrorClassifier",
    "OpenRouterErrorClassifier",
]


@final
@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """How to treat one failure, in async-batch-llm's words.

    ``is_rate_limit`` starts the shared cooldown (``suggested_wait`` is its floor);
    otherwise ``is_retryable`` decides. ``error_category`` may be one of ours
    (:class:`ErrorCategory` values) or one of async-batch-llm's strings.
    """

    is_retryable: bool
    is_rate_limit: bool
    is_timeout: bool
    error_category: str
    suggested_wait: float | None = None
    hint: str | None = None


class ErrorClassifier(ABC):
    """A classifier object: subclass and implement :meth:`classify`."""

    @abstractmethod
    def classify(self, exception: Exception) -> ErrorInfo | ErrorCategory | None:
        """Say what ``exception`` is; ``None`` defers to the strategy's and the built-in rules."""


class DefaultErrorClassifier(ErrorClassifier):
    """The built-in rules (status codes, SDK exception types, provider error codes) as an object.

    Subclass it to handle your own exceptions and call ``super().classify(exc)`` for the rest.
    """

    def classify(self, exception: Exception) -> ErrorInfo:
        verdict = _classify(exception)
        category = verdict.category
        return ErrorInfo(
            is_retryable=category.retryable,
            is_rate_limit=category is ErrorCategory.RATE_LIMIT,
            is_timeout=category is ErrorCategory.TIMEOUT,
            error_category=category.value,
            suggested_wait=verdict.retry_after,
        )


class OpenAIErrorClassifier(DefaultErrorClassifier):
    """The built-in rules already know the ``openai`` SDK's exceptions; kept for the name."""


class AnthropicErrorClassifier(DefaultErrorClassifier):
    """Anthropic's errors (the ``anthropic`` SDK's status errors, by duck typing: no SDK import).

    529 ``overloaded_error`` is a retried server error, not a rate limit; a spend limit
    (``enforced_spend_limit_reached``, a ``billing_error``, "credit balance is too low") is
    ``insufficient_balance``, not retried, its ``hint`` saying why the batch stops.
    Anything else is left to the built-in rules.
    """

    def classify(self, exception: Exception) -> ErrorInfo:
        verdict = sdk_verdict(exception)
        if verdict is None:
            return super().classify(exception)
        category, retry_after, stops = verdict
        return ErrorInfo(
            is_retryable=category.retryable and stops is None,
            is_rate_limit=category is ErrorCategory.RATE_LIMIT,
            is_timeout=category is ErrorCategory.TIMEOUT,
            error_category=category.value,
            suggested_wait=retry_after,
            hint=stops,
        )


class OpenRouterErrorClassifier(DefaultErrorClassifier):
    """OpenRouter's error shapes, for exceptions our strategies did not raise (an SDK's, your own).

    An exception whose ``body`` holds OpenRouter's ``{"error": {"code": N, ...}}`` is
    filed by the number ``N`` as that HTTP status would be, also when the HTTP status
    was 200 (OpenRouter reports some failures inside a 200 answer): a 429 inside is a
    rate limit, 402 (credits spent) is ``insufficient_balance``, and a 502 or the code
    ``no_provider_available`` is a server error, retried. Anything else goes to the
    built-in rules, which already file ``llm("openrouter:...")``'s own errors this way.
    """

    def classify(self, exception: Exception) -> ErrorInfo:
        code = _openrouter_code(getattr(exception, "body", None))
        category = None
        if isinstance(code, int):
            category = category_by_status(code)
        elif code == "no_provider_available":
            category = ErrorCategory.SERVER
        if category is None:
            return super().classify(exception)
        return ErrorInfo(
            is_retryable=category.retryable,
            is_rate_limit=category is ErrorCategory.RATE_LIMIT,
            is_timeout=category is ErrorCategory.TIMEOUT,
            error_category=category.value,
            suggested_wait=_classify(exception).retry_after,
            hint=PAYMENT_REQUIRED_STOPS if code == 402 else None,
        )


def _openrouter_code(body: object) -> int | str | None:
    """The ``code`` of OpenRouter's error body (``{"error": {...}}`` or the inner object), as a number
    when it is one."""
    if not isinstance(body, Mapping):
        return None
    inner = body.get("error", body)
    code = inner.get("code") if isinstance(inner, Mapping) else None
    if isinstance(code, bool):
        return None
    if isinstance(code, str) and code.isdigit():
        return int(code)
    return code if isinstance(code, (int, str)) else None


class GeminiErrorClassifier(DefaultErrorClassifier):
    """google-genai's ``APIError`` (read by its ``code`` and ``details``, no SDK import) by Gemini's table:
    ``RetryInfo.retryDelay`` as the wait, a per-day quota final. Anything else: the built-in rules."""

    def classify(self, exception: Exception) -> ErrorInfo | None:  # type: ignore[override]
        from .._strategies.gemini._errors import api_error_of

        error = api_error_of(exception)
        if error is None:
            if getattr(exception, "stops_batch", None):
                return None  # a ProviderError that stops the batch: the built-in rules keep its reason
            return super().classify(exception)
        category = error.category
        return ErrorInfo(
            is_retryable=category.retryable and error.stops_batch is None,
            is_rate_limit=category is ErrorCategory.RATE_LIMIT,
            is_timeout=category is ErrorCategory.TIMEOUT,
            error_category=category.value,
            suggested_wait=error.retry_after,
            hint=error.stops_batch,
        )
