"""Error classification: one failed attempt's exception -> an :class:`ErrorCategory`.

Over 400 lines because the built-in rules (class names, statuses, built-in types, wording) are one
precedence order, and their tables read best beside the code that applies them in that order.

The engine has exactly one ``except Exception`` boundary around an attempt and
calls :func:`classify` from it. Cancellation, ``KeyboardInterrupt`` and
``SystemExit`` are ``BaseException`` subclasses that never reach that boundary,
so they are never classified (``classify`` rejects them by type).

Provider SDKs are recognised by duck typing -- class names in the exception's
MRO and the attributes ``status_code``, ``response.status_code``,
``response.headers``, ``code`` and ``body`` -- so this module imports neither
``openai`` nor ``httpx2``. Matching by name also covers the other SDKs built
from the same generator (anthropic and friends use the same class names).

The built-in rules, most specific first: a :class:`ProviderError`'s own word; an
item deadline; an SDK class name; an HTTP status; then by built-in type --
timeouts, socket errors, an answer that does not decode (``JSONDecodeError``,
``UnicodeDecodeError``: ``PARSE``), a request that cannot be encoded. Only an
exception no rule above knows, of type ``ValueError``, ``TypeError``,
``KeyError``, ``AttributeError`` or ``NameError``, is ``LOGIC_ERROR``: a bug in
the strategy's code, not retried. Libraries' exceptions of those types that are
about data keep their rule (pydantic's ``ValidationError`` is ``PARSE`` by name),
and a ``ValueError`` that says "429" in words is still a rate limit. Anything
else is ``UNKNOWN``, which is retried.

``Retry-After`` is read by :mod:`trio_batch_llm._values._retry_after`, the one
reader every path shares.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, TypeAlias, final

from .._values._categories import ErrorCategory
from .._values._errors import ItemDeadlineExceeded, ProviderError
from .._values._retry_after import parse_retry_after, retry_after_from_headers
from ._endpoint import endpoint_unusable

__all__ = [
    "Classification",
    "ClassifierFunction",
    "StrategyClassifier",
    "category_by_status",
    "classify",
]

ClassifierVerdict: TypeAlias = ErrorCategory | tuple[ErrorCategory, float | None] | None
ClassifierFunction: TypeAlias = Callable[[Exception], ClassifierVerdict]
"""A user classifier as the engine calls it: ``None`` defers; a category or ``(category, retry_after)``
decides. Whatever ``error_classifier=`` was given (a function, or an object with ``classify`` such as the
public :class:`trio_batch_llm.ErrorClassifier`) becomes one of these once
(:func:`~trio_batch_llm._engine._classifier_objects.user_classifier`); the name differs from the
public class's so that ``ErrorClassifier`` means one thing."""
StrategyClassifier: TypeAlias = Callable[[Exception], tuple[ErrorCategory, float | None] | None]
"""The shape of :meth:`LLMCallStrategy.classify_error`."""


@final
@dataclass(frozen=True, slots=True)
class Classification:
    """How one failed attempt is treated.

    ``retry_after`` is the provider's minimum wait in seconds (``None`` when it
    gave none); ``status_code`` is the HTTP status when the exception carried one.
    ``unusable_because`` says why the failure is about the endpoint itself (connection
    refused, DNS, TLS, 401/403, a 404 about the model: :mod:`._endpoint`), whoever
    decided the category; ``None`` otherwise. What the circuit breaker counts.
    """

    category: ErrorCategory
    retry_after: float | None = None
    status_code: int | None = None
    unusable_because: str | None = None
    stops_batch: str | None = None
    """Why no later call to the provider can succeed (a per-day quota, a spend limit): the item is not
    retried and the batch stops at once (a strategy's :class:`ProviderError` says so)."""

    @property
    def endpoint_unusable(self) -> bool:
        """Whether the failure says the endpoint itself is unusable."""
        return self.unusable_because is not None

    @property
    def retryable(self) -> bool:
        return self.category.retryable


