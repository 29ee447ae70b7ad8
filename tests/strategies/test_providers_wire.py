"""Provider strategies against httpx2.MockTransport: exact requests, parsing, every error mapping.

No sockets: the layer below the strategies is faked (STYLE 17). Real loopback
HTTP lives in test_providers_http.py.
"""

from __future__ import annotations

import email.utils
import json
import pickle
import subprocess
import sys
import traceback
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import httpx2
import openai
import pytest

from trio_batch_llm import BatchLLMError, ConfigurationError, ErrorCategory, ProviderError
from trio_batch_llm._engine._classify import Classification, classify
from trio_batch_llm._strategies._factory import llm
from trio_batch_llm._strategies._keys import Secret
from trio_batch_llm._strategies.openai._compatible import OpenAICompatibleStrategy
from trio_batch_llm._strategies.openai._sdk import OpenAIStrategy
from trio_batch_llm._strategies.openai._wire_errors import error_from_status
from trio_batch_llm._values._retry_after import retry_after_from_headers as parse_retry_after

pytestmark = pytest.mark.anyio

KEY = "sk-test-SECRET-0123456789abcdef"
BASE = "http://mock.test/v1"
Handler = Callable[[httpx2.Request], httpx2.Response]

CHAT_OK = {
    "id": "chatcmpl-1", "model": "m-served", "object": "chat.completion", "created": 1,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi there"},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10,
              "prompt_tokens_details": {"cached_tokens": 2}},
}
RESPONSES_OK = {
    "id": "resp_1", "object": "response", "created_at": 1, "model": "m-served", "status": "completed",
    "output": [
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "hi ", "annotations": []},
                     {"type": "output_text", "text": "there", "annotations": []}]},
    ],
    "usage": {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10,
              "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 1}},
}
OK_BODY = {"chat": CHAT_OK, "responses": RESPONSES_OK}


class Recorder:
    """A MockTransport handler that records requests and replays scripted responses."""

    def __init__(self, *responses: httpx2.Response | Exception) -> None:
        self.responses = list(responses)
        self.requests: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        outcome = self.responses[min(len(self.requests), len(self.responses)) - 1]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    @property
    def bodies(self) -> list[Any]:
        return [json.loads(r.content) for r in self.requests]


def compat(recorder: Recorder, **kwargs: Any) -> tuple[OpenAICompatibleStrategy, httpx2.AsyncClient]:
    client = httpx2.AsyncClient(transport=httpx2.MockTransport(recorder))
    kwargs.setdefault("api_key", KEY)
    return OpenAICompatibleStrategy("m", base_url=BASE, client=client, **kwargs), client


def sdk(recorder: Recorder, **kwargs: Any) -> tuple[OpenAIStrategy, httpx2.AsyncClient]:
    http = httpx2.AsyncClient(transport=httpx2.MockTransport(recorder))
    client = openai.AsyncOpenAI(api_key=KEY, base_url=BASE, http_client=http, max_retries=4)
    return OpenAIStrategy("m", client=client, **kwargs), http


async def failure(strategy: OpenAICompatibleStrategy, prompt: str = "p") -> ProviderError:
    with pytest.raises(ProviderError) as info:
        await strategy.execute(prompt, 1, None)
    return info.value


async def sdk_failure(strategy: OpenAIStrategy, prompt: str = "p") -> tuple[Exception, Classification]:
    """The SDK's own exception (never wrapped, CONTRACT C7.2) and the engine's verdict on it."""
    with pytest.raises((openai.OpenAIError, json.JSONDecodeError)) as info:
        await strategy.execute(prompt, 1, None)
    assert not isinstance(info.value, BatchLLMError), repr(info.value)
    return info.value, classify(info.value, strategy_classifier=strategy.classify_error)


def verdict_of(error: Exception, strategy: OpenAICompatibleStrategy | OpenAIStrategy) -> Classification:
    return classify(error, strategy_classifier=strategy.classify_error)


