"""AnthropicStrategy: requests, answers and errors of the Messages dialect, and the SDK under the engine.

The SDK runs for real over httpx2.MockTransport (no sockets; the served mock's Anthropic
route is test_provider_anthropic_mock.py): exact requests, the SDK's own exceptions and
the engine's verdict on them, on both backends.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import anthropic
import httpx2
import pytest
from pydantic import BaseModel

from trio_batch_llm import (
    AnthropicErrorClassifier,
    AnthropicStrategy,
    ConfigurationError,
    ErrorCategory,
    LLMRequest,
    ProcessorConfig,
    ProviderError,
    RateLimitConfig,
    RetryConfig,
    call,
    llm,
    process_prompts,
    process_stream,
)
from trio_batch_llm._engine._classify import classify
from trio_batch_llm._strategies.anthropic._errors import error_from_body
from trio_batch_llm._strategies.anthropic._wire import read_message

KEY = "sk-ant-test-KEY-0042-secret"
BASE = "http://anthropic.test"
FAST = ProcessorConfig(concurrency=2, retry=RetryConfig(max_attempts=3, initial_wait=0.0, max_wait=0.0),
                       rate_limit=RateLimitConfig(cooldown_seconds=0.01, slow_start_seconds=0.0))


def message(text: str = "hello", *, usage: dict[str, int] | None = None, stop: str = "end_turn",
            content: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Message as Anthropic documents it (our own words and values)."""
    return {"id": "msg_01TestAnswer", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
            "content": content if content is not None else [{"type": "text", "text": text}],
            "stop_reason": stop, "stop_sequence": None,
            "usage": usage or {"input_tokens": 12, "output_tokens": 3}}


def error(status: int, kind: str, text: str, *, code: str | None = None,
          headers: dict[str, str] | None = None) -> httpx2.Response:
    inner: dict[str, Any] = {"type": kind, "message": text}
    if code is not None:
        inner["details"] = {"error_code": code}
    return httpx2.Response(status, json={"type": "error", "error": inner, "request_id": "req_err"},
                           headers=headers)


class Recorder:
    """A MockTransport handler: records requests, replays scripted responses (the last one repeats)."""

    def __init__(self, *responses: httpx2.Response) -> None:
        self.responses = list(responses)
        self.requests: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        return self.responses[min(len(self.requests), len(self.responses)) - 1]

    @property
    def bodies(self) -> list[Any]:
        return [json.loads(r.content) for r in self.requests]


def ok(text: str = "hello", **kwargs: Any) -> httpx2.Response:
    headers = {"request-id": "req_ok_1", "anthropic-ratelimit-requests-limit": "50",
               "anthropic-ratelimit-requests-remaining": "49",
               "anthropic-ratelimit-input-tokens-remaining": "39000"}
    return httpx2.Response(200, json=message(text, **kwargs), headers=headers)


def strategy(recorder: Recorder, **kwargs: Any) -> AnthropicStrategy:
    http = httpx2.AsyncClient(transport=httpx2.MockTransport(recorder))
    client = anthropic.AsyncAnthropic(api_key=KEY, base_url=BASE, http_client=http, max_retries=3)
    return AnthropicStrategy("claude-haiku-4-5", client=client, **kwargs)


# --- requests ---------------------------------------------------------------------------------------

def plain(**kwargs: Any) -> AnthropicStrategy:
    return AnthropicStrategy("claude-haiku-4-5", api_key=KEY, base_url=BASE, **kwargs)


def test_a_prompt_becomes_one_user_message_with_the_default_max_tokens() -> None:
    assert plain().request_body("hi") == {
        "model": "claude-haiku-4-5", "max_tokens": 4096, "messages": [{"role": "user", "content": "hi"}]}


def test_max_output_tokens_of_the_item_wins_over_the_strategy() -> None:
    strategy = plain(max_output_tokens=300)
    assert strategy.request_body("hi")["max_tokens"] == 300
    assert strategy.request_body(LLMRequest("hi", params={"max_output_tokens": 20}))["max_tokens"] == 20