# Class names looked up along the exception's MRO, most derived first, so that
# openai's APITimeoutError (a subclass of APIConnectionError) is a TIMEOUT.
_BY_CLASS_NAME: Final[Mapping[str, ErrorCategory]] = {
    # openai (and other Stainless-generated SDKs)
    "APITimeoutError": ErrorCategory.TIMEOUT,
    "APIConnectionError": ErrorCategory.TRANSIENT,
    "RateLimitError": ErrorCategory.RATE_LIMIT,
    # anthropic's spend limits (subclasses of its RateLimitError): no wait ends them; the batch stops
    "EnforcedSpendLimitReachedError": ErrorCategory.INSUFFICIENT_BALANCE,
    "ContractSpendLimitReachedError": ErrorCategory.INSUFFICIENT_BALANCE,
    "LinkedOrganizationSpendLimitReachedError": ErrorCategory.INSUFFICIENT_BALANCE,
    "AuthenticationError": ErrorCategory.AUTHENTICATION,
    "PermissionDeniedError": ErrorCategory.AUTHENTICATION,
    "BadRequestError": ErrorCategory.INVALID_REQUEST,
    "UnprocessableEntityError": ErrorCategory.INVALID_REQUEST,
    "InternalServerError": ErrorCategory.SERVER,
    # anthropic's 529 overloaded_error and 503 (a provider-wide overload, retried with backoff, never a
    # cooldown of our scope); google-genai's 5xx (ServerError: its `code` is the status)
    "OverloadedError": ErrorCategory.SERVER,
    "ServiceUnavailableError": ErrorCategory.SERVER,
    "ServerError": ErrorCategory.SERVER,
    "ContentFilterFinishReasonError": ErrorCategory.CONTENT_POLICY,
    # The output hit max_tokens before a structured answer was complete.
    "LengthFinishReasonError": ErrorCategory.PARSE,
    "APIResponseValidationError": ErrorCategory.PARSE,
    # pydantic's (a ValueError) and jsonschema's: an answer that does not validate, not a bug in the
    # code that checked it; retried like any other PARSE failure (async-batch-llm retries it too).
    "ValidationError": ErrorCategory.PARSE,
    # httpx / httpx2 (HTTPStatusError is decided by its response's status)
    "TimeoutException": ErrorCategory.TIMEOUT,
    "ConnectError": ErrorCategory.TRANSIENT,
    "ReadError": ErrorCategory.TRANSIENT,
    "WriteError": ErrorCategory.TRANSIENT,
    "CloseError": ErrorCategory.TRANSIENT,
    "RemoteProtocolError": ErrorCategory.TRANSIENT,
    "NetworkError": ErrorCategory.TRANSIENT,
    # trio's move_on/fail_after flavour, in case a strategy uses it directly
    "TooSlowError": ErrorCategory.TIMEOUT,
}

_CONTEXT_LENGTH_MARKERS: Final = (
    "context_length_exceeded",
    "context length",
    "context window",
    "maximum context",
    "prompt is too long",
    "input is too long",
    "too many tokens",
    "too many input tokens",
    "string_above_max_length",
    "reduce the length",
)
_CONTENT_POLICY_MARKERS: Final = (
    "content_filter",
    "content_policy",
    "content policy",
    "content management policy",
    "responsibleaipolicyviolation",
    "moderation_blocked",
    "invalid_prompt",
    "safety system",
)
# OpenAI answers 429 with code "insufficient_quota" when the account is out of
# credit: retrying that twenty times would only waste the rate-limit budget.
_BALANCE_MARKERS: Final = (
    "insufficient_quota",
    "exceeded your current quota",
    "insufficient balance",
    "billing_hard_limit_reached",
)
_TEXT_SCAN_LIMIT: Final = 4096
_RATE_LIMIT_TEXT: Final = re.compile(
    r"(?<![\w.])429(?![\w.])|rate[ _-]?limit|too many requests|resource_exhausted", re.IGNORECASE
)
_PYTHON_WORDED_BUGS: Final = (TypeError, KeyError, AttributeError, NameError)
"""With ``ValueError``, the exceptions that are ``LOGIC_ERROR`` when no more specific rule knows them."""
_CLASS_NAME_CACHE_SIZE: Final = 1024
_class_name_cache: dict[type[Exception], ErrorCategory | None] = {}


