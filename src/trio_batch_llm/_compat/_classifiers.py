"""async-batch-llm's classifier objects: ``classify(exc) -> ErrorInfo``, over this library's rules.

``error_classifier=`` takes such an object as well as a function; an ``ErrorInfo`` it
returns is read as the category that makes the same decision (see
``trio_batch_llm._engine._classifier_objects``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import final

from .._engine._classify import classify as _classify
from .._strategies.anthropic._errors import sdk_verdict
from .._values._categories import ErrorCategory

__all__ = [
    "AnthropicErrorClassifier",
    "DefaultErrorClassifier",
    "ErrorClassifier",
    "ErrorInfo",
    "GeminiErrorClassifier",
    "OpenAIErrorClassifier",
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
