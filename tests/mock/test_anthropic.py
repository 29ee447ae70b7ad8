"""The mock's Anthropic dialect: ``POST /v1/messages`` as Anthropic documents it, with every fault knob.

In-process tests drive the app through httpx2.ASGITransport with a manual clock
(prompt-cache TTLs, rate-limit windows: exact on both backends); served tests go
over 127.0.0.1, some through the official ``anthropic`` SDK, whose types check
the mock's bodies independently of our own client.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2
import pytest

from trio_batch_llm.mock import MockOpenAIApp, MockServerConfig, serve_mock
from trio_batch_llm.mock._state import mock_token_count

from .._paths import TESTS
from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio

WIRE = TESTS / "data" / "wire"
VERSION = {"anthropic-version": "2023-06-01"}


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def message(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"model": "claude-test", "max_tokens": 256, "messages": [{"role": "user", "content": prompt}],
            **extra}


def client_of(app: MockOpenAIApp, headers: dict[str, str] | None = None) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://mock",
                              headers=VERSION if headers is None else headers)


def wire(name: str) -> Any:
    return json.loads((WIRE / name).read_text(encoding="utf-8"))


async def test_a_message_is_answered_in_anthropics_shape() -> None:
    app = MockOpenAIApp(clock=ManualClock())
    async with client_of(app) as client:
        reply = await client.post("/v1/messages", json=message("hello there"))
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["id"].startswith("msg_") and body["type"] == "message" and body["role"] == "assistant"
    assert body["model"] == "claude-test"
    assert body["content"] == [{"type": "text", "text": "echo: hello there"}]
    assert (body["stop_reason"], body["stop_sequence"]) == ("end_turn", None)
    assert body["usage"] == {
        "input_tokens": mock_token_count("hello there"),
        "output_tokens": mock_token_count("echo: hello there"),
        "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
        "service_tier": "standard",
    }
    assert reply.headers["request-id"].startswith("req_")
    assert app.statistics().prompt_tokens == mock_token_count("hello there")


async def test_the_documented_request_example_is_answered() -> None:
    request = wire("anthropic_messages_request.json")
    documented = wire("anthropic_messages_response.json")
    async with client_of(MockOpenAIApp(clock=ManualClock())) as client:
        reply = await client.post("/v1/messages", json=request)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert set(body) == set(documented)
    assert set(body["usage"]) >= set(documented["usage"])
    assert [block["type"] for block in body["content"]] == ["text"]
    # the system prompt (list of blocks) and every text block of the messages are the prompt
    text = body["content"][0]["text"]
    assert "terse assistant" in text and "Describe this image" in text


@pytest.mark.parametrize(("headers", "payload", "named"), [
    ({}, message("hi"), "anthropic-version"),
    (VERSION, {"model": "claude-test", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
    (VERSION, {"max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]}, "model"),
    (VERSION, {"model": "c", "max_tokens": 9}, "messages"),
    (VERSION, message("hi", max_tokens=0), "max_tokens"),
    (VERSION, message("hi", system=7), "system"),
    (VERSION, message("hi", temperature=1.5), "temperature"),
    ({"anthropic-version": "2026-10-21"}, message("hi", temperature=0.5), "temperature"),
    ({"anthropic-version": "2026-10-21"}, message("hi", top_k=5), "top_k"),
    (VERSION, {"model": "c", "max_tokens": 9, "messages": [{"role": "robot", "content": "hi"}]},
     "messages.0.role"),
    (VERSION, {"model": "c", "max_tokens": 9, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "AAAA"}}]}]},
     "messages.0.content.0.source.media_type"),
    (VERSION, message("hi", tool_choice={"type": "tool", "name": "nope"}), "tool_choice"),
    (VERSION, message("hi", stop_sequences="END"), "stop_sequences"),
])
async def test_an_invalid_request_is_refused_naming_the_field(
    headers: dict[str, str], payload: dict[str, Any], named: str
) -> None:
    app = MockOpenAIApp(clock=ManualClock())
    async with client_of(app, headers) as client:
        reply = await client.post("/v1/messages", json=payload)
    assert reply.status_code == 400
    body = reply.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert named in body["error"]["message"]
    assert body["request_id"] == reply.headers["request-id"]
    assert app.statistics().client_errors == 1


async def test_content_blocks_images_and_a_system_list_are_accepted() -> None:
    system = [{"type": "text", "text": "be brief"}]
    payload = message("unused", system=system, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
        {"type": "image", "source": {"type": "url", "url": "https://example.invalid/cat.png"}},
        {"type": "text", "text": "what is it"},
    ]}])
    app = MockOpenAIApp(clock=ManualClock())
    async with client_of(app) as client:
        reply = await client.post("/v1/messages", json=payload)
    assert reply.status_code == 200, reply.text
    assert reply.json()["content"][0]["text"] == "echo: be brief\nwhat is it"
    assert app.requests[0].prompt == "be brief\nwhat is it"


async def test_the_key_travels_in_x_api_key() -> None:
    app = MockOpenAIApp(MockServerConfig(api_key="sk-ant-secret"), clock=ManualClock())
    async with client_of(app) as client:
        wrong = await client.post("/v1/messages", json=message("a"), headers={"x-api-key": "nope"})
        # the API reference's x-api-key, and the Authorization: Bearer the official SDK 2.x sends
        bearer = await client.post("/v1/messages", json=message("a"),
                                   headers={"authorization": "Bearer sk-ant-secret"})
        right = await client.post("/v1/messages", json=message("a"), headers={"x-api-key": "sk-ant-secret"})
        none = await client.post("/v1/messages", json=message("a"))
    assert [r.status_code for r in (wrong, bearer, right, none)] == [401, 200, 200, 401]
    assert wrong.json()["error"]["type"] == "authentication_error"
    assert all("sk-ant-secret" not in json.dumps(r.headers) for r in app.requests)


@pytest.mark.parametrize(("marker", "status", "kind"), [
    ("[[fail:400]]", 400, "invalid_request_error"), ("[[fail:401]]", 401, "authentication_error"),
    ("[[fail:402]]", 402, "billing_error"), ("[[fail:403]]", 403, "permission_error"),
    ("[[fail:404]]", 404, "not_found_error"), ("[[fail:413]]", 413, "request_too_large"),
    ("[[fail:429]]", 429, "rate_limit_error"), ("[[fail:500]]", 500, "api_error"),
    ("[[fail:504]]", 504, "timeout_error"), ("[[fail:529]]", 529, "overloaded_error"),
    ("[[context_length]]", 400, "invalid_request_error"),
])
async def test_errors_come_in_anthropics_shape(marker: str, status: int, kind: str) -> None:
    async with client_of(MockOpenAIApp(MockServerConfig(retry_after=2.5), clock=ManualClock())) as client:
        reply = await client.post("/v1/messages", json=message(f"q {marker}"))
    assert reply.status_code == status
    body = reply.json()
    assert set(body) == {"type", "error", "request_id"} and body["type"] == "error"
    assert body["error"]["type"] == kind and body["error"]["message"]
    # Anthropic sends retry-after (whole seconds) with its 429s
    assert reply.headers.get("retry-after") == ("3" if status == 429 else None)
    if marker == "[[context_length]]":
        assert body["error"]["message"].startswith("prompt is too long:")


async def test_the_spend_limit_refusal_stops_and_says_why() -> None:
    config = MockServerConfig(spend_limit_after=1)
    async with client_of(MockOpenAIApp(config, clock=ManualClock())) as client:
        marked = await client.post("/v1/messages", json=message("q [[spend_limit]]"))
        first = await client.post("/v1/messages", json=message("one"))
        second = await client.post("/v1/messages", json=message("two"))
    assert [r.status_code for r in (marked, first, second)] == [429, 200, 429]
    for refused in (marked, second):
        error = refused.json()["error"]
        assert error["type"] == "rate_limit_error"
        assert error["details"] == {"error_code": "enforced_spend_limit_reached"}
        assert "retry-after" not in refused.headers  # no wait ends it


async def test_a_forced_tool_is_answered_with_a_tool_use_that_follows_its_schema() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
              "required": ["city", "days"]}
    tools = [{"name": "other", "input_schema": {"type": "object"}},
             {"name": "forecast", "description": "weather", "input_schema": schema}]
    async with client_of(MockOpenAIApp(clock=ManualClock())) as client:
        named = await client.post("/v1/messages", json=message(
            "w", tools=tools, tool_choice={"type": "tool", "name": "forecast"}))
        any_tool = await client.post("/v1/messages", json=message(
            "w", tools=tools, tool_choice={"type": "any"}))
        broken = await client.post("/v1/messages", json=message(
            "w [[schema_violation]]", tools=tools, tool_choice={"type": "tool", "name": "forecast"}))
        auto = await client.post("/v1/messages", json=message("w", tools=tools))
    body = named.json()
    assert body["stop_reason"] == "tool_use"
    [block] = body["content"]
    assert block["type"] == "tool_use" and block["name"] == "forecast" and block["id"].startswith("toolu_")
    assert set(block["input"]) == {"city", "days"} or set(block["input"]) >= {"city", "days"}
    assert isinstance(block["input"]["days"], int)
    arguments = json.dumps(block["input"], separators=(",", ":"))
    assert body["usage"]["output_tokens"] == mock_token_count(arguments)
    assert any_tool.json()["content"][0]["name"] == "other"
    broken_input = broken.json()["content"][0]["input"]
    assert not ({"city", "days"} <= set(broken_input))
    assert auto.json()["content"][0]["type"] == "text"


async def test_native_json_output_follows_the_schema() -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "schema": schema}
    async with client_of(MockOpenAIApp(clock=ManualClock())) as client:
        native = await client.post("/v1/messages", json=message("j", output_config={"format": fmt}))
        beta = await client.post("/v1/messages", json=message("j", output_format=fmt))
        config = {"format": fmt}
        fenced = await client.post("/v1/messages", json=message("j [[fenced]]", output_config=config))
        refusal = await client.post("/v1/messages", json=message("j [[refusal]]", output_config=config))
        bad = await client.post("/v1/messages", json=message(
            "j", output_config={"format": {"type": "json_schema", "schema": {"type": "thing"}}}))
    for reply in (native, beta):
        assert isinstance(json.loads(reply.json()["content"][0]["text"])["ok"], bool)
    assert fenced.json()["content"][0]["text"].startswith("```json")
    assert refusal.json()["stop_reason"] == "refusal"
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"


async def test_stop_sequences_and_max_tokens_end_the_answer() -> None:
    async with client_of(MockOpenAIApp(clock=ManualClock())) as client:
        stopped = await client.post("/v1/messages", json=message("alpha STOP beta", stop_sequences=["STOP"]))
        capped = await client.post("/v1/messages", json=message("x" * 400, max_tokens=5))
    body = stopped.json()
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", "STOP")
    assert body["content"][0]["text"] == "echo: alpha "
    capped_body = capped.json()
    assert capped_body["stop_reason"] == "max_tokens" and capped_body["usage"]["output_tokens"] == 5


async def test_prompt_caching_writes_then_reads_within_the_ttl() -> None:
    clock = ManualClock()
    shared = "S" * 400  # 100 mock tokens
    system = [{"type": "text", "text": shared, "cache_control": {"type": "ephemeral"}}]
    long_lived = [{"type": "text", "text": shared + "!", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    app = MockOpenAIApp(clock=clock)

    async def usage(prompt: str, blocks: list[dict[str, Any]]) -> dict[str, Any]:
        async with client_of(app) as client:
            reply = await client.post("/v1/messages", json=message(prompt, system=blocks))
        assert reply.status_code == 200, reply.text
        return dict(reply.json()["usage"])

    total = mock_token_count(shared + "\nfirst")
    prefix = mock_token_count(shared)
    first = await usage("first", system)
    assert (first["cache_creation_input_tokens"], first["cache_read_input_tokens"]) == (prefix, 0)
    assert first["input_tokens"] == total - prefix  # input_tokens excludes both, as Anthropic counts
    assert first["cache_creation"] == {"ephemeral_5m_input_tokens": prefix, "ephemeral_1h_input_tokens": 0}
    clock.now = 299.0
    second = await usage("second", system)
    assert (second["cache_creation_input_tokens"], second["cache_read_input_tokens"]) == (0, prefix)
    clock.now = 299.0 + 301.0  # a read refreshed the TTL; past it the prefix is written again
    third = await usage("third", system)
    assert (third["cache_creation_input_tokens"], third["cache_read_input_tokens"]) == (prefix, 0)
    async with client_of(app) as client:  # a top-level cache_control marks the last block
        top = [(await client.post("/v1/messages", json=message(
            "T" * 40, cache_control={"type": "ephemeral"}))).json()["usage"] for _ in range(2)]
    assert (top[0]["cache_creation_input_tokens"], top[1]["cache_read_input_tokens"]) == (10, 10)
    hour = await usage("h1", long_lived)
    clock.now += 3000.0
    later = await usage("h2", long_lived)
    assert hour["cache_creation"]["ephemeral_1h_input_tokens"] == mock_token_count(shared + "!")
    assert later["cache_read_input_tokens"] == mock_token_count(shared + "!")
    assert app.statistics().prompt_tokens == sum(
        u["input_tokens"] + u["cache_creation_input_tokens"] + u["cache_read_input_tokens"]
        for u in (first, second, third, *top, hour, later))


async def test_rate_limit_headers_are_anthropics_with_rfc3339_resets() -> None:
    clock = ManualClock()
    config = MockServerConfig(rpm_limit=2, tpm_limit=1000, ratelimit_headers=True)
    app = MockOpenAIApp(config, clock=clock, wall_clock=lambda: 1_800_000_000.0 + clock.now)
    async with client_of(app) as client:
        replies = [await client.post("/v1/messages", json=message(f"p{i}")) for i in range(3)]
    assert [r.status_code for r in replies] == [200, 200, 429]
    first = replies[0].headers
    assert first["anthropic-ratelimit-requests-limit"] == "2"
    assert first["anthropic-ratelimit-requests-remaining"] == "1"
    assert first["anthropic-ratelimit-requests-reset"] == "2027-01-15T08:01:00Z"
    assert first["anthropic-ratelimit-tokens-limit"] == "1000"
    assert "x-ratelimit-limit-requests" not in first
    refused = replies[2]
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert refused.headers["retry-after"] == "60"
    assert refused.headers["anthropic-ratelimit-requests-remaining"] == "0"


async def test_served_on_the_same_port_as_openai_and_read_by_the_official_sdk() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    async with serve_mock(MockServerConfig(api_key="sk-ant-k")) as server:
        sdk = anthropic.AsyncAnthropic(base_url=server.base_urls["anthropic"], api_key="sk-ant-k",
                                       max_retries=0)
        text = await sdk.messages.create(model="claude-x", max_tokens=64,
                                         messages=[{"role": "user", "content": "ping"}])
        tool = await sdk.messages.create(
            model="claude-x", max_tokens=64, messages=[{"role": "user", "content": "count"}],
            tools=[{"name": "count", "input_schema": schema}], tool_choice={"type": "tool", "name": "count"})
        with pytest.raises(anthropic.RateLimitError) as limited:
            await sdk.messages.create(model="claude-x", max_tokens=64,
                                      messages=[{"role": "user", "content": "x [[fail:429]]"}])
        with pytest.raises(anthropic.InternalServerError) as overloaded:
            await sdk.messages.create(model="claude-x", max_tokens=64,
                                      messages=[{"role": "user", "content": "x [[fail:529]]"}])
        with pytest.raises(anthropic.RateLimitError) as spent:
            await sdk.messages.create(model="claude-x", max_tokens=64,
                                      messages=[{"role": "user", "content": "x [[spend_limit]]"}])
        with pytest.raises(anthropic.APIConnectionError):
            await sdk.messages.create(model="claude-x", max_tokens=64,
                                      messages=[{"role": "user", "content": "x [[reset]]"}])
        await sdk.close()
        async with httpx2.AsyncClient(base_url=server.base_urls["openai"],
                                      headers={"authorization": "Bearer sk-ant-k"}) as client:
            openai_reply = await client.post("/chat/completions", json={
                "model": "m", "messages": [{"role": "user", "content": "ping"}]})
    assert text.content[0].type == "text" and text.content[0].text == "echo: ping"
    assert text.usage.cache_read_input_tokens == 0 and text.stop_reason == "end_turn"
    assert tool.stop_reason == "tool_use" and tool.content[0].type == "tool_use"
    assert isinstance(tool.content[0].input["n"], int)
    assert limited.value.status_code == 429 and limited.value.type == "rate_limit_error"
    assert overloaded.value.status_code == 529 and overloaded.value.type == "overloaded_error"
    assert spent.value.error_code == "enforced_spend_limit_reached"
    assert limited.value.request_id is not None and limited.value.request_id.startswith("req_")
    assert openai_reply.json()["choices"][0]["message"]["content"] == "echo: ping"
    assert server.stats.resets == 1


async def test_input_and_output_token_limits_are_enforced_apart_and_told_in_anthropics_headers() -> None:
    clock = ManualClock()
    shared = "S" * 400  # 100 mock tokens, cached after the first request
    system = [{"type": "text", "text": shared, "cache_control": {"type": "ephemeral"}}]
    config = MockServerConfig(input_tpm_limit=150, output_tpm_limit=1000, ratelimit_headers=True)
    app = MockOpenAIApp(config, clock=clock, wall_clock=lambda: 1_800_000_000.0 + clock.now)
    async with client_of(app) as client:
        first = await client.post("/v1/messages", json=message("a", system=system))
        # 101 input tokens again, but 100 of them read from the cache: they do not count
        cached = await client.post("/v1/messages", json=message("b", system=system))
        uncached = await client.post("/v1/messages", json=message("c" * 400))  # 100 new input tokens
        clock.now = 60.0
        later = await client.post("/v1/messages", json=message("c" * 400))
        openai = await client.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "d"}]})
    assert [r.status_code for r in (first, cached, uncached, later)] == [200, 200, 429, 200]
    assert cached.json()["usage"]["cache_read_input_tokens"] == 100
    head = first.headers
    assert head["anthropic-ratelimit-input-tokens-limit"] == "150"
    assert head["anthropic-ratelimit-input-tokens-remaining"] == str(150 - mock_token_count(shared + "\na"))
    assert head["anthropic-ratelimit-input-tokens-reset"] == "2027-01-15T08:01:00Z"
    output = mock_token_count("echo: " + shared + "\na")
    assert head["anthropic-ratelimit-output-tokens-remaining"] == str(1000 - output)
    assert "anthropic-ratelimit-requests-limit" not in head  # only the limits that are set
    assert uncached.json()["error"]["type"] == "rate_limit_error"
    assert uncached.headers["retry-after"] == "60"
    # OpenAI's headers have no input/output split: its answers tell none of these limits
    assert not any(name.startswith("x-ratelimit") for name in openai.headers)
    assert app.statistics().rate_limited_enforced == 1


class TestFaultKnobs:
    """The generic knobs and markers on the Anthropic route: latency on the app's own clock (Trio's
    virtual one, or asyncio's), a marker's Retry-After, truncated bodies, the calendar-minute limit."""

    @pytest.fixture(scope="class", params=[pytest.param("asyncio", id="asyncio"),
                                           pytest.param(trio_virtual_clock(), id="trio")])
    @classmethod
    def anyio_backend(cls, request: pytest.FixtureRequest) -> Any:
        return request.param

    async def test_latency_retry_after_and_malformed_markers(self) -> None:
        app = MockOpenAIApp(MockServerConfig(latency=0.02))
        async with client_of(app) as client:
            slow = await client.post("/v1/messages", json=message("a [[latency:0.25]]"))
            hinted = await client.post("/v1/messages", json=message("b [[fail:429]] [[retry_after:7.2]]"))
            broken = await client.post("/v1/messages", json=message("c [[malformed]]"))
            flaky = [await client.post("/v1/messages", json=message("d [[fail:529x2]]")) for _ in range(3)]
        record = app.requests[0]
        assert slow.status_code == 200 and record.answered is not None
        assert record.answered - record.arrival >= 0.25
        assert (hinted.status_code, hinted.headers["retry-after"]) == (429, "8")
        assert broken.status_code == 200
        with pytest.raises(ValueError):
            json.loads(broken.text)
        assert [r.status_code for r in flaky] == [529, 529, 200]
        stats = app.statistics()
        assert (stats.malformed, stats.rate_limited, stats.server_errors) == (1, 1, 2)

    async def test_the_calendar_minute_limit_refuses_silently(self) -> None:
        wall = [120.0]
        config = MockServerConfig(calendar_rpm_limit=1, ratelimit_headers=True, rpm_limit=100)
        app = MockOpenAIApp(config, wall_clock=lambda: wall[0])
        async with client_of(app) as client:
            served = await client.post("/v1/messages", json=message("a"))
            refused = await client.post("/v1/messages", json=message("b"))
            wall[0] = 180.0
            next_minute = await client.post("/v1/messages", json=message("c"))
        assert [r.status_code for r in (served, refused, next_minute)] == [200, 429, 200]
        assert refused.json()["error"]["type"] == "rate_limit_error"
        assert "retry-after" not in refused.headers
        assert not any(name.startswith("anthropic-ratelimit") for name in refused.headers)
        assert "anthropic-ratelimit-requests-limit" in served.headers