def test_system_prompts_are_blocks_the_strategy_s_one_cached_when_asked() -> None:
    strategy = plain(system_prompt="You are terse.", cache_system_prompt=True)
    request = LLMRequest([{"role": "system", "content": "Answer in French."},
                          {"role": "user", "content": "hi"}], params={"system": "Item rule."})
    body = strategy.request_body(request)
    assert body["system"] == [
        {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Item rule."},
        {"type": "text", "text": "Answer in French."},
    ]
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert plain(system_prompt="Be brief.").request_body("x")["system"] == "Be brief."


def test_images_tools_stop_and_marked_parts_are_spelled_as_anthropic_does() -> None:
    request = LLMRequest([{"role": "user", "content": [
        {"type": "text", "text": "Long shared context", "cache_control": {"type": "ephemeral"}},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4AAQ"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
    ]}], params={
        "stop": "END",
        "tools": [{"type": "function", "function": {
            "name": "lookup", "description": "Find a word",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}],
        "tool_choice": {"type": "function", "function": {"name": "lookup"}},
        "extra_body": {"metadata": {"user_id": "u-1"}},
    })
    body = plain().request_body(request)
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "Long shared context", "cache_control": {"type": "ephemeral"}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQ"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
    ]
    assert body["stop_sequences"] == ["END"]
    assert body["tools"] == [{"name": "lookup", "description": "Find a word",
                              "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}]
    assert body["tool_choice"] == {"type": "tool", "name": "lookup"}
    assert body["metadata"] == {"user_id": "u-1"}
    assert "metadata" not in plain().request_body(request, include_extra=False)
    assert plain().request_body(LLMRequest("x", params={"tool_choice": "required"}))["tool_choice"] == \
        {"type": "any"}


def test_tool_calls_and_results_of_a_conversation_become_tool_use_and_tool_result_blocks() -> None:
    request = LLMRequest([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "weather", "arguments": "{\"c\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "4 C"},
    ])
    assert plain().request_body(request)["messages"][1:] == [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "weather",
                                           "input": {"c": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "4 C"}]},
    ]


class Verdict(BaseModel):
    label: str
    score: int


def test_a_response_model_is_sent_as_the_native_json_schema_output() -> None:
    body = plain(response_model=Verdict).request_body("rate it")
    schema = body["output_config"]["format"]
    assert schema["type"] == "json_schema"
    assert schema["schema"]["required"] == ["label", "score"]
    assert "tools" not in body and "tool_choice" not in body


@pytest.mark.parametrize(("params", "named"), [
    ({"temperature": 0.2}, "params['temperature']"),
    ({"top_p": 0.9}, "params['top_p']"),
    ({"seed": 7}, "params['seed']"),
    ({"logprobs": True}, "params['logprobs']"),
    ({"response_format": {"type": "json_object"}}, "params['response_format']"),
])
def test_what_anthropic_cannot_take_is_refused_at_input_naming_the_field(params: dict[str, Any],
                                                                         named: str) -> None:
    problem = plain().request_problem(LLMRequest("x", params=params))
    assert problem is not None and problem.startswith(named), problem


def test_unknown_parts_and_bad_image_urls_are_refused_naming_the_part() -> None:
    audio = LLMRequest([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}])
    assert "messages[0].content[0]" in (plain().request_problem(audio) or "")
    ftp = LLMRequest([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "ftp://x"}}]}])
    assert "image_url" in (plain().request_problem(ftp) or "")