# -- requests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_compatible_sends_exact_request(api: str) -> None:
    rec = Recorder(httpx2.Response(200, json=OK_BODY[api]))
    strategy, client = compat(rec, api=api, system_prompt="be brief", temperature=0.25, max_output_tokens=64,
                              extra_body={"seed": 7, "temperature": 0.5}, headers={"X-Trace": "t-1"})
    async with client:
        text, usage, metadata = await strategy.execute("hello", 1, None)
    (request,) = rec.requests
    assert request.method == "POST"
    assert str(request.url) == BASE + ("/chat/completions" if api == "chat" else "/responses")
    if api == "chat":
        assert rec.bodies == [{"model": "m", "messages": [{"role": "system", "content": "be brief"},
                                                          {"role": "user", "content": "hello"}],
                               "max_tokens": 64, "temperature": 0.5, "seed": 7}]
    else:
        assert rec.bodies == [{"model": "m", "input": "hello", "instructions": "be brief",
                               "max_output_tokens": 64, "temperature": 0.5, "seed": 7}]
    assert request.content == json.dumps(rec.bodies[0], separators=(",", ":")).encode()
    assert dict(request.headers) == {
        "host": "mock.test", "accept": "application/json", "accept-encoding": "gzip, deflate",
        "connection": "keep-alive", "user-agent": request.headers["user-agent"],
        "authorization": f"Bearer {KEY}", "content-type": "application/json", "x-trace": "t-1",
        "content-length": str(len(request.content)),
    }
    assert request.headers["user-agent"].startswith("trio-batch-llm/")
    assert text == "hi there"
    assert usage == {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10,
                     "cached_input_tokens": 2 if api == "chat" else 0,
                     **({} if api == "chat" else {"reasoning_tokens": 1})}
    assert metadata["id"] in ("chatcmpl-1", "resp_1")
    assert metadata["api"] == api
    assert metadata["status_code"] == 200
    assert KEY not in repr(metadata)


async def test_compatible_minimal_body_and_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    rec = Recorder(httpx2.Response(200, json=CHAT_OK))
    strategy, client = compat(rec, api_key=None)
    async with client:
        await strategy.execute("x", 1, None)
    assert rec.bodies == [{"model": "m", "messages": [{"role": "user", "content": "x"}]}]
    assert "authorization" not in rec.requests[0].headers


async def test_compatible_key_from_env_and_env_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("OTHER_KEY", "sk-other")
    rec = Recorder(httpx2.Response(200, json=CHAT_OK))
    # OPENAI_API_KEY goes to another endpoint only when named (issue 16: it is OpenAI's key)
    from_env, client = compat(rec, api_key=None, api_key_env="OPENAI_API_KEY")
    other = OpenAICompatibleStrategy("m", base_url=BASE, client=client, api_key_env="OTHER_KEY")
    never = OpenAICompatibleStrategy("m", base_url=BASE, client=client)
    async with client:
        for strategy in (from_env, other, never):
            await strategy.execute("x", 1, None)
    sent = [r.headers.get("authorization") for r in rec.requests]
    assert sent == ["Bearer sk-from-env", "Bearer sk-other", None]


