"""The mock's Gemini dialect served on a real socket, on both backends: generateContent, Google's errors,
the per-minute and per-day quotas, and the context caches (their expiry in-process on a manual clock).

Requests are made with httpx2 from Google's documented REST shapes (camelCase JSON), and once
with Google's own SDK (``google-genai``, its sync client in a worker thread: its async client
runs on asyncio only), so the mock is checked against a client that is not ours.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.to_thread
import httpx2
import pytest

from trio_batch_llm import ConfigurationError
from trio_batch_llm.mock import MockOpenAIApp, MockServer, MockServerConfig, serve_mock
from trio_batch_llm.mock._state import mock_token_count

from .._paths import TESTS

pytestmark = pytest.mark.anyio

MODEL = "gemini-2.5-flash"
KEY = "gm-test-key"
GENERATE = f"/v1beta/models/{MODEL}:generateContent"


def request(text: str, **extra: Any) -> dict[str, Any]:
    return {"contents": [{"role": "user", "parts": [{"text": text}]}], **extra}


def root_of(server: MockServer) -> str:
    root = server.base_urls["gemini"]  # what serve-mock prints beside "gemini"
    assert root == server.base_url.removesuffix("/v1")
    return root


async def post(server: MockServer, path: str, body: Any, *, key: str | None = KEY) -> httpx2.Response:
    headers = {"x-goog-api-key": key} if key is not None else {}
    async with httpx2.AsyncClient(base_url=root_of(server), headers=headers) as client:
        return await client.post(path, json=body)


@pytest.fixture
async def server() -> AsyncIterator[MockServer]:
    async with serve_mock(MockServerConfig(api_key=KEY)) as served:
        yield served


def error_of(reply: httpx2.Response) -> dict[str, Any]:
    body = reply.json()
    assert set(body) == {"error"}
    return dict(body["error"])


# -- generateContent -------------------------------------------------------------------------------


async def test_generate_content_answers_in_googles_shape(server: MockServer) -> None:
    body = request("hello", systemInstruction={"parts": [{"text": "Be brief."}]},
                   generationConfig={"temperature": 0.2, "topP": 0.9, "maxOutputTokens": 100})
    reply = await post(server, GENERATE, body)
    assert reply.status_code == 200
    answer = reply.json()
    content = {"role": "model", "parts": [{"text": "echo: Be brief.\nhello"}]}
    assert answer["candidates"] == [{"content": content, "finishReason": "STOP", "index": 0}]
    prompt, output = mock_token_count("Be brief.\nhello"), mock_token_count("echo: Be brief.\nhello")
    usage = answer["usageMetadata"]
    assert (usage["promptTokenCount"], usage["candidatesTokenCount"], usage["totalTokenCount"]) == (
        prompt, output, prompt + output)
    assert answer["modelVersion"] == MODEL and answer["responseId"]
    assert (server.stats.succeeded, server.stats.prompt_tokens, server.stats.completion_tokens) == (
        1, prompt, output)
    # the key is never recorded, whichever way it came
    assert "x-goog-api-key" not in server.requests[0].headers
    async with httpx2.AsyncClient(base_url=root_of(server)) as client:
        by_query = await client.post(f"/v1/models/{MODEL}:generateContent", params={"key": KEY},
                                     json=request("hello"))
    assert by_query.status_code == 200 and KEY not in server.requests[1].path


async def test_a_wrong_or_missing_key_is_refused_in_googles_shape(server: MockServer) -> None:
    for key in ("wrong", None):
        reply = await post(server, GENERATE, request("hello"), key=key)
        error = error_of(reply)
        assert (reply.status_code, error["status"]) == (401, "UNAUTHENTICATED")
        assert error["details"][0]["reason"] == "API_KEY_INVALID"


@pytest.mark.parametrize(("body", "words"), [
    (request("x", generationConfig={"max_tokens": 5}), 'Unknown name "max_tokens" at \'generation_config\''),
    ({"messages": [{"role": "user", "content": "x"}]}, 'Unknown name "messages"'),
    ({"contents": []}, "contents is not specified"),
    (request("x", generationConfig={"responseSchema": {"type": "OBJECT"}}), "response_mime_type"),
])
async def test_a_malformed_request_gets_googles_400(server: MockServer, body: Any, words: str) -> None:
    reply = await post(server, GENERATE, body)
    error = error_of(reply)
    assert (reply.status_code, error["code"], error["status"]) == (400, 400, "INVALID_ARGUMENT")
    assert words in error["message"]


SCHEMA = {"type": "OBJECT", "properties": {"name": {"type": "STRING"}, "age": {"type": "INTEGER"}},
          "required": ["name", "age"]}


async def test_structured_output_follows_the_schema_and_the_markers_break_it(server: MockServer) -> None:
    config = {"responseMimeType": "application/json", "responseSchema": SCHEMA}

    async def text_of(prompt: str) -> str:
        reply = await post(server, GENERATE, request(prompt, generationConfig=config))
        assert reply.status_code == 200
        return str(reply.json()["candidates"][0]["content"]["parts"][0]["text"])

    answer = json.loads(await text_of("who?"))
    assert isinstance(answer["name"], str) and isinstance(answer["age"], int)
    assert "name" not in json.loads(await text_of("who? [[schema_violation]]"))
    with pytest.raises(ValueError):
        json.loads(await text_of("who? [[invalid_json]]"))
    assert (await text_of("who? [[fenced]]")).startswith("```json\n")
    json_schema = {"responseMimeType": "application/json",
                   "responseJsonSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                                          "required": ["ok"]}}
    reply = await post(server, GENERATE, request("ok?", generationConfig=json_schema))
    assert isinstance(json.loads(reply.json()["candidates"][0]["content"]["parts"][0]["text"])["ok"], bool)
    refused = await post(server, GENERATE, request("who? [[reject_schema]]", generationConfig=config))
    assert (refused.status_code, error_of(refused)["status"]) == (400, "INVALID_ARGUMENT")
    bad = {"responseMimeType": "application/json", "responseSchema": {"type": "WHATEVER"}}
    assert (await post(server, GENERATE, request("x", generationConfig=bad))).status_code == 400


async def test_a_forced_function_and_a_blocked_prompt(server: MockServer) -> None:
    tools = [{"functionDeclarations": [{"name": "lookup", "description": "find a word", "parameters": {
        "type": "OBJECT", "properties": {"word": {"type": "STRING"}}, "required": ["word"]}}]}]
    body = request("define it", tools=tools, toolConfig={"functionCallingConfig": {"mode": "ANY"}})
    part = (await post(server, GENERATE, body)).json()["candidates"][0]["content"]["parts"][0]
    assert part["functionCall"]["name"] == "lookup" and isinstance(part["functionCall"]["args"]["word"], str)
    blocked = (await post(server, GENERATE, request("[[blocked]]"))).json()
    assert blocked["promptFeedback"]["blockReason"] == "SAFETY" and "candidates" not in blocked


async def test_the_generic_faults_work_on_the_gemini_route(server: MockServer) -> None:
    truncated = await post(server, GENERATE, request("x [[malformed]]"))
    assert truncated.status_code == 200 and truncated.text.startswith('{"candidates"')
    with pytest.raises(ValueError):
        truncated.json()
    with pytest.raises(httpx2.RemoteProtocolError):
        await post(server, GENERATE, request("x [[reset]]"))
    assert (server.stats.malformed, server.stats.resets) == (1, 1)


# -- Google's errors and quotas --------------------------------------------------------------------


@pytest.mark.parametrize(("marker", "status", "name"), [
    ("[[fail:400]]", 400, "INVALID_ARGUMENT"), ("[[fail:403]]", 403, "PERMISSION_DENIED"),
    ("[[fail:404]]", 404, "NOT_FOUND"), ("[[fail:500]]", 500, "INTERNAL"),
    ("[[fail:503]]", 503, "UNAVAILABLE"), ("[[fail:504]]", 504, "DEADLINE_EXCEEDED"),
    ("[[context_length]]", 400, "INVALID_ARGUMENT"),
])
async def test_each_error_in_googles_shape(server: MockServer, marker: str, status: int, name: str) -> None:
    reply = await post(server, GENERATE, request(f"x {marker}"))
    error = error_of(reply)
    assert (reply.status_code, error["code"], error["status"]) == (status, status, name)
    if status == 503:
        assert error["message"] == "The model is overloaded. Please try again later."
    assert "retry-after" not in reply.headers


async def test_a_429_says_its_wait_in_the_body_and_never_in_a_header() -> None:
    config = MockServerConfig(ratelimit_headers=True, rpm_limit=100, model=MODEL)
    async with serve_mock(config) as server:
        reply = await post(server, GENERATE, request("x [[fail:429]] [[retry_after:45.8]]"))
        assert reply.status_code == 429
        error = error_of(reply)
        assert error["status"] == "RESOURCE_EXHAUSTED"
        details = {d["@type"].rsplit(".", 1)[1]: d for d in error["details"]}
        assert set(details) == {"QuotaFailure", "Help", "RetryInfo"}
        assert details["RetryInfo"]["retryDelay"] == "45.8s"
        violation = details["QuotaFailure"]["violations"][0]
        assert violation["quotaId"] == "GenerateRequestsPerMinutePerProjectPerModel"
        assert violation["quotaDimensions"] == {"location": "global", "model": MODEL}
        assert not [h for h in reply.headers if h.startswith(("retry-after", "x-ratelimit", "anthropic"))]
        ok = await post(server, GENERATE, request("y"))
        assert not [h for h in ok.headers if h.startswith("x-ratelimit")]  # Gemini sends none


async def test_the_servers_own_rpm_limit_is_refused_as_a_per_minute_quota() -> None:
    async with serve_mock(MockServerConfig(rpm_limit=1)) as server:
        assert (await post(server, GENERATE, request("a"))).status_code == 200
        reply = await post(server, GENERATE, request("b"))
        assert reply.status_code == 429 and server.stats.rate_limited_enforced == 1
        details = {d["@type"].rsplit(".", 1)[1]: d for d in error_of(reply)["details"]}
        assert details["QuotaFailure"]["violations"][0]["quotaValue"] == "1"
        delay = details["RetryInfo"]["retryDelay"]
        assert delay.endswith("s") and 50.0 < float(delay[:-1]) <= 60.0


async def test_past_the_daily_limit_every_request_gets_the_per_day_quota() -> None:
    with pytest.raises(ConfigurationError, match="gemini_daily_request_limit"):
        MockServerConfig(gemini_daily_request_limit=0)
    async with serve_mock(MockServerConfig(gemini_daily_request_limit=2)) as server:
        statuses = [(await post(server, GENERATE, request(f"p{i}"))).status_code for i in range(2)]
        assert statuses == [200, 200]
        for prompt in ("p3", "p4"):
            reply = await post(server, GENERATE, request(prompt))
            error = error_of(reply)
            assert (reply.status_code, error["status"]) == (429, "RESOURCE_EXHAUSTED")
            types = [d["@type"].rsplit(".", 1)[1] for d in error["details"]]
            assert types == ["QuotaFailure", "Help"]  # no RetryInfo: a minute's wait does not help
            violation = error["details"][0]["violations"][0]
            assert (violation["quotaId"], violation["quotaValue"]) == (
                "GenerateRequestsPerDayPerProjectPerModel", "2")
        assert server.stats.rate_limited == 2
    async with serve_mock(MockServerConfig(spend_limit_after=1)) as server:
        for prompt, status in (("x [[spend_limit]]", 429), ("y", 200), ("z", 429)):
            reply = await post(server, GENERATE, request(prompt))
            assert reply.status_code == status
            if status == 429:  # the marker, then past spend_limit_after: no wait ends it either
                error = error_of(reply)
                quota = error["details"][0]["violations"][0]["quotaId"]
                assert quota == "GenerateRequestsPerDayPerProjectPerModel"
                assert all("RetryInfo" not in d["@type"] for d in error["details"])


# -- context caches --------------------------------------------------------------------------------

PREFIX = "The shared handbook, chapter one. " * 40


def cache_body(**extra: Any) -> dict[str, Any]:
    return {"model": f"models/{MODEL}", "contents": [{"role": "user", "parts": [{"text": PREFIX}]}],
            "systemInstruction": {"parts": [{"text": "Answer from the handbook."}]}, **extra}


async def test_a_cache_is_created_used_listed_renewed_and_deleted(server: MockServer) -> None:
    async with httpx2.AsyncClient(base_url=root_of(server), headers={"x-goog-api-key": KEY}) as client:
        made = await client.post("/v1beta/cachedContents",
                                 json=cache_body(ttl="300s", displayName="handbook"))
        assert made.status_code == 200
        cache = made.json()
        tokens = mock_token_count("Answer from the handbook.\n" + PREFIX)
        assert cache["usageMetadata"] == {"totalTokenCount": tokens}
        assert set(cache) == {"name", "model", "displayName", "createTime", "updateTime", "expireTime",
                              "usageMetadata"}
        used = await client.post(GENERATE, json=request("chapter one?", cachedContent=cache["name"]))
        usage = used.json()["usageMetadata"]
        assert usage["cachedContentTokenCount"] == tokens
        assert usage["promptTokenCount"] == tokens + mock_token_count("chapter one?")
        listed = (await client.get("/v1beta/cachedContents", params={"pageSize": 10})).json()
        assert [c["name"] for c in listed["cachedContents"]] == [cache["name"]]
        renewed = await client.patch(f"/v1beta/{cache['name']}", params={"updateMask": "ttl"},
                                     json={"ttl": "600s"})
        assert renewed.status_code == 200 and renewed.json()["expireTime"] > cache["expireTime"]
        assert (await client.get(f"/v1beta/{cache['name']}")).json()["name"] == cache["name"]
        stats = server.app.gemini.cache_statistics()
        assert (stats.alive, stats.created, stats.renewed, stats.used, stats.deleted) == (1, 1, 1, 1, 0)
        assert (await client.delete(f"/v1beta/{cache['name']}")).json() == {}
        gone = await client.post(GENERATE, json=request("again?", cachedContent=cache["name"]))
        assert (gone.status_code, error_of(gone)) == (403, {
            "code": 403, "message": "CachedContent not found (or permission denied)",
            "status": "PERMISSION_DENIED"})
        assert (await client.get(f"/v1beta/{cache['name']}")).status_code == 403
    stats = server.app.gemini.cache_statistics()
    assert (stats.alive, stats.deleted, stats.missing) == (0, 1, 1)
    record = server.app.gemini.caches.records[0]
    assert record.renewals and record.deleted is not None


async def test_a_cache_is_refused_where_google_refuses_it() -> None:
    async with serve_mock(MockServerConfig(gemini_min_cache_tokens=4096)) as server, \
            httpx2.AsyncClient(base_url=root_of(server)) as client:
        small = await client.post("/v1beta/cachedContents", json=cache_body())
        tokens = mock_token_count("Answer from the handbook.\n" + PREFIX)
        assert (small.status_code, error_of(small)["message"]) == (
            400, f"Cached content is too small. total_token_count={tokens}, min_total_token_count=4096")
        assert server.app.gemini.cache_statistics().refused_small == 1
    async with serve_mock() as server, httpx2.AsyncClient(base_url=root_of(server)) as client:
        name = (await client.post("/v1beta/cachedContents", json=cache_body())).json()["name"]
        with_system = request("q", cachedContent=name, systemInstruction={"parts": [{"text": "again"}]})
        refused = await client.post(GENERATE, json=with_system)
        assert refused.status_code == 400 and "CachedContent can not be used" in error_of(refused)["message"]
        other = await client.post("/v1beta/models/gemini-2.0-flash:generateContent",
                                  json=request("q", cachedContent=name))
        assert other.status_code == 400 and "has to be the same" in error_of(other)["message"]
        unknown = await client.post(GENERATE, json=request("q", cachedContents="cachedContents/nope"))
        assert unknown.status_code == 400  # a misspelt field, refused as proto JSON refuses it
        stats = server.app.gemini.cache_statistics()
        assert (stats.used, stats.missing) == (0, 0)  # a refused request neither used nor missed a cache


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_cache_expires_by_the_apps_clock_unless_renewed_in_time() -> None:
    clock = ManualClock()
    app = MockOpenAIApp(MockServerConfig(), clock=clock, wall_clock=lambda: 1_800_000_000.0 + clock.now)
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://mock") as client:
        kept = (await client.post("/v1beta/cachedContents", json=cache_body(ttl="60s"))).json()["name"]
        dropped = (await client.post("/v1beta/cachedContents", json=cache_body(ttl="60s"))).json()["name"]
        clock.now += 59.0
        assert (await client.patch(f"/v1beta/{kept}", json={"ttl": "60s"})).status_code == 200
        clock.now += 1.0  # dropped's TTL has run out; kept was renewed a second before
        assert (await client.post(GENERATE, json=request("q", cachedContent=kept))).status_code == 200
        late = await client.post(GENERATE, json=request("q", cachedContent=dropped))
        assert late.status_code == 403
        assert (await client.patch(f"/v1beta/{dropped}", json={"ttl": "60s"})).status_code == 403
        stats = app.gemini.cache_statistics()
        assert (stats.alive, stats.expired, stats.renewed) == (1, 1, 1)
        assert app.gemini.caches.records[0].renewals == [1059.0]


# -- Google's own SDK against the mock -------------------------------------------------------------


async def test_googles_sdk_round_trips_through_the_mock(server: MockServer) -> None:
    from google import genai
    from google.genai import errors, types

    client = genai.Client(api_key=KEY, http_options=types.HttpOptions(base_url=root_of(server)))

    def run() -> dict[str, Any]:
        plain = client.models.generate_content(
            model=MODEL, contents="hello",
            config=types.GenerateContentConfig(system_instruction="Be brief.", max_output_tokens=100,
                                               response_mime_type="application/json", response_schema=SCHEMA))
        cache = client.caches.create(model=MODEL, config=types.CreateCachedContentConfig(
            contents=[PREFIX], ttl="300s", display_name="handbook"))
        cached = client.models.generate_content(
            model=MODEL, contents="q", config=types.GenerateContentConfig(cached_content=cache.name))
        client.caches.update(name=str(cache.name), config=types.UpdateCachedContentConfig(ttl="600s"))
        client.caches.delete(name=str(cache.name))
        try:
            client.models.generate_content(model=MODEL, contents="x [[fail:429]] [[retry_after:3]]")
        except errors.ClientError as exc:
            failure = exc
        return {"plain": plain, "cache": cache, "cached": cached, "failure": failure}

    got = await anyio.to_thread.run_sync(run)
    assert set(json.loads(got["plain"].text)) == {"name", "age"}
    assert got["cache"].usage_metadata.total_token_count == mock_token_count(PREFIX)
    assert got["cached"].usage_metadata.cached_content_token_count == mock_token_count(PREFIX)
    assert (got["failure"].code, got["failure"].status) == (429, "RESOURCE_EXHAUSTED")
    assert got["failure"].details["error"]["details"][-1]["retryDelay"] == "3s"
    stats = server.app.gemini.cache_statistics()
    assert (stats.created, stats.renewed, stats.deleted, stats.used) == (1, 1, 1, 1)


# -- the documented wire examples (tests/data/wire/) -----------------------------------------------

WIRE = TESTS / "data" / "wire"


def keys(value: Any) -> Any:
    """The shape of a JSON value: objects as their sorted keys (recursively), lists by their first item."""
    if isinstance(value, dict):
        return {key: keys(item) for key, item in sorted(value.items())}
    if isinstance(value, list):
        return [keys(value[0])] if value else []
    return type(value).__name__


async def test_the_answers_have_the_fields_of_the_documented_examples(server: MockServer) -> None:
    example = json.loads((WIRE / "gemini_generate_content_response.json").read_text())
    payload = json.loads((WIRE / "gemini_generate_content_request.json").read_text())
    async with httpx2.AsyncClient(base_url=root_of(server), headers={"x-goog-api-key": KEY}) as client:
        cache = (await client.post("/v1beta/cachedContents", json=cache_body())).json()
        del payload["systemInstruction"]  # a request naming a cache leaves that to the cache
        payload["cachedContent"] = cache["name"]
        payload["generationConfig"]["thinkingConfig"] = {"thinkingBudget": 64}
        reply = await client.post(GENERATE, json=payload)
    assert reply.status_code == 200
    answer = reply.json()
    json.loads(answer["candidates"][0]["content"]["parts"][0]["text"])  # the schema's JSON
    usage = {k: v for k, v in answer["usageMetadata"].items() if not k.endswith("Details")}
    assert keys({**answer, "usageMetadata": usage}) == keys(example)
    assert usage["totalTokenCount"] == (usage["promptTokenCount"] + usage["candidatesTokenCount"]
                                        + usage["thoughtsTokenCount"])


async def test_the_errors_have_the_fields_of_the_documented_examples(server: MockServer) -> None:
    for name, marker in (("gemini_error_429.json", "[[fail:429]]"),
                         ("gemini_error_503.json", "[[fail:503]]")):
        example = json.loads((WIRE / name).read_text())
        reply = await post(server, GENERATE, request(f"x {marker} [[retry_after:45]]"))
        body = reply.json()
        if "details" not in example["error"]:
            body["error"].pop("details", None)  # an overload may also say how long to back off
        assert keys(body) == keys(example)
        assert [d["@type"] for d in body["error"].get("details", [])] == [
            d["@type"] for d in example["error"].get("details", [])]
    assert body["error"]["message"] == example["error"]["message"]