def test_constructor_refuses_sampling_params_and_keys_stay_at_home(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="temperature"):
        plain(params={"temperature": 0.0})
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-the-shell-0001")
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    with pytest.raises(ConfigurationError, match=r"ANTHROPIC_API_KEY is sent only to https://api\.anthropic\.com"):
        AnthropicStrategy("m", base_url="http://127.0.0.1:9")
    assert AnthropicStrategy("m").secret is not None  # Anthropic's own API takes the shell's key
    monkeypatch.setenv("MY_GATEWAY_KEY", "sk-gateway-0002-secret")
    named = AnthropicStrategy("m", base_url="http://127.0.0.1:9", api_key_env="MY_GATEWAY_KEY")
    assert named.secret is not None and named.secret.reveal() == "sk-gateway-0002-secret"
    assert "sk-gateway" not in repr(named) and "sk-gateway" not in repr(named.secret)
    assert isinstance(llm("anthropic:claude-haiku-4-5", api_key=KEY, base_url=BASE), AnthropicStrategy)


# --- answers ----------------------------------------------------------------------------------------

def test_usage_counts_every_input_token_cache_reads_and_writes_apart() -> None:
    text, usage, metadata = read_message(message("hi", usage={
        "input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 100,
        "cache_read_input_tokens": 50}))
    assert text == "hi"
    assert usage == {"input_tokens": 160, "output_tokens": 5, "total_tokens": 165,
                     "cached_input_tokens": 50, "cache_write_input_tokens": 100}
    assert (metadata["id"], metadata["stop_reason"]) == ("msg_01TestAnswer", "end_turn")
    assert metadata["response_details"].finish_reason == "stop"


def test_tool_use_blocks_are_reported_as_tool_calls() -> None:
    _, _, metadata = read_message(message(stop="tool_use", content=[
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}}]))
    assert metadata["tool_calls"] == [{"id": "toolu_1", "name": "lookup", "input": {"q": "x"}}]
    details = metadata["response_details"]
    assert details.finish_reason == "tool_calls" and details.tool_calls[0].arguments == '{"q": "x"}'


@pytest.mark.anyio
async def test_a_refused_structured_answer_is_final(anyio_backend: Any) -> None:
    recorder = Recorder(ok("I can't help with that.", stop="refusal"))
    batch = await process_prompts(strategy(recorder, response_model=Verdict), ["rate"], config=FAST)
    (result,) = batch.results
    assert (result.success, result.error_category, result.attempts) == \
        (False, ErrorCategory.CONTENT_POLICY, 1)
    assert "I can't help" in str(result.error)


@pytest.mark.anyio
async def test_prepare_opens_one_sdk_client_without_retries_sized_by_the_engine(anyio_backend: Any) -> None:
    first, twin = plain(), plain()
    first.configure_concurrency(7)
    await first.prepare()
    await twin.prepare()
    client = first._client_for_call()
    assert twin._client_for_call() is client  # equal identities share one client per event loop
    assert isinstance(client, anthropic.AsyncAnthropic) and client.max_retries == 0
    assert client._client._transport._pool._max_keepalive_connections == 7
    await first.cleanup()
    assert client.is_closed()
    await twin.cleanup()  # idempotent: already closed and dropped
    with pytest.raises(RuntimeError, match="prepare"):
        first._client_for_call()


def test_a_body_that_is_no_message_is_a_parse_failure() -> None:
    with pytest.raises(ProviderError) as info:
        read_message({"type": "error"})
    assert info.value.category is ErrorCategory.PARSE


# --- errors -----------------------------------------------------------------------------------------

def body(kind: str, text: str, code: str | None = None) -> dict[str, Any]:
    inner: dict[str, Any] = {"type": kind, "message": text}
    if code:
        inner["details"] = {"error_code": code}
    return {"type": "error", "error": inner}