async def test_informational_timeout_reaches_the_request() -> None:
    rec = Recorder(httpx2.Response(200, json=CHAT_OK))
    strategy, client = compat(rec)
    async with client:
        await strategy.execute("x", 1, 7.5)
        await strategy.execute("x", 1, None)
    assert rec.requests[0].extensions["timeout"] == {"connect": 7.5, "read": 7.5, "write": 7.5, "pool": 7.5}
    assert rec.requests[1].extensions["timeout"]["read"] == 5.0  # a user client keeps its own default


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_sdk_sends_exact_request_without_retrying(api: str) -> None:
    rec = Recorder(httpx2.Response(500, json={"error": {"message": "boom", "type": "server_error"}}),
                   httpx2.Response(200, json=OK_BODY[api]))
    strategy, http = sdk(rec, api=api, system_prompt="sys", temperature=0.0, max_output_tokens=9,
                         extra_body={"store": False}, headers={"X-Trace": "t-2"})
    async with http:
        error, verdict = await sdk_failure(strategy)
        assert len(rec.requests) == 1  # the user's client had max_retries=4; retries belong to the engine
        assert isinstance(error, openai.InternalServerError)
        assert (verdict.category, verdict.status_code) == (ErrorCategory.SERVER, 500)
        text, usage, metadata = await strategy.execute("hello", 1, 3.0)
    body = rec.bodies[1]
    if api == "chat":
        assert str(rec.requests[1].url) == BASE + "/chat/completions"
        assert body == {"model": "m", "messages": [{"role": "system", "content": "sys"},
                                                   {"role": "user", "content": "hello"}],
                        "temperature": 0.0, "max_completion_tokens": 9, "store": False}
    else:
        assert str(rec.requests[1].url) == BASE + "/responses"
        assert body == {"model": "m", "input": "hello", "instructions": "sys", "temperature": 0.0,
                        "max_output_tokens": 9, "store": False}
    headers = rec.requests[1].headers
    assert headers["authorization"] == f"Bearer {KEY}"
    assert headers["x-trace"] == "t-2"
    assert rec.requests[1].extensions["timeout"]["read"] == 3.0
    assert text == "hi there"
    assert usage is not None
    assert usage["total_tokens"] == 10
    assert metadata["api"] == api
    assert metadata["model"] == "m-served"


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("kind", ["compatible", "sdk"])
async def test_a_batch_request_line_carries_the_body_execute_sends(api: str, kind: str) -> None:
    """Provider-batch mode must ask for what a live call asks for: extra_body included (the SDK
    strategy keeps extra_body apart for the SDK, and its batch lines used to lose it)."""
    rec = Recorder(httpx2.Response(200, json=OK_BODY[api]))
    settings: dict[str, Any] = {"api": api, "system_prompt": "sys", "temperature": 0.0,
                                "max_output_tokens": 9, "extra_body": {"store": False, "seed": 7}}
    strategy, http = sdk(rec, **settings) if kind == "sdk" else compat(rec, **settings)
    async with http:
        await strategy.execute("hello", 1, None)
    request = strategy.batch_endpoint().encode_request("item-1", "hello")
    line = json.loads(request.line)
    assert request.line.endswith(b"\n") and request.line.count(b"\n") == 1
    path = "/chat/completions" if api == "chat" else "/responses"
    assert line == {"custom_id": "item-1", "method": "POST", "url": "/v1" + path, "body": rec.bodies[0]}
    assert request.text == "sys\nhello"


# -- responses ---------------------------------------------------------------------------------


PARSING_EDGES = [
    # (api, payload, text, usage)
    ("chat", {"choices": [{"message": {"content": None, "refusal": "no"}, "finish_reason": "stop"}]},
     "", None),
    ("chat", {"choices": [{"message": {"content": "a"}}], "usage": {"prompt_tokens": 1}},
     "a", {"input_tokens": 1}),
    ("responses", {"output": [], "status": "completed", "usage": {"input_tokens": 2, "output_tokens": 0}},
     "", {"input_tokens": 2, "output_tokens": 0}),
]


async def test_response_parsing_edges() -> None:
    for api, payload, text, usage in PARSING_EDGES:
        strategy, client = compat(Recorder(httpx2.Response(200, json=payload)), api=api)
        async with client:
            got_text, got_usage, metadata = await strategy.execute("x", 1, None)
        assert (got_text, got_usage) == (text, usage), payload
    assert metadata["status"] == "completed"


BAD_RESPONSES = [
    # (api, response, category)
    ("chat", httpx2.Response(200, content=b'{"choices": ['), ErrorCategory.PARSE),
    ("chat", httpx2.Response(200, json=[1, 2]), ErrorCategory.PARSE),
    ("chat", httpx2.Response(200, json={"choices": []}), ErrorCategory.PARSE),
    ("chat", httpx2.Response(200, json={"choices": [{"message": {"content": 5}}]}), ErrorCategory.PARSE),
    ("chat", httpx2.Response(200, json={"choices": [{"message": {"content": ""},
                                                     "finish_reason": "content_filter"}]}),
     ErrorCategory.CONTENT_POLICY),
    ("responses", httpx2.Response(200, json={"id": "r"}), ErrorCategory.PARSE),
    ("responses", httpx2.Response(200, json={"output": [], "status": "incomplete",
                                             "incomplete_details": {"reason": "content_filter"}}),
     ErrorCategory.CONTENT_POLICY),
    ("responses", httpx2.Response(200, json={"output": [], "status": "failed",
                                             "error": {"code": "server_error", "message": "x"}}),
     ErrorCategory.SERVER),
]


async def test_malformed_or_refused_responses() -> None:
    for api, response, category in BAD_RESPONSES:
        strategy, client = compat(Recorder(response), api=api)
        async with client:
            error = await failure(strategy)
        assert error.category is category, (api, response.content)


# -- errors ------------------------------------------------------------------------------------

