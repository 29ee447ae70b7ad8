"""Issue 4: classification of one attempt's failure, and Retry-After parsing.

``classify`` is a pure synchronous function (no event loop, no backend), so
these tests call it directly. They run over fake exception classes shaped like
openai's and httpx's (same names, same attributes) and over the real openai and
httpx2 classes, to show the duck typing matches the real thing.
"""

from __future__ import annotations

import email.utils
import json
from typing import Any

import httpx2
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion

from trio_batch_llm import ErrorCategory, ItemDeadlineExceeded, ProviderError
from trio_batch_llm._engine._classify import Classification, classify
from trio_batch_llm._values._retry_after import parse_retry_after

C = ErrorCategory
NOW = 1_700_000_000.0  # a fixed wall clock for HTTP-date Retry-After values


# --------------------------------------------------------------------------
# Fakes with the openai / httpx names and attributes (no SDK involved)


class FakeResponse:
    def __init__(self, status_code: int, headers: dict[str, str] | None = None, text: str = "") -> None:
        self.status_code = status_code
        self.headers = headers or {}
        self.text = text


class APIError(Exception):
    def __init__(self, message: str = "", *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class APIConnectionError(APIError):
    pass


class APITimeoutError(APIConnectionError):
    pass


class APIStatusError(APIError):
    def __init__(self, message: str, *, response: FakeResponse, code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.response = response
        self.status_code = response.status_code


class RateLimitError(APIStatusError):
    pass


class BadRequestError(APIStatusError):
    pass


class AuthenticationError(APIStatusError):
    pass


class PermissionDeniedError(APIStatusError):
    pass


class HTTPError(Exception):
    pass


class TransportError(HTTPError):
    pass


class TimeoutException(TransportError):
    pass


class ReadTimeout(TimeoutException):
    pass


class NetworkError(TransportError):
    pass


class ConnectError(NetworkError):
    pass


class ReadError(NetworkError):
    pass


class RemoteProtocolError(TransportError):
    pass


class HTTPStatusError(HTTPError):
    def __init__(self, message: str, *, response: FakeResponse) -> None:
        super().__init__(message)
        self.response = response


class WithStatus(Exception):
    def __init__(self, status_code: Any) -> None:
        super().__init__(f"status {status_code}")
        self.status_code = status_code


def status(code: int, text: str = "", headers: dict[str, str] | None = None) -> FakeResponse:
    return FakeResponse(code, headers, text)


FAKE_CASES: list[tuple[str, Exception, ErrorCategory]] = [
    ("api-timeout", APITimeoutError("Request timed out."), C.TIMEOUT),
    ("api-connection", APIConnectionError("Connection error."), C.TRANSIENT),
    ("rate-limit", RateLimitError("slow down", response=status(429)), C.RATE_LIMIT),
    ("quota-429", RateLimitError("quota", response=status(429), code="insufficient_quota"),
     C.INSUFFICIENT_BALANCE),
    ("bad-request", BadRequestError("bad", response=status(400)), C.INVALID_REQUEST),
    ("context-code", BadRequestError("bad", response=status(400), code="context_length_exceeded"),
     C.CONTEXT_LENGTH),
    ("content-filter-code", BadRequestError("bad", response=status(400), code="content_filter"),
     C.CONTENT_POLICY),
    ("content-policy-code",
     BadRequestError("bad", response=status(400), code="content_policy_violation"), C.CONTENT_POLICY),
    ("auth", AuthenticationError("no", response=status(401)), C.AUTHENTICATION),
    ("permission", PermissionDeniedError("no", response=status(403)), C.AUTHENTICATION),
    ("httpx-timeout", ReadTimeout("read timed out"), C.TIMEOUT),
    ("httpx-connect", ConnectError("refused"), C.TRANSIENT),
    ("httpx-read", ReadError("reset"), C.TRANSIENT),
    ("httpx-protocol", RemoteProtocolError("peer closed"), C.TRANSIENT),
    ("httpx-network", NetworkError("down"), C.TRANSIENT),
    ("httpx-status-429", HTTPStatusError("x", response=status(429)), C.RATE_LIMIT),
    ("httpx-status-503", HTTPStatusError("x", response=status(503)), C.SERVER),
    ("httpx-status-400-context",
     HTTPStatusError("x", response=status(400, '{"error": {"code": "context_length_exceeded"}}')),
     C.CONTEXT_LENGTH),
    ("httpx-status-400-wording",
     HTTPStatusError("x", response=status(400, "This model's maximum context length is 8192 tokens")),
     C.CONTEXT_LENGTH),
    ("httpx-status-400-plain", HTTPStatusError("x", response=status(400, "bad json")), C.INVALID_REQUEST),
    ("status-429", WithStatus(429), C.RATE_LIMIT),
    ("status-408", WithStatus(408), C.TIMEOUT),
    ("status-500", WithStatus(500), C.SERVER),
    ("status-502", WithStatus(502), C.SERVER),
    ("status-599", WithStatus(599), C.SERVER),
    ("status-401", WithStatus(401), C.AUTHENTICATION),
    ("status-403", WithStatus(403), C.AUTHENTICATION),
    ("status-402", WithStatus(402), C.INSUFFICIENT_BALANCE),
    ("status-400", WithStatus(400), C.INVALID_REQUEST),
    ("status-422", WithStatus(422), C.INVALID_REQUEST),
    ("status-404", WithStatus(404), C.INVALID_REQUEST),
    ("status-409", WithStatus(409), C.TRANSIENT),
    ("status-as-text", WithStatus("503"), C.SERVER),
    ("status-bool-ignored", WithStatus(True), C.UNKNOWN),
    ("status-garbage", WithStatus("soon"), C.UNKNOWN),
    ("status-302", WithStatus(302), C.UNKNOWN),
    ("deadline", ItemDeadlineExceeded("item deadline"), C.DEADLINE),
    ("timeout", TimeoutError(), C.TIMEOUT),
    ("connection-reset", ConnectionResetError(), C.TRANSIENT),
    ("oserror", OSError("network unreachable"), C.TRANSIENT),
    ("json", json.JSONDecodeError("Expecting value", "x", 0), C.PARSE),
    ("value-error", ValueError("bad"), C.LOGIC_ERROR),
    ("runtime-error", RuntimeError("boom"), C.UNKNOWN),
]


@pytest.mark.parametrize(("exc", "expected"), [pytest.param(e, c, id=i) for i, e, c in FAKE_CASES])
def test_default_rules_over_fakes(exc: Exception, expected: ErrorCategory) -> None:
    assert classify(exc).category is expected


def test_status_code_is_recorded_from_attribute_or_response() -> None:
    assert classify(WithStatus(429)).status_code == 429
    assert classify(HTTPStatusError("x", response=status(502))).status_code == 502
    assert classify(ValueError()).status_code is None


# --------------------------------------------------------------------------
# The real SDK classes

REQUEST = httpx2.Request("POST", "https://api.example/v1/chat/completions")


def response(code: int, *, json_body: Any = None, headers: dict[str, str] | None = None) -> httpx2.Response:
    return httpx2.Response(code, json=json_body, headers=headers, request=REQUEST)


def openai_status(cls: type[openai.APIStatusError], code: int, error: dict[str, Any] | None = None,
                  headers: dict[str, str] | None = None) -> openai.APIStatusError:
    body = {"error": error} if error is not None else None
    return cls(f"Error code: {code}", response=response(code, json_body=body, headers=headers),
               body=error)


REAL_CASES: list[tuple[str, Exception, ErrorCategory]] = [
    ("openai-timeout", openai.APITimeoutError(request=REQUEST), C.TIMEOUT),
    ("openai-connection", openai.APIConnectionError(request=REQUEST), C.TRANSIENT),
    ("openai-rate-limit", openai_status(openai.RateLimitError, 429, {"code": "rate_limit_exceeded"}),
     C.RATE_LIMIT),
    ("openai-insufficient-quota",
     openai_status(openai.RateLimitError, 429,
                   {"message": "You exceeded your current quota", "code": "insufficient_quota"}),
     C.INSUFFICIENT_BALANCE),
    ("openai-context-length",
     openai_status(openai.BadRequestError, 400,
                   {"message": "This model's maximum context length is 8192 tokens",
                    "code": "context_length_exceeded"}),
     C.CONTEXT_LENGTH),
    ("openai-content-filter",
     openai_status(openai.BadRequestError, 400, {"message": "filtered", "code": "content_filter"}),
     C.CONTENT_POLICY),
    ("openai-bad-request", openai_status(openai.BadRequestError, 400, {"message": "bad 'model'"}),
     C.INVALID_REQUEST),
    ("openai-auth", openai_status(openai.AuthenticationError, 401), C.AUTHENTICATION),
    ("openai-permission", openai_status(openai.PermissionDeniedError, 403), C.AUTHENTICATION),
    ("openai-not-found", openai_status(openai.NotFoundError, 404), C.INVALID_REQUEST),
    ("openai-conflict", openai_status(openai.ConflictError, 409), C.TRANSIENT),
    ("openai-unprocessable", openai_status(openai.UnprocessableEntityError, 422), C.INVALID_REQUEST),
    ("openai-server", openai_status(openai.InternalServerError, 500), C.SERVER),
    ("openai-overloaded-529", openai_status(openai.APIStatusError, 529), C.SERVER),
    ("openai-content-finish", openai.ContentFilterFinishReasonError(), C.CONTENT_POLICY),
    ("openai-length-finish",
     openai.LengthFinishReasonError(completion=ChatCompletion.model_construct(usage=None)), C.PARSE),
    ("openai-bare-api-error", openai.APIError("stream broke", REQUEST, body=None), C.UNKNOWN),
    ("httpx2-connect-timeout", httpx2.ConnectTimeout("t", request=REQUEST), C.TIMEOUT),
    ("httpx2-read-timeout", httpx2.ReadTimeout("t", request=REQUEST), C.TIMEOUT),
    ("httpx2-write-timeout", httpx2.WriteTimeout("t", request=REQUEST), C.TIMEOUT),
    ("httpx2-pool-timeout", httpx2.PoolTimeout("t", request=REQUEST), C.TIMEOUT),
    ("httpx2-connect", httpx2.ConnectError("refused", request=REQUEST), C.TRANSIENT),
    ("httpx2-read", httpx2.ReadError("reset", request=REQUEST), C.TRANSIENT),
    ("httpx2-write", httpx2.WriteError("broken pipe", request=REQUEST), C.TRANSIENT),
    ("httpx2-remote-protocol", httpx2.RemoteProtocolError("peer closed", request=REQUEST), C.TRANSIENT),
    ("httpx2-unsupported-protocol", httpx2.UnsupportedProtocol("ftp", request=REQUEST), C.UNKNOWN),
    ("httpx2-status-429",
     httpx2.HTTPStatusError("x", request=REQUEST, response=response(429)), C.RATE_LIMIT),
    ("httpx2-status-500",
     httpx2.HTTPStatusError("x", request=REQUEST, response=response(500)), C.SERVER),
    ("httpx2-status-401",
     httpx2.HTTPStatusError("x", request=REQUEST, response=response(401)), C.AUTHENTICATION),
    ("httpx2-status-402",
     httpx2.HTTPStatusError("x", request=REQUEST, response=response(402)), C.INSUFFICIENT_BALANCE),
    ("httpx2-status-408",
     httpx2.HTTPStatusError("x", request=REQUEST, response=response(408)), C.TIMEOUT),
    ("httpx2-status-422",
     httpx2.HTTPStatusError("x", request=REQUEST, response=response(422)), C.INVALID_REQUEST),
    ("httpx2-status-400-context",
     httpx2.HTTPStatusError(
         "x", request=REQUEST,
         response=response(400, json_body={"error": {"code": "context_length_exceeded"}})),
     C.CONTEXT_LENGTH),
]


@pytest.mark.parametrize(("exc", "expected"), [pytest.param(e, c, id=i) for i, e, c in REAL_CASES])
def test_default_rules_over_real_sdk_exceptions(exc: Exception, expected: ErrorCategory) -> None:
    assert classify(exc).category is expected


def test_real_openai_rate_limit_carries_status_and_retry_after() -> None:
    exc = openai_status(openai.RateLimitError, 429, {"code": "rate_limit_exceeded"},
                        headers={"Retry-After": "7"})
    assert classify(exc) == Classification(C.RATE_LIMIT, 7.0, 429)


def test_real_httpx2_status_error_retry_after_http_date() -> None:
    when = email.utils.formatdate(NOW + 30, usegmt=True)
    exc = httpx2.HTTPStatusError("x", request=REQUEST, response=response(503, headers={"retry-after": when}))
    assert classify(exc, now=NOW) == Classification(C.SERVER, 30.0, 503)


def test_unread_streaming_body_is_not_read() -> None:
    # A streamed response nobody read raises ResponseNotRead on .text; classify
    # must not fail (nor touch the network) because of it.
    streamed = httpx2.Response(400, request=REQUEST, stream=httpx2.ByteStream(b"context_length_exceeded"))
    exc = httpx2.HTTPStatusError("x", request=REQUEST, response=streamed)
    assert classify(exc).category is C.INVALID_REQUEST


# --------------------------------------------------------------------------
# ProviderError and precedence


def test_provider_error_taken_at_its_word() -> None:
    exc = ProviderError("overloaded", category=C.SERVER, retry_after=2.5, status_code=503)
    assert classify(exc) == Classification(C.SERVER, 2.5, 503)


def test_provider_error_word_beats_its_status_code() -> None:
    # The strategy says RATE_LIMIT for a 503 (some providers signal throttling that way).
    exc = ProviderError("throttled", category=C.RATE_LIMIT, status_code=503)
    assert classify(exc).category is C.RATE_LIMIT


def test_provider_error_negative_or_nan_retry_after_is_cleaned() -> None:
    assert classify(ProviderError("x", category=C.RATE_LIMIT, retry_after=-3)).retry_after == 0.0
    assert classify(ProviderError("x", category=C.RATE_LIMIT, retry_after=float("nan"))).retry_after is None


def _strategy(answer: tuple[ErrorCategory, float | None] | None, seen: list[str]) -> Any:
    def classify_error(exc: Exception) -> tuple[ErrorCategory, float | None] | None:
        seen.append("strategy")
        return answer
    return classify_error


def _user(answer: Any, seen: list[str]) -> Any:
    def classifier(exc: Exception) -> Any:
        seen.append("user")
        return answer
    return classifier


def test_user_beats_strategy_beats_default() -> None:
    exc = WithStatus(500)  # default: SERVER
    seen: list[str] = []
    got = classify(exc, user_classifier=_user(C.AUTHENTICATION, seen),
                   strategy_classifier=_strategy((C.PARSE, None), seen))
    assert got.category is C.AUTHENTICATION
    assert seen == ["user"]  # the strategy was not even asked


def test_user_none_defers_to_strategy() -> None:
    seen: list[str] = []
    got = classify(WithStatus(500), user_classifier=_user(None, seen),
                   strategy_classifier=_strategy((C.PARSE, 4.0), seen))
    assert got == Classification(C.PARSE, 4.0, 500)
    assert seen == ["user", "strategy"]


def test_both_none_defer_to_default() -> None:
    seen: list[str] = []
    got = classify(WithStatus(500), user_classifier=_user(None, seen),
                   strategy_classifier=_strategy(None, seen))
    assert got.category is C.SERVER
    assert seen == ["user", "strategy"]


def test_user_classifier_overrides_provider_error() -> None:
    exc = ProviderError("x", category=C.SERVER)
    assert classify(exc, user_classifier=lambda e: C.CONTENT_POLICY).category is C.CONTENT_POLICY


def test_deferring_classifiers_leave_provider_error_at_its_word() -> None:
    exc = ProviderError("x", category=C.TIMEOUT, retry_after=1.0)
    got = classify(exc, user_classifier=lambda e: None, strategy_classifier=lambda e: None)
    assert got == Classification(C.TIMEOUT, 1.0, None)


def test_user_tuple_sets_retry_after() -> None:
    got = classify(ValueError(), user_classifier=lambda e: (C.RATE_LIMIT, 9.0))
    assert got == Classification(C.RATE_LIMIT, 9.0, None)


def test_classifier_category_alone_keeps_the_response_retry_after() -> None:
    exc = HTTPStatusError("x", response=status(503, headers={"retry-after": "12"}))
    assert classify(exc, user_classifier=lambda e: C.RATE_LIMIT) == Classification(C.RATE_LIMIT, 12.0, 503)
    assert classify(exc, strategy_classifier=lambda e: (C.RATE_LIMIT, None)).retry_after == 12.0


def test_user_classifier_may_answer_with_the_category_value() -> None:
    assert classify(ValueError(), user_classifier=lambda e: "parse").category is C.PARSE


def test_a_failing_classifier_propagates() -> None:
    def broken(exc: Exception) -> ErrorCategory:
        raise KeyError("bug in user code")

    with pytest.raises(KeyError, match="bug in user code"):
        classify(ValueError("original"), user_classifier=broken)


def test_base_exceptions_are_rejected_by_type() -> None:
    with pytest.raises(TypeError, match="KeyboardInterrupt"):
        classify(KeyboardInterrupt())  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# Retry-After


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("120", 120.0),
        (" 3 ", 3.0),
        ("0", 0.0),
        ("1.5", 1.5),
        (email.utils.formatdate(NOW + 90, usegmt=True), 90.0),
        (email.utils.formatdate(NOW - 90, usegmt=True), 0.0),  # in the past: clamped
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
        (email.utils.formatdate(NOW + 5, usegmt=False).replace("+0000", "-0000"), 5.0),
        ("", None),
        ("   ", None),
        ("soon", None),
        ("-5", None),
        ("nan", None),
        ("inf", None),
        ("Wed, 99 Foo 2015 07:28:00 GMT", None),
        ("12 apples", None),
    ],
)
def test_parse_retry_after(value: str, expected: float | None) -> None:
    assert parse_retry_after(value, now=NOW) == expected