@pytest.mark.parametrize(("status", "payload", "category"), [
    (529, body("overloaded_error", "Overloaded"), ErrorCategory.SERVER),
    (500, body("api_error", "Internal"), ErrorCategory.SERVER),
    (401, body("authentication_error", "invalid x-api-key"), ErrorCategory.AUTHENTICATION),
    (403, body("permission_error", "no access"), ErrorCategory.AUTHENTICATION),
    (400, body("invalid_request_error", "prompt is too long: 208310 tokens > 200000 maximum"),
     ErrorCategory.CONTEXT_LENGTH),
    (400, body("invalid_request_error", "messages: field required"), ErrorCategory.INVALID_REQUEST),
    (413, body("request_too_large", "Request exceeds the maximum size"), ErrorCategory.CONTEXT_LENGTH),
    (None, body("overloaded_error", "Overloaded"), ErrorCategory.SERVER),
])
def test_error_table(status: int | None, payload: dict[str, Any], category: ErrorCategory) -> None:
    made = error_from_body(status, payload)
    assert made.category is category
    assert made.stops_batch is None
    if status is None:
        assert made.status_code == 529


def test_a_429_is_a_rate_limit_with_its_wait_and_headers() -> None:
    made = error_from_body(429, body("rate_limit_error", "Number of request tokens has exceeded"),
                           {"retry-after": "7", "anthropic-ratelimit-tokens-remaining": "0", "x-other": "1"})
    assert (made.category, made.retry_after, made.stops_batch) == (ErrorCategory.RATE_LIMIT, 7.0, None)
    assert made.metadata["rate_limit"] == {"retry-after": "7", "anthropic-ratelimit-tokens-remaining": "0"}


@pytest.mark.parametrize(("status", "payload"), [
    (429, body("rate_limit_error", "You have reached your monthly spend limit",
               "enforced_spend_limit_reached")),
    (400, body("invalid_request_error", "Your credit balance is too low to access the Anthropic API.")),
    (402, body("billing_error", "Payment required")),
])
def test_a_spend_limit_is_insufficient_balance_that_stops_the_batch(status: int, payload: Any) -> None:
    made = error_from_body(status, payload)
    assert made.category is ErrorCategory.INSUFFICIENT_BALANCE
    assert made.stops_batch is not None and "spend limit" in made.stops_batch
    verdict = classify(made)
    assert (verdict.category, verdict.stops_batch, verdict.retryable) == \
        (ErrorCategory.INSUFFICIENT_BALANCE, made.stops_batch, False)


def test_a_404_about_the_model_says_the_endpoint_is_unusable() -> None:
    made = error_from_body(404, body("not_found_error", "model: claude-nope"))
    assert made.category is ErrorCategory.INVALID_REQUEST
    assert classify(made).unusable_because is not None


# --- the SDK over MockTransport, on both backends ---------------------------------------------------

@pytest.mark.anyio
async def test_one_call_sends_the_body_and_reads_text_usage_and_headers(anyio_backend: Any) -> None:
    recorder = Recorder(ok("Bonjour", usage={"input_tokens": 4, "output_tokens": 2,
                                             "cache_read_input_tokens": 8}))
    s = strategy(recorder, system_prompt="Be brief.", headers={"x-team": "t1"})
    await s.prepare()
    text, usage, metadata = await s.execute_request(LLMRequest("hi"), 1, None)
    await s.cleanup()
    assert text == "Bonjour"
    assert usage == {"input_tokens": 12, "output_tokens": 2, "total_tokens": 14, "cached_input_tokens": 8,
                     "cache_write_input_tokens": 0}
    assert metadata["request_id"] == "req_ok_1"
    assert metadata["rate_limit"]["anthropic-ratelimit-requests-remaining"] == "49"
    sent = recorder.requests[0]
    assert (sent.method, sent.url.path) == ("POST", "/v1/messages")
    assert sent.headers["x-team"] == "t1" and "anthropic-version" in sent.headers
    assert recorder.bodies == [s.request_body("hi")]


async def sdk_failure(response: httpx2.Response) -> tuple[Exception, Any, Recorder]:
    recorder = Recorder(response)
    s = strategy(recorder)
    with pytest.raises(anthropic.APIStatusError) as info:
        await s.execute_request(LLMRequest("hi"), 1, None)
    return info.value, classify(info.value, strategy_classifier=s.classify_error), recorder