ERR = {"error": {"message": "nope", "type": "invalid_request_error", "code": None}}
STATUS_CASES = [
    # (status, headers, body, category, retry_after)
    (429, {"retry-after": "7"}, ERR, ErrorCategory.RATE_LIMIT, 7.0),
    (429, {"retry-after": "7", "retry-after-ms": "1500"}, ERR, ErrorCategory.RATE_LIMIT, 1.5),
    (429, {}, {"error": {"message": "quota", "type": "insufficient_quota", "code": "insufficient_quota"}},
     ErrorCategory.INSUFFICIENT_BALANCE, None),
    (408, {}, ERR, ErrorCategory.TIMEOUT, None),
    (500, {}, ERR, ErrorCategory.SERVER, None),
    (502, {}, "<html>bad gateway</html>", ErrorCategory.SERVER, None),
    (503, {"retry-after": "2.5"}, ERR, ErrorCategory.SERVER, 2.5),
    (401, {}, ERR, ErrorCategory.AUTHENTICATION, None),
    (403, {}, ERR, ErrorCategory.AUTHENTICATION, None),
    (402, {}, ERR, ErrorCategory.INSUFFICIENT_BALANCE, None),
    (400, {}, ERR, ErrorCategory.INVALID_REQUEST, None),
    (422, {}, ERR, ErrorCategory.INVALID_REQUEST, None),
    (404, {}, ERR, ErrorCategory.INVALID_REQUEST, None),
    (400, {}, {"error": {"message": "too long", "code": "context_length_exceeded"}},
     ErrorCategory.CONTEXT_LENGTH, None),
    (400, {}, {"error": {"message": "This model's maximum context length is 8192 tokens"}},
     ErrorCategory.CONTEXT_LENGTH, None),
    (400, {}, {"error": {"message": "flagged", "code": "content_policy_violation"}},
     ErrorCategory.CONTENT_POLICY, None),
    (400, {}, {"error": {"message": "filtered by our content management policy"}},
     ErrorCategory.CONTENT_POLICY, None),
    (302, {}, "", ErrorCategory.UNKNOWN, None),
    # OpenAI's codes that only the wire table knows (see DEFAULT_CLASSIFIER_GAPS)
    (400, {}, {"error": {"message": "string too long", "code": "string_above_max_length"}},
     ErrorCategory.CONTEXT_LENGTH, None),
    (400, {}, {"error": {"message": "Please reduce your prompt: too many input tokens"}},
     ErrorCategory.CONTEXT_LENGTH, None),
    (400, {}, {"error": {"message": "Billing hard limit has been reached", "type": "invalid_request_error",
                         "code": "billing_hard_limit_reached"}}, ErrorCategory.INSUFFICIENT_BALANCE, None),
    (400, {}, {"error": {"message": "Your request was rejected as a result of our safety system.",
                         "code": "moderation_blocked"}}, ErrorCategory.CONTENT_POLICY, None),
    (400, {}, {"error": {"message": "Invalid prompt: your prompt was flagged as potentially violating "
                                    "our usage policy.", "code": "invalid_prompt"}},
     ErrorCategory.CONTENT_POLICY, None),
]


def status_response(status: int, headers: dict[str, str], body: Any) -> httpx2.Response:
    content = json.dumps(body).encode() if not isinstance(body, str) else body.encode()
    return httpx2.Response(status, headers=headers, content=content)


async def test_status_error_mapping_compatible() -> None:
    for status, headers, body, category, retry_after in STATUS_CASES:
        strategy, client = compat(Recorder(status_response(status, headers, body)))
        async with client:
            error = await failure(strategy)
        case = (status, headers, body)
        assert (error.category, error.retry_after, error.status_code) == (category, retry_after, status), case
        assert (error.stops_batch is not None) == (category is ErrorCategory.INSUFFICIENT_BALANCE), case
        assert str(error).startswith(f"HTTP {status}"), case


async def test_status_error_mapping_sdk_unwrapped() -> None:
    """The SDK's own exception reaches the engine, which files it exactly as the direct client's error."""
    for status, headers, body, category, retry_after in STATUS_CASES:
        if status < 400:
            continue  # the SDK treats a 3xx as a response, not an error
        rec = Recorder(status_response(status, headers, body))
        strategy, http = sdk(rec)
        async with http:
            error, verdict = await sdk_failure(strategy)
        case = (status, headers, body)
        assert isinstance(error, openai.APIStatusError), case
        assert error.status_code == status, case
        assert replace(verdict, unusable_because=None, stops_batch=None) == \
            Classification(category, retry_after, status), case
        assert verdict.endpoint_unusable == (status in (401, 403)), case  # what the circuit breaker counts
        # Credits or quota spent: the SDK's own exception is marked so that the batch stops.
        assert (verdict.stops_batch is not None) == (category is ErrorCategory.INSUFFICIENT_BALANCE), case
        assert str(error).startswith(f"Error code: {status}"), case