def test_retry_after_from_exception_attribute() -> None:
    exc = WithStatus(429)
    exc.retry_after = 4  # type: ignore[attr-defined]
    assert classify(exc).retry_after == 4.0
    exc.retry_after = "6"  # type: ignore[attr-defined]
    assert classify(exc).retry_after == 6.0


def test_retry_after_attribute_wins_over_headers() -> None:
    exc = HTTPStatusError("x", response=status(429, headers={"retry-after": "30"}))
    exc.retry_after = 2.0  # type: ignore[attr-defined]
    assert classify(exc).retry_after == 2.0


def test_retry_after_ms_wins_over_retry_after() -> None:
    exc = HTTPStatusError("x", response=status(429, headers={"retry-after-ms": "250", "retry-after": "9"}))
    assert classify(exc).retry_after == 0.25


def test_garbage_retry_after_ms_falls_back_to_retry_after() -> None:
    exc = HTTPStatusError("x", response=status(429, headers={"retry-after-ms": "x", "retry-after": "9"}))
    assert classify(exc).retry_after == 9.0


def test_plain_dict_headers_are_matched_case_insensitively() -> None:
    exc = HTTPStatusError("x", response=status(429, headers={"Retry-After": "11"}))
    assert classify(exc).retry_after == 11.0


@pytest.mark.parametrize("garbage", ["later", "", "-1", "Thu, 32 Jan"])
def test_garbage_retry_after_header_gives_none(garbage: str) -> None:
    exc = HTTPStatusError("x", response=status(429, headers={"retry-after": garbage}))
    assert classify(exc) == Classification(C.RATE_LIMIT, None, 429)