@pytest.mark.anyio
async def test_sdk_errors_are_raised_as_themselves_and_filed_by_the_table(anyio_backend: Any) -> None:
    exc, verdict, recorder = await sdk_failure(error(429, "rate_limit_error", "slow down", headers={
        "retry-after": "3", "anthropic-ratelimit-requests-remaining": "0"}))
    assert isinstance(exc, anthropic.RateLimitError) and len(recorder.requests) == 1  # no SDK retries
    assert (verdict.category, verdict.retry_after) == (ErrorCategory.RATE_LIMIT, 3.0)
    assert exc.metadata["rate_limit"]["anthropic-ratelimit-requests-remaining"] == "0"  # type: ignore[attr-defined]
    exc, verdict, _ = await sdk_failure(error(529, "overloaded_error", "Overloaded"))
    assert isinstance(exc, anthropic.OverloadedError)
    assert (verdict.category, verdict.retryable) == (ErrorCategory.SERVER, True)


@pytest.mark.anyio
async def test_a_spend_limit_from_the_sdk_carries_why_the_batch_stops(anyio_backend: Any) -> None:
    exc, verdict, _ = await sdk_failure(error(429, "rate_limit_error", f"spend limit reached for {KEY}",
                                              code="enforced_spend_limit_reached"))
    assert verdict.category is ErrorCategory.INSUFFICIENT_BALANCE and not verdict.retryable
    assert "enforced_spend_limit_reached" in exc.stops_batch  # type: ignore[attr-defined]
    assert KEY not in str(exc)
    info = AnthropicErrorClassifier().classify(exc)
    assert (info.error_category, info.is_retryable, info.is_rate_limit) == \
        ("insufficient_balance", False, False)
    assert info.hint is not None and "spend limit" in info.hint


@pytest.mark.anyio
async def test_the_classifier_object_files_overloads_and_rate_limits(anyio_backend: Any) -> None:
    exc, _, _ = await sdk_failure(error(529, "overloaded_error", "Overloaded"))
    info = AnthropicErrorClassifier().classify(exc)
    assert (info.error_category, info.is_retryable, info.is_rate_limit) == ("server", True, False)
    exc, _, _ = await sdk_failure(error(429, "rate_limit_error", "slow", headers={"retry-after": "2"}))
    info = AnthropicErrorClassifier().classify(exc)
    assert (info.is_rate_limit, info.suggested_wait) == (True, 2.0)
    assert AnthropicErrorClassifier().classify(ValueError("x")).error_category == "logic_error"


@pytest.mark.anyio
async def test_the_engine_retries_a_429_and_a_529_then_succeeds(anyio_backend: Any) -> None:
    recorder = Recorder(error(429, "rate_limit_error", "slow down"), error(529, "overloaded_error", "busy"),
                        ok("fine"))
    batch = await process_prompts(strategy(recorder), ["one"], config=FAST)
    (result,) = batch.results
    assert (result.success, result.output, result.attempts) == (True, "fine", 3)
    assert len(recorder.requests) == 3


@pytest.mark.anyio
async def test_structured_output_is_validated_and_a_bad_answer_retried(anyio_backend: Any) -> None:
    recorder = Recorder(ok('{"label": "good"}'), ok('{"label": "good", "score": 9}'))
    batch = await process_prompts(strategy(recorder, response_model=Verdict), ["rate"], config=FAST)
    (result,) = batch.results
    assert result.success and result.output == Verdict(label="good", score=9)
    assert result.attempts == 2
    assert recorder.bodies[0]["output_config"]["format"]["schema"]["required"] == ["label", "score"]