def classify(
    exc: Exception,
    *,
    strategy_classifier: StrategyClassifier | None = None,
    user_classifier: ClassifierFunction | None = None,
    now: float | None = None,
) -> Classification:
    """Classify one attempt's failure.

    Called only from the engine's ``except Exception`` boundary: cancellation,
    ``KeyboardInterrupt`` and ``SystemExit`` never get here, and passing any
    non-``Exception`` raises ``TypeError``.

    Precedence: ``user_classifier``, then ``strategy_classifier`` (the
    strategy's ``classify_error``), then the built-in rules. A classifier
    returns ``None`` to defer to the next one. When a classifier decides the
    category but gives no retry-after, the exception's own Retry-After is used.
    A classifier that raises propagates (a bug in user code is not hidden).
    ``now`` is the wall-clock time (``time.time()`` by default) used to turn an
    HTTP-date Retry-After into seconds.
    """
    if not isinstance(exc, Exception):
        raise TypeError(f"classify() takes an Exception, not {type(exc).__name__}")
    # Fast path: the strategy has already said what the failure is.
    if user_classifier is None and strategy_classifier is None and isinstance(exc, ProviderError):
        return _provider_said(exc)

    for classifier in (user_classifier, strategy_classifier):
        if classifier is None:
            continue
        verdict = classifier(exc)
        if verdict is None:
            continue
        if isinstance(verdict, tuple):
            category, retry_after = ErrorCategory(verdict[0]), _clean_seconds(verdict[1])
        else:
            category, retry_after = ErrorCategory(verdict), None
        if retry_after is None:
            retry_after = _retry_after_of(exc, now)
        status = _status_code_of(exc)
        # A classifier decides how the failure is treated, not whether the provider said the batch is over.
        return Classification(category, retry_after, status, _unusable(exc, status), _stops_batch_of(exc))

    return _default(exc, now)


def _provider_said(exc: ProviderError) -> Classification:
    status = exc.status_code
    return Classification(exc.category, _clean_seconds(exc.retry_after), status, _unusable(exc, status),
                          exc.stops_batch)


def _unusable(exc: Exception, status: int | None) -> str | None:
    return endpoint_unusable(exc, status, _error_text(exc) if status == 404 else None)


def _default(exc: Exception, now: float | None) -> Classification:
    if isinstance(exc, ProviderError):
        return _provider_said(exc)
    status = _status_code_of(exc)
    retry_after = _retry_after_of(exc, now)
    if isinstance(exc, ItemDeadlineExceeded):
        return Classification(ErrorCategory.DEADLINE, retry_after, status)
    category = _category_by_class_name(type(exc))
    if category is None and status is not None:
        category = category_by_status(status)
    if category is None:
        category = _category_by_builtin_type(exc)
    return Classification(_refine(category, exc), retry_after, status, _unusable(exc, status),
                          _stops_batch_of(exc))


def _stops_batch_of(exc: Exception) -> str | None:
    """``stops_batch`` of any exception, read duck-typed: a strategy may keep an SDK's own exception
    (CONTRACT C7.2) and mark it, as the Anthropic strategy marks a spent spend limit. An SDK exception
    whose class says a spend limit is spent stops the batch unmarked too (a user's own client)."""
    stops = getattr(exc, "stops_batch", None)
    if isinstance(stops, str) and stops.strip():
        return stops
    name = type(exc).__name__
    if name.endswith("SpendLimitReachedError"):
        return f"the provider's spend limit is reached ({name}): no later call can succeed until it is raised"
    return None


def _category_by_class_name(exc_type: type[Exception]) -> ErrorCategory | None:
    # An MRO never changes, so the walk is done once per exception type.
    try:
        return _class_name_cache[exc_type]
    except KeyError:
        pass
    found = None
    for klass in exc_type.__mro__:
        found = _BY_CLASS_NAME.get(klass.__name__)
        if found is not None:
            break
    if len(_class_name_cache) >= _CLASS_NAME_CACHE_SIZE:  # types made on the fly must not pile up
        _class_name_cache.clear()
    _class_name_cache[exc_type] = found
    return found


def category_by_status(status: int) -> ErrorCategory | None:
    """The category an HTTP status alone says (``None`` for a status that says nothing, such as 2xx).

    Shared with :class:`trio_batch_llm.OpenRouterErrorClassifier`, which files the status inside an
    OpenRouter error body by the same table."""
    if status == 429:
        return ErrorCategory.RATE_LIMIT
    if status == 408:
        return ErrorCategory.TIMEOUT
    if 500 <= status <= 599:
        return ErrorCategory.SERVER
    if status in (401, 403):
        return ErrorCategory.AUTHENTICATION
    if status == 402:
        return ErrorCategory.INSUFFICIENT_BALANCE
    # 409 (conflict / lock timeout) and 425 (too early) clear up on their own.
    if status in (409, 425):
        return ErrorCategory.TRANSIENT
    if 400 <= status <= 499:
        # 400, 422 and the other client errors (404 unknown model, 413 too large):
        # sending the same request again gives the same answer.
        return ErrorCategory.INVALID_REQUEST
    return None