def test_http_date_is_measured_from_the_wall_clock_by_default() -> None:
    import time

    far = email.utils.formatdate(time.time() + 3600, usegmt=True)
    got = parse_retry_after(far)
    assert got is not None
    assert 3500 < got <= 3600


@given(st.text(max_size=40))
def test_parse_retry_after_never_raises_and_is_never_negative(value: str) -> None:
    got = parse_retry_after(value, now=NOW)
    assert got is None or got >= 0


@given(st.integers(min_value=0, max_value=10**9))
def test_parse_retry_after_round_trips_delta_seconds(seconds: int) -> None:
    assert parse_retry_after(str(seconds)) == float(seconds)


@given(st.integers(min_value=-10**7, max_value=10**7))
def test_parse_retry_after_http_date_is_relative_to_now(offset: int) -> None:
    value = email.utils.formatdate(NOW + offset, usegmt=True)
    assert parse_retry_after(value, now=NOW) == max(0.0, float(offset))


def test_an_sdk_spend_limit_error_stops_the_batch_without_a_strategy_classifier() -> None:
    """anthropic's ``EnforcedSpendLimitReachedError`` (a ``RateLimitError`` subclass) raised by a user's own
    client: not a rate limit to wait out, but spent credit that ends the batch (issue 33)."""

    class RateLimitError(Exception):
        status_code = 429

    class EnforcedSpendLimitReachedError(RateLimitError):
        pass

    verdict = classify(EnforcedSpendLimitReachedError("spend limit reached"))
    assert verdict.category is ErrorCategory.INSUFFICIENT_BALANCE
    assert verdict.stops_batch is not None and "EnforcedSpendLimitReachedError" in verdict.stops_batch
    plain = classify(RateLimitError("slow down"))
    assert (plain.category, plain.stops_batch) == (ErrorCategory.RATE_LIMIT, None)