@pytest.mark.anyio
async def test_an_item_anthropic_cannot_take_fails_before_any_call(anyio_backend: Any) -> None:
    recorder = Recorder(ok())
    with pytest.raises(ValueError, match=r"prompts\[0\].*params\['temperature'\]: the Messages API"):
        await process_prompts(strategy(recorder), [{"prompt": "x", "params": {"temperature": 0.3}}],
                              config=FAST)
    assert recorder.requests == []


@pytest.mark.anyio
async def test_call_and_process_stream_run_over_a_user_client(anyio_backend: Any) -> None:
    recorder = Recorder(ok("one answer"))
    s = strategy(recorder)
    assert await call(s, "hi", config=FAST) == "one answer"
    seen = []
    async with process_stream(s, ["a", "b", "c"], concurrency=2) as results:
        async for result in results:
            seen.append((result.success, result.output))
    assert seen == [(True, "one answer")] * 3
    assert sorted(b["messages"][0]["content"] for b in recorder.bodies[1:]) == ["a", "b", "c"]


@pytest.mark.anyio
async def test_prompt_caching_usage_a_write_then_reads(anyio_backend: Any) -> None:
    written = {"input_tokens": 20, "output_tokens": 4, "cache_creation_input_tokens": 3000,
               "cache_read_input_tokens": 0}
    read = {"input_tokens": 20, "output_tokens": 4, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 3000}
    recorder = Recorder(ok("first", usage=written), ok("later", usage=read))
    s = strategy(recorder, system_prompt="A long shared prefix.", cache_system_prompt=True)
    batch = await process_prompts(s, ["q1", "q2", "q3"], config=ProcessorConfig(concurrency=1))
    usages = [r.token_usage for r in sorted(batch.results, key=lambda r: r.output != "first")]
    assert usages[0]["cache_write_input_tokens"] == 3000 and usages[0]["input_tokens"] == 3020
    assert [u["cached_input_tokens"] for u in usages[1:]] == [3000, 3000]
    assert sum(u["input_tokens"] for u in usages) == 3 * 3020
    assert all(b["system"][0]["cache_control"] == {"type": "ephemeral"} for b in recorder.bodies)


def test_importing_the_library_imports_no_provider_sdk() -> None:
    code = ("import sys, trio_batch_llm; "
            "print(sorted(m for m in ('anthropic', 'google.genai', 'openai') if m in sys.modules))")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "[]"


def test_a_base64_image_of_a_type_anthropic_does_not_take_is_refused() -> None:
    bmp = LLMRequest([{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/bmp;base64,Qk0="}}]}])
    assert "image/bmp" in (plain().request_problem(bmp) or "")


def test_quota_scope_is_the_endpoint_and_key_and_identity_adds_the_model() -> None:
    haiku, sonnet = plain(), AnthropicStrategy("claude-sonnet-4-6", api_key=KEY, base_url=BASE)
    other_key = AnthropicStrategy("claude-haiku-4-5", api_key="sk-ant-another-key-0003", base_url=BASE)
    assert haiku.quota_scope() == sonnet.quota_scope() != other_key.quota_scope()
    assert haiku.lease_identity() == plain().lease_identity() != sonnet.lease_identity()
    assert KEY not in repr(haiku.quota_scope()) and KEY not in repr(haiku.lease_identity())


def test_the_shell_key_goes_to_the_anthropic_base_url_set_beside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-paired-key-0004")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://proxy.example.org")
    paired = AnthropicStrategy("m")
    assert paired.base_url == "https://proxy.example.org"
    assert paired.secret is not None and paired.secret.reveal() == "sk-ant-paired-key-0004"
    with pytest.raises(ConfigurationError, match="api_key"):
        AnthropicStrategy("m", base_url="https://other.example.org")


@pytest.mark.anyio
async def test_a_user_client_is_used_as_is_and_never_closed(anyio_backend: Any) -> None:
    recorder = Recorder(ok("fine"))
    s = strategy(recorder)
    assert await call(s, "hi", config=FAST) == "fine"
    user_client = s._identity_client
    assert not user_client.is_closed()
    await user_client.close()