# The default classifier (``_classify.py``, no strategy classifier: e.g. a user
# calling the SDK through CallableStrategy) must file real SDK exceptions exactly
# as the wire table does; this once listed the codes where they differed.
DEFAULT_CLASSIFIER_GAPS: dict[str, ErrorCategory] = {}


def _gap_of(body: Any) -> str | None:
    text = json.dumps(body)
    return next((marker for marker in DEFAULT_CLASSIFIER_GAPS if marker in text), None)


async def test_default_classifier_on_real_sdk_exceptions() -> None:
    """``classify()`` alone (duck typing: class names, status, retry-after headers) on real SDK exceptions."""
    for status, headers, body, category, retry_after in STATUS_CASES:
        if status < 400:
            continue
        strategy, http = sdk(Recorder(status_response(status, headers, body)))
        async with http:
            error, _ = await sdk_failure(strategy)
        gap = _gap_of(body)
        expected = DEFAULT_CLASSIFIER_GAPS[gap] if gap is not None else category
        verdict = classify(error)
        assert replace(verdict, unusable_because=None, stops_batch=None) == \
            Classification(expected, retry_after, status), (status, headers, body)
        assert verdict.endpoint_unusable == (status in (401, 403)), (status, headers, body)


async def test_retry_after_http_date_through_a_strategy() -> None:
    when = email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=120), usegmt=True)
    strategy, client = compat(Recorder(httpx2.Response(429, headers={"retry-after": when}, json=ERR)))
    through_sdk, http = sdk(Recorder(httpx2.Response(429, headers={"retry-after": when}, json=ERR)))
    async with client, http:
        error = await failure(strategy)
        sdk_error, verdict = await sdk_failure(through_sdk)
    for seconds in (error.retry_after, verdict.retry_after, classify(sdk_error).retry_after):
        assert seconds is not None
        assert 117.0 <= seconds <= 120.0


RETRY_AFTER_FORMS = [
    ({"Retry-After": "12"}, 12.0),
    ({"retry-after": " 0.25 "}, 0.25),
    ({"retry-after": "Wed, 21 Oct 2015 07:28:30 GMT"}, 30.0),
    ({"retry-after": "Wed, 21 Oct 2015 07:27:00 GMT"}, 0.0),  # in the past: no wait, not negative
    ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
    ({"retry-after-ms": "junk", "retry-after": "9"}, 9.0),
    ({"retry-after": "-3"}, None),
    ({"retry-after": "soon"}, None),
    ({"retry-after": "nan"}, None),
    ({}, None),
]


def test_parse_retry_after_forms() -> None:
    now = datetime(2015, 10, 21, 7, 28, 0, tzinfo=UTC).timestamp()
    for headers, expected in RETRY_AFTER_FORMS:
        assert parse_retry_after(headers, now=now) == expected, headers


TRANSPORT_FAILURES = [
    (httpx2.ConnectError("connection refused"), ErrorCategory.TRANSIENT),
    (httpx2.ReadError("[Errno 104] Connection reset by peer"), ErrorCategory.TRANSIENT),
    (httpx2.RemoteProtocolError("Server disconnected without sending a response."), ErrorCategory.TRANSIENT),
    (httpx2.WriteError("broken pipe"), ErrorCategory.TRANSIENT),
    (httpx2.ReadTimeout("timed out"), ErrorCategory.TIMEOUT),
    (httpx2.ConnectTimeout("timed out"), ErrorCategory.TIMEOUT),
    (httpx2.PoolTimeout("timed out"), ErrorCategory.TIMEOUT),
    (httpx2.UnsupportedProtocol("ftp"), ErrorCategory.INVALID_REQUEST),
    (httpx2.DecodingError("bad gzip"), ErrorCategory.PARSE),
]