def _category_by_builtin_type(exc: Exception) -> ErrorCategory:
    if isinstance(exc, TimeoutError):
        return ErrorCategory.TIMEOUT
    if isinstance(exc, OSError):  # ConnectionError and the rest of the socket family
        return ErrorCategory.TRANSIENT
    if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)):
        # An answer that is not JSON, or not text: the data was bad, not the code; asking again may help.
        return ErrorCategory.PARSE
    if isinstance(exc, UnicodeEncodeError):
        # Text that cannot be encoded (a lone surrogate in a request an SDK builds) fails alike every time.
        return ErrorCategory.INVALID_REQUEST
    if isinstance(exc, _PYTHON_WORDED_BUGS):
        # Python's own words about the code ("'NoneType' object has no attribute 'text'", a key's repr):
        # never a provider's message, so the rate-limit wording below must not read them.
        return ErrorCategory.LOGIC_ERROR
    if _RATE_LIMIT_TEXT.search(str(exc)[:_TEXT_SCAN_LIMIT]):
        # An SDK or wrapper that says "429" only in words: retrying it without a cooldown
        # would hammer the provider (async-batch-llm reads the text too).
        return ErrorCategory.RATE_LIMIT
    if isinstance(exc, ValueError):
        # Reached only when no rule above knew it (no SDK class, no status, not a decoding
        # failure of an answer): a bug in the strategy, which another call would pay for again.
        return ErrorCategory.LOGIC_ERROR
    return ErrorCategory.UNKNOWN


def _refine(category: ErrorCategory, exc: Exception) -> ErrorCategory:
    """Look at the error code and wording where the status alone is ambiguous."""
    if category is ErrorCategory.INVALID_REQUEST:
        text = _error_text(exc)
        if any(marker in text for marker in _CONTEXT_LENGTH_MARKERS):
            return ErrorCategory.CONTEXT_LENGTH
        if any(marker in text for marker in _CONTENT_POLICY_MARKERS):
            return ErrorCategory.CONTENT_POLICY
        if any(marker in text for marker in _BALANCE_MARKERS):
            return ErrorCategory.INSUFFICIENT_BALANCE
    elif category is ErrorCategory.RATE_LIMIT:
        text = _error_text(exc)
        if any(marker in text for marker in _BALANCE_MARKERS):
            return ErrorCategory.INSUFFICIENT_BALANCE
    return category


def _error_text(exc: Exception) -> str:
    """The exception's message, code, body and (already read) response text, lowercased."""
    parts = [str(exc)]
    for name in ("code", "type", "body", "message"):
        value = getattr(exc, name, None)
        if value is not None:
            parts.append(str(value))
    response = getattr(exc, "response", None)
    if response is not None:
        parts.append(_response_text(response))
    return " ".join(parts)[: _TEXT_SCAN_LIMIT * 2].lower()


def _response_text(response: object) -> str:
    # httpx raises ResponseNotRead for a streamed body nobody read; classifying
    # must not read the network, so an unread body simply contributes nothing.
    try:
        text = getattr(response, "text", "")
    except Exception:  # noqa: BLE001 - any failure means "no body text available"
        return ""
    return text[:_TEXT_SCAN_LIMIT] if isinstance(text, str) else ""


def _status_code_of(exc: Exception) -> int | None:
    status = _as_status(getattr(exc, "status_code", None))
    if status is None:
        response = getattr(exc, "response", None)
        if response is not None:
            status = _as_status(getattr(response, "status_code", None))
    if status is None:
        # google-genai's APIError keeps the status as an int `code` (OpenAI's `code` is a word).
        code = getattr(exc, "code", None)
        if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599:
            status = code
    return status


def _as_status(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 100 <= value <= 999 else None
    if isinstance(value, str) and value.isdigit():
        return _as_status(int(value))
    return None


def _retry_after_of(exc: Exception, now: float | None) -> float | None:
    own = getattr(exc, "retry_after", None)
    if own is not None:
        seconds = parse_retry_after(own, now=now) if isinstance(own, (str, bytes)) else _clean_seconds(own)
        if seconds is not None:
            return seconds
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) if response is not None else None
    return None if headers is None else retry_after_from_headers(headers, now=now)


def _clean_seconds(value: object) -> float | None:
    """A finite, non-negative number of seconds, or ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    seconds = float(value)
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)