async def test_transport_error_mapping_compatible() -> None:
    for raised, category in TRANSPORT_FAILURES:
        strategy, client = compat(Recorder(raised))
        async with client:
            error = await failure(strategy)
        assert (error.category, error.status_code, error.retry_after) == (category, None, None), raised
        assert error.__cause__ is raised  # the original is reachable through `from`


async def test_transport_error_mapping_sdk() -> None:
    for raised, _ in TRANSPORT_FAILURES:
        strategy, http = sdk(Recorder(raised))
        async with http:
            error, verdict = await sdk_failure(strategy)
        # the SDK folds every transport failure into APIConnectionError (APITimeoutError for timeouts)
        timed_out = isinstance(raised, httpx2.TimeoutException)
        assert type(error) is (openai.APITimeoutError if timed_out else openai.APIConnectionError), raised
        expected = ErrorCategory.TIMEOUT if timed_out else ErrorCategory.TRANSIENT
        assert replace(verdict, unusable_because=None) == Classification(expected, None, None), raised
        # "connection refused" says the endpoint is unusable (the circuit breaker counts it): nothing else
        assert verdict.endpoint_unusable == ("refused" in str(raised)), raised
        assert classify(error) == verdict, raised
        assert error.__cause__ is raised, raised


async def test_sdk_malformed_json_is_parse() -> None:
    json_type = {"content-type": "application/json"}
    rec = Recorder(httpx2.Response(200, content=b'{"id": "x", "choi', headers=json_type))
    strategy, http = sdk(rec, api="chat")
    async with http:
        error, verdict = await sdk_failure(strategy)
    assert isinstance(error, json.JSONDecodeError)
    assert verdict.category is ErrorCategory.PARSE


async def test_sdk_classifier_files_only_status_errors() -> None:
    strategy, http = sdk(Recorder(httpx2.Response(200, json=CHAT_OK)))
    request = httpx2.Request("POST", BASE)
    async with http:
        for other in (KeyError("x"), ValueError("not json"), openai.APIConnectionError(request=request),
                      ProviderError("mine", category=ErrorCategory.PARSE)):
            assert strategy.classify_error(other) is None, other


# -- secrets -----------------------------------------------------------------------------------


async def test_key_never_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    echo = {"error": {"message": f"Incorrect API key provided: {KEY}", "code": "invalid_api_key"}}
    rec = Recorder(httpx2.Response(401, json=echo), httpx2.ConnectError(f"refused for {KEY}"))
    compatible, client = compat(rec)
    through_sdk, http = sdk(Recorder(httpx2.Response(401, json=echo)))
    async with client, http:
        sdk_error, verdict = await sdk_failure(through_sdk)
        errors: list[Exception] = [await failure(compatible), await failure(compatible), sdk_error]
    categories = [verdict_of(errors[0], compatible).category, verdict_of(errors[1], compatible).category,
                  verdict.category]
    assert categories == [ErrorCategory.AUTHENTICATION, ErrorCategory.TRANSIENT, ErrorCategory.AUTHENTICATION]
    assert isinstance(sdk_error, openai.AuthenticationError)  # scrubbed in place, not wrapped
    assert sdk_error.message == "Error code: 401 - Incorrect API key provided: <redacted>"
    for error in errors:
        assert KEY not in str(error)
        assert KEY not in repr(error)
        assert "<redacted>" in str(error)
    assert KEY not in "".join(traceback.format_exception(errors[0]))
    for strategy in (compatible, through_sdk):
        assert KEY not in repr(strategy)
        assert KEY not in str(strategy)
        assert KEY not in repr(vars(strategy))
        assert KEY not in repr(strategy.lease_identity())
        assert KEY not in repr(strategy.quota_scope())
    secret = Secret(KEY)
    assert KEY not in f"{secret} {secret!r}"
    with pytest.raises(TypeError):
        pickle.dumps(secret)


def test_error_from_status_redacts_and_truncates() -> None:
    error = error_from_status(400, {}, {"error": {"message": KEY + "x" * 2000}}, secret=Secret(KEY))
    assert KEY not in str(error)
    assert len(str(error)) < 600
    # placeholder keys of local servers ("EMPTY", "none") hide nothing: ordinary words stay intact
    body = {"error": {"message": "none of the models"}}
    placeholder = error_from_status(400, {}, body, secret=Secret("none"))
    assert str(placeholder) == "HTTP 400: none of the models"


# -- identities, sharing, construction -----------------------------------------------------------


def test_identities_and_quota_scopes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    a = OpenAICompatibleStrategy("m1", base_url=BASE + "/", api_key="k1")
    assert a.base_url == BASE
    assert a.lease_identity() == OpenAICompatibleStrategy("m1", base_url=BASE, api_key="k1").lease_identity()
    assert a.lease_identity() != OpenAICompatibleStrategy("m1", base_url=BASE, api_key="k2").lease_identity()
    assert a.lease_identity() != OpenAICompatibleStrategy("m2", base_url=BASE, api_key="k1").lease_identity()
    assert a.lease_identity() != OpenAICompatibleStrategy("m1", base_url=BASE, api_key="k1",
                                                          api="responses").lease_identity()
    # quotas are provider-wide: every model behind one endpoint and key shares them, across classes
    other_model = OpenAICompatibleStrategy("m2", base_url=BASE, api_key="k1", api="responses")
    assert a.quota_scope() == other_model.quota_scope()
    assert a.quota_scope() == OpenAIStrategy("m3", base_url=BASE, api_key="k1").quota_scope()
    assert a.quota_scope() != OpenAICompatibleStrategy("m1", base_url=BASE, api_key="k2").quota_scope()
    other_url = OpenAICompatibleStrategy("m1", base_url="http://other/v1", api_key="k1")
    assert a.quota_scope() != other_url.quota_scope()
    user = openai.AsyncOpenAI(api_key="k1", base_url=BASE)
    wrapped = OpenAIStrategy("m1", client=user, api="chat")
    assert wrapped.lease_identity() == OpenAIStrategy("m1", client=user, api="chat").lease_identity()
    assert wrapped.quota_scope() == a.quota_scope()  # same endpoint, same key
    assert a.model_name == "m1"
    assert repr(a) == f"OpenAICompatibleStrategy(model='m1', base_url='{BASE}', api='chat')"


async def test_equal_strategies_share_one_client_per_loop() -> None:
    a = OpenAICompatibleStrategy("m", base_url=BASE, api_key="k")
    b = OpenAICompatibleStrategy("m", base_url=BASE, api_key="k")
    other = OpenAICompatibleStrategy("m", base_url=BASE, api_key="k2")
    with pytest.raises(RuntimeError, match="prepare"):
        await a.execute("x", 1, None)
    await a.prepare()
    await b.prepare()
    await other.prepare()
    shared = a._client_for_call()
    assert b._client_for_call() is shared
    assert other._client_for_call() is not shared
    await b.cleanup()  # the last lease's cleanup closes the shared client ...
    assert shared.is_closed
    with pytest.raises(RuntimeError, match="prepare"):
        a._client_for_call()
    await a.cleanup()  # ... and a repeated cleanup is a no-op
    await other.cleanup()
    await other.cleanup()
    assert other.concurrency is None


async def test_user_clients_are_never_closed() -> None:
    rec = Recorder(httpx2.Response(200, json=CHAT_OK))
    strategy, client = compat(rec)
    through_sdk, http = sdk(rec, api="chat")
    async with client, http:
        for s in (strategy, through_sdk):
            await s.prepare()
            await s.execute("x", 1, None)
            await s.cleanup()
            await s.cleanup()
        assert not client.is_closed
        assert not http.is_closed


async def test_sdk_client_built_by_us(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    sized = OpenAIStrategy("m", concurrency=3)
    default = OpenAIStrategy("m", base_url="http://127.0.0.1:9/v1/", api_key_env="OPENAI_API_KEY")
    assert sized.base_url == "https://api.openai.com/v1"
    assert default.base_url == "http://127.0.0.1:9/v1"
    await sized.prepare()
    await default.prepare()
    client = sized._client_for_call()
    assert client.max_retries == 0
    assert client.api_key == "sk-env"
    assert client._client._transport._pool._max_connections == 3
    assert default._client_for_call().max_retries == 0
    await sized.cleanup()
    await default.cleanup()
    assert client._client.is_closed


def _pool_limits(strategy: OpenAICompatibleStrategy | OpenAIStrategy) -> tuple[int, int]:
    """``(max_connections, max_keepalive_connections)`` of the strategy's pool."""
    client = strategy._client_for_call()
    pool = (client if isinstance(strategy, OpenAICompatibleStrategy) else client._client)._transport._pool
    return pool._max_connections, pool._max_keepalive_connections


async def test_concurrency_hint_sizes_the_pool_explicit_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    built: list[OpenAICompatibleStrategy | OpenAIStrategy] = []
    for cls in (OpenAICompatibleStrategy, OpenAIStrategy):
        hinted = cls("hinted", base_url=BASE, api_key="k")
        explicit = cls("explicit", base_url=BASE, api_key="k", concurrency=7)
        for strategy in (hinted, explicit):
            strategy.configure_concurrency(3)
            await strategy.prepare()
            built.append(strategy)
        assert (hinted.pool_size, explicit.pool_size) == (3, 7)
        # the hint sizes what is kept alive but caps nothing (the client is shared); concurrency= caps
        assert (_pool_limits(hinted), _pool_limits(explicit)) == ((sys.maxsize, 3), (7, 7))
    for strategy in built:
        await strategy.cleanup()
    # a user's client keeps its own pool: the hint changes nothing about it
    rec = Recorder(httpx2.Response(200, json=CHAT_OK))
    strategy, client = compat(rec)
    strategy.configure_concurrency(2)
    async with client:
        await strategy.prepare()
        assert strategy._client_for_call() is client
        await strategy.cleanup()
        assert not client.is_closed


def test_construction_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ConfigurationError, match="api_key"):
        OpenAIStrategy("m")
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: OpenAICompatibleStrategy("m", base_url="mock.test"), "base_url"),
        (lambda: OpenAICompatibleStrategy("", base_url=BASE), "model"),
        (lambda: OpenAICompatibleStrategy("m", base_url=BASE, api="completions"), "api"),
        (lambda: OpenAICompatibleStrategy("m", base_url=BASE, concurrency=0), "concurrency"),
        (lambda: OpenAICompatibleStrategy("m", base_url=BASE, client=object()), "client"),
        (lambda: OpenAIStrategy("m", api_key="k", timeout=0), "timeout"),
        (lambda: OpenAIStrategy("m", client=object()), "client"),
        (lambda: OpenAIStrategy("m", client=openai.AsyncOpenAI(api_key="k"), api_key="k2"), "api_key"),
        (lambda: OpenAIStrategy("m", client=openai.AsyncOpenAI(api_key="k"), base_url=BASE), "base_url"),
    ]
    for build, field in cases:
        with pytest.raises(ConfigurationError) as info:
            build()
        assert info.value.field == field


def test_llm_factory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    strategy = llm("openai:gpt-4o-mini", api="chat", temperature=0.1)
    assert isinstance(strategy, OpenAIStrategy)
    assert (strategy.model, strategy.api, strategy.temperature) == ("gpt-4o-mini", "chat", 0.1)
    local = llm("openai-compatible:llama-3", base_url="http://localhost:8000/v1")
    assert isinstance(local, OpenAICompatibleStrategy)
    assert local.model_name == "llama-3"
    for spec in ("mistral:large", "gpt-4o", "openai:", 42):
        with pytest.raises(ConfigurationError) as info:
            llm(spec)  # type: ignore[arg-type]
        assert repr(spec) in str(info.value)
    with pytest.raises(ConfigurationError, match="base_url"):
        llm("openai-compatible:x")


def test_import_pulls_in_no_http_stack() -> None:
    code = (
        "import sys, trio_batch_llm\n"
        "import trio_batch_llm._strategies.openai._sdk, trio_batch_llm._strategies.openai._compatible\n"
        "import trio_batch_llm._strategies._factory, trio_batch_llm.mock._server\n"
        "heavy = ('openai', 'httpx2', 'httpcore2', 'hypercorn', 'httpx')\n"
        "bad = sorted(m for m in heavy if m in sys.modules)\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""


async def test_cancelled_mock_request_leaves_strategy_usable() -> None:
    gate = anyio.Event()

    async def slow(request: httpx2.Request) -> httpx2.Response:
        await gate.wait()
        return httpx2.Response(200, json=CHAT_OK)

    client = httpx2.AsyncClient(transport=httpx2.MockTransport(slow))
    strategy = OpenAICompatibleStrategy("m", base_url=BASE, api_key=KEY, client=client)
    async with client:
        with anyio.move_on_after(0.05) as scope:
            await strategy.execute("x", 1, None)
        assert scope.cancelled_caught
        gate.set()
        assert (await strategy.execute("x", 1, None))[0] == "hi there"
