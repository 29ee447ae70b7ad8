"""The mock's Gemini dialect, its pure parts: request checks, answers, Google's error bodies, the cache store.

No server and no clock here (the store takes ``now`` and ``wall``); the served
dialect is tested in ``test_mock_gemini.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from trio_batch_llm.mock._dialect import Route
from trio_batch_llm.mock._gemini import (
    model_path,
    prompt_text,
    prompt_tokens,
    request_problem,
    requested_function,
    requested_schema,
)
from trio_batch_llm.mock._gemini_caches import CacheStore, parse_duration
from trio_batch_llm.mock._gemini_dialect import GeminiDialect
from trio_batch_llm.mock._gemini_errors import duration_text, quota_exhausted, status_error
from trio_batch_llm.mock._plan import Content, success_body
from trio_batch_llm.mock._state import MockServerConfig, mock_token_count


def request(text: str, **extra: Any) -> dict[str, Any]:
    return {"contents": [{"role": "user", "parts": [{"text": text}]}], **extra}


def generate_answer(config: MockServerConfig, payload: dict[str, Any], *, model: str, prompt: str,
                    occurrence: int, content: Content = "text", dialect: GeminiDialect | None = None,
                    ) -> dict[str, Any]:
    """The success body the app would send, built through the seam as the app builds it."""
    dialect = dialect if dialect is not None else GeminiDialect(config, lambda: 0.0)
    route = Route(dialect, "generateContent", model)
    return success_body(config, route, payload, prompt, occurrence, content)


# -- routes and request checks ---------------------------------------------------------------------


def test_the_model_and_method_come_from_the_path() -> None:
    assert model_path("/v1beta/models/gemini-2.5-flash:generateContent") == (
        "gemini-2.5-flash", "generateContent")
    assert model_path("/v1/models/gemini-2.0-flash:streamGenerateContent") == (
        "gemini-2.0-flash", "streamGenerateContent")
    assert model_path("/v1beta/models/x") is None
    assert model_path("/v1/chat/completions") is None


def test_an_unknown_field_is_refused_as_google_refuses_it_and_proto_names_are_accepted() -> None:
    assert request_problem(request("hi", generationConfig={"maxOutputTokens": 5})) is None
    # proto JSON accepts the proto (snake_case) name too
    assert request_problem(request("hi", generation_config={"max_output_tokens": 5})) is None
    assert request_problem(request("hi", generationConfig={"maxTokens": 5})) == (
        "Invalid JSON payload received. Unknown name \"maxTokens\" at 'generation_config': "
        "Cannot find field.")
    assert request_problem(request("hi", messages=[])) == (
        'Invalid JSON payload received. Unknown name "messages": Cannot find field.')
    problem = request_problem(request("hi", generationConfig={"thinkingConfig": {"budget": 3}}))
    assert problem is not None and "'generation_config.thinking_config'" in problem


@pytest.mark.parametrize(("payload", "words"), [
    ({"contents": []}, "contents is not specified"),
    ({}, "contents is not specified"),
    ({"contents": [{"role": "assistant", "parts": [{"text": "x"}]}]}, "valid role"),
    ({"contents": [{"role": "user", "parts": []}]}, "must not be empty"),
    ({"contents": [{"role": "user", "parts": [{"inlineData": {"mimeType": "image/png"}}]}]}, "inline_data"),
    (request("x", generationConfig={"responseSchema": {"type": "OBJECT"}}), "response_mime_type"),
    (request("x", generationConfig={"responseMimeType": "application/json", "responseSchema": {},
                                    "responseJsonSchema": {}}), "cannot both be set"),
])
def test_a_malformed_request_gets_a_message_naming_what_is_wrong(payload: dict[str, Any], words: str) -> None:
    problem = request_problem(payload)
    assert problem is not None and words in problem


def test_the_prompt_is_the_system_instruction_and_every_text_part_and_media_counts_258() -> None:
    payload = {
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "contents": [{"role": "user", "parts": [
            {"text": "What is this?"}, {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}]}],
    }
    assert request_problem(payload) is None
    assert prompt_text(payload) == "Be brief.\nWhat is this?"
    assert prompt_tokens(payload) == mock_token_count("Be brief.\nWhat is this?") + 258


# -- answers ---------------------------------------------------------------------------------------


def test_a_plain_answer_has_googles_fields_and_usage() -> None:
    body = generate_answer(MockServerConfig(), request("hello"), model="gemini-2.5-flash", prompt="hello",
                           occurrence=0)
    assert body["candidates"] == [{"content": {"role": "model", "parts": [{"text": "echo: hello"}]},
                                   "finishReason": "STOP", "index": 0}]
    usage = body["usageMetadata"]
    prompt, output = mock_token_count("hello"), mock_token_count("echo: hello")
    assert (usage["promptTokenCount"], usage["candidatesTokenCount"], usage["totalTokenCount"]) == (
        prompt, output, prompt + output)
    assert "cachedContentTokenCount" not in usage and "thoughtsTokenCount" not in usage
    assert body["modelVersion"] == "gemini-2.5-flash" and isinstance(body["responseId"], str)


def test_cached_tokens_are_part_of_the_prompt_count_and_thoughts_are_reported_apart() -> None:
    dialect = GeminiDialect(MockServerConfig(), lambda: 0.0)
    _, cache = dialect.caches.create(cache_body("x" * 4000), now=0.0, wall=WALL)
    thinking = {"thinkingBudget": 2, "includeThoughts": True}
    payload = request("hello", cachedContent=cache["name"], generationConfig={"thinkingConfig": thinking})
    body = generate_answer(MockServerConfig(), payload, model="m", prompt="hello", occurrence=0,
                           dialect=dialect)
    usage = body["usageMetadata"]
    own, output = mock_token_count("hello"), mock_token_count("echo: hello")
    assert usage["promptTokenCount"] == own + 1000
    assert usage["cachedContentTokenCount"] == 1000
    assert usage["thoughtsTokenCount"] == 2
    assert usage["totalTokenCount"] == own + 1000 + output + 2
    parts = body["candidates"][0]["content"]["parts"]
    assert parts[0]["thought"] is True and parts[1] == {"text": "echo: hello"}


def test_candidate_count_max_output_tokens_and_stop_sequences() -> None:
    config = MockServerConfig(output_tokens=40)
    two = generate_answer(config, request("p", generationConfig={"candidateCount": 2}), model="m", prompt="p",
                          occurrence=0)
    assert [c["index"] for c in two["candidates"]] == [0, 1]
    cut = generate_answer(config, request("p", generationConfig={"maxOutputTokens": 3}), model="m",
                          prompt="p", occurrence=0)
    assert cut["candidates"][0]["finishReason"] == "MAX_TOKENS"
    assert cut["usageMetadata"]["candidatesTokenCount"] == 3
    stopped = generate_answer(MockServerConfig(), request("a b", generationConfig={"stopSequences": [" b"]}),
                              model="m", prompt="a b", occurrence=0)
    assert stopped["candidates"][0]["content"]["parts"] == [{"text": "echo: a"}]


RESPONSE_SCHEMA = {"type": "OBJECT", "properties": {
    "name": {"type": "STRING"}, "tags": {"type": "ARRAY", "items": {"type": "STRING"}, "maxItems": "2"},
    "score": {"type": "NUMBER", "nullable": True}}, "required": ["name", "tags"]}


def test_response_schema_in_googles_openapi_subset_is_answered_with_json_following_it() -> None:
    payload = request("p", generationConfig={"responseMimeType": "application/json",
                                             "responseSchema": RESPONSE_SCHEMA})
    assert requested_schema(payload) == {"type": "object", "required": ["name", "tags"], "properties": {
        "name": {"type": "string"}, "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}},
        "score": {"type": ["number", "null"]}}}
    body = generate_answer(MockServerConfig(), payload, model="m", prompt="p", occurrence=0)
    answer = json.loads(body["candidates"][0]["content"]["parts"][0]["text"])
    assert isinstance(answer["name"], str) and 1 <= len(answer["tags"]) <= 2


@pytest.mark.parametrize("content", ["invalid_json", "schema_violation", "fenced"])
def test_the_structured_markers_break_a_json_answer(content: Any) -> None:
    payload = request("p", generationConfig={"responseMimeType": "application/json",
                                             "responseJsonSchema": {"type": "object", "properties": {
                                                 "a": {"type": "integer"}}, "required": ["a"]}})
    text = generate_answer(MockServerConfig(), payload, model="m", prompt="p", occurrence=0,
                           content=content)["candidates"][0]["content"]["parts"][0]["text"]
    if content == "invalid_json":
        with pytest.raises(ValueError):
            json.loads(text)
    elif content == "schema_violation":
        assert "a" not in json.loads(text)
    else:
        assert text.startswith("```json\n") and "a" in json.loads(text[8:-4])


def test_a_forced_function_call_is_answered_with_args_following_its_parameters() -> None:
    payload = request("p", tools=[{"functionDeclarations": [
        {"name": "other", "parameters": {"type": "OBJECT"}},
        {"name": "lookup", "parameters": {"type": "OBJECT", "properties": {"q": {"type": "STRING"}},
                                          "required": ["q"]}}]}],
        toolConfig={"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["lookup"]}})
    assert requested_function(payload, "p") is not None
    part = generate_answer(MockServerConfig(), payload, model="m", prompt="p",
                           occurrence=0)["candidates"][0]["content"]["parts"][0]
    assert part["functionCall"]["name"] == "lookup" and isinstance(part["functionCall"]["args"]["q"], str)
    assert requested_function(request("p", tools=payload["tools"]), "p") is None  # AUTO: text


# -- Google's errors -------------------------------------------------------------------------------


def test_retry_delay_is_a_protobuf_duration() -> None:
    assert [duration_text(s) for s in (45, 45.8, 0.25, 0)] == ["45s", "45.8s", "0.25s", "0s"]
    assert [parse_duration(t) for t in ("300s", "1.5s", "5m", 300)] == [300.0, 1.5, None, None]


def test_a_per_minute_quota_says_its_wait_in_retry_info_and_a_per_day_one_does_not() -> None:
    minute = quota_exhausted("minute", model="models/gemini-2.5-flash", retry_delay=45.8, limit=10)["error"]
    assert (minute["code"], minute["status"]) == (429, "RESOURCE_EXHAUSTED")
    types = [d["@type"] for d in minute["details"]]
    assert types == ["type.googleapis.com/google.rpc.QuotaFailure", "type.googleapis.com/google.rpc.Help",
                     "type.googleapis.com/google.rpc.RetryInfo"]
    violation = minute["details"][0]["violations"][0]
    assert violation["quotaId"] == "GenerateRequestsPerMinutePerProjectPerModel"
    assert violation["quotaDimensions"] == {"location": "global", "model": "gemini-2.5-flash"}
    assert violation["quotaValue"] == "10"
    assert minute["details"][2]["retryDelay"] == "45.8s"
    day = quota_exhausted("day", model="gemini-2.5-flash")["error"]
    assert day["details"][0]["violations"][0]["quotaId"] == "GenerateRequestsPerDayPerProjectPerModel"
    assert all("RetryInfo" not in d["@type"] for d in day["details"])


@pytest.mark.parametrize(("status", "name"), [(400, "INVALID_ARGUMENT"), (401, "UNAUTHENTICATED"),
                                              (403, "PERMISSION_DENIED"), (404, "NOT_FOUND"),
                                              (500, "INTERNAL"), (503, "UNAVAILABLE"),
                                              (504, "DEADLINE_EXCEEDED")])
def test_each_status_has_googles_canonical_name(status: int, name: str) -> None:
    error = status_error(status)["error"]
    assert (error["code"], error["status"]) == (status, name) and error["message"]
    assert status_error(503)["error"]["message"] == "The model is overloaded. Please try again later."


# -- the cache store -------------------------------------------------------------------------------

WALL = 1_800_000_000.0


def cache_body(text: str = "a long shared prefix " * 10, **extra: Any) -> dict[str, Any]:
    return {"model": "models/gemini-2.5-flash", "contents": [{"role": "user", "parts": [{"text": text}]}],
            **extra}


def test_a_cache_lives_for_its_ttl_and_reports_its_size_and_times() -> None:
    store = CacheStore(min_tokens=10)
    status, made = store.create(cache_body(ttl="300s", displayName="shared"), now=100.0, wall=WALL)
    assert status == 200 and made["name"].startswith("cachedContents/")
    assert made["model"] == "models/gemini-2.5-flash" and made["displayName"] == "shared"
    assert made["usageMetadata"] == {"totalTokenCount": mock_token_count("a long shared prefix " * 10)}
    assert made["createTime"] == "2027-01-15T08:00:00.000000Z"
    assert made["expireTime"] == "2027-01-15T08:05:00.000000Z"
    cache_id = made["name"].split("/")[1]
    assert store.get(cache_id, now=399.0, wall=WALL + 299)[0] == 200
    assert store.get(cache_id, now=400.0, wall=WALL + 300) == (
        403, {"error": {"code": 403, "message": "CachedContent not found (or permission denied)",
                        "status": "PERMISSION_DENIED"}})
    assert store.statistics(400.0).expired == 1 and store.statistics(400.0).alive == 0


def test_a_renewal_moves_the_expiry_and_a_delete_ends_the_cache() -> None:
    store = CacheStore()
    _, made = store.create(cache_body(ttl="60s"), now=0.0, wall=WALL)
    cache_id = made["name"].split("/")[1]
    status, renewed = store.patch(cache_id, {"ttl": "120s"}, "ttl", now=50.0, wall=WALL + 50)
    assert status == 200 and renewed["expireTime"] == "2027-01-15T08:02:50.000000Z"
    assert store.lookup(made["name"], 169.0) is not None and store.lookup(made["name"], 170.0) is None
    assert store.patch(cache_id, {"displayName": "x"}, "display_name", now=60.0, wall=WALL)[0] == 400
    assert store.delete(cache_id, now=61.0) == (200, {})
    assert store.delete(cache_id, now=62.0)[0] == 403
    stats = store.statistics(62.0)
    assert (stats.created, stats.alive, stats.deleted, stats.renewed, stats.expired) == (1, 0, 1, 1, 0)
    assert store.records[0].renewals == [50.0] and store.records[0].deleted == 61.0


def test_an_absolute_expire_time_and_the_default_hour() -> None:
    store = CacheStore()
    _, made = store.create(cache_body(expireTime="2027-01-15T08:10:00Z"), now=0.0, wall=WALL)
    assert store.lookup(made["name"], 599.0) is not None and store.lookup(made["name"], 600.0) is None
    _, default = store.create(cache_body(), now=0.0, wall=WALL)
    assert default["expireTime"] == "2027-01-15T09:00:00.000000Z"
    assert "displayName" not in default  # proto3 JSON leaves an empty string out
    assert store.create(cache_body(ttl="5m"), now=0.0, wall=WALL)[0] == 400
    assert store.create(cache_body(ttl="5s", expireTime="2027-01-15T08:10:00Z"), now=0.0, wall=WALL)[0] == 400
    assert store.create(cache_body(expireTime="2020-01-01T00:00:00Z"), now=0.0, wall=WALL)[0] == 400


def test_a_cache_under_the_minimum_size_is_refused_as_google_refuses_it() -> None:
    store = CacheStore(min_tokens=4096)
    status, body = store.create(cache_body("short"), now=0.0, wall=WALL)
    assert (status, body) == (400, {"error": {
        "code": 400,
        "message": "Cached content is too small. total_token_count=2, min_total_token_count=4096",
        "status": "INVALID_ARGUMENT"}})
    assert store.statistics(0.0).refused_small == 1 and store.statistics(0.0).created == 0


def test_the_list_pages_through_the_live_caches() -> None:
    store = CacheStore()
    names = [store.create(cache_body(ttl="10s"), now=0.0, wall=WALL)[1]["name"] for _ in range(3)]
    store.create(cache_body(ttl="1s"), now=0.0, wall=WALL)  # expired by the time we list
    _, first = store.list({"pageSize": "2"}, now=5.0, wall=WALL)
    assert [c["name"] for c in first["cachedContents"]] == names[:2]
    _, second = store.list({"pageSize": "2", "pageToken": first["nextPageToken"]}, now=5.0, wall=WALL)
    assert [c["name"] for c in second["cachedContents"]] == names[2:] and "nextPageToken" not in second
    assert store.list({}, now=20.0, wall=WALL) == (200, {})


# -- serve-mock's flags ----------------------------------------------------------------------------


def test_serve_mock_flags_reach_the_gemini_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    import trio_batch_llm.mock as mock
    from trio_batch_llm._cli._main import build_parser

    seen: list[MockServerConfig] = []
    monkeypatch.setattr(mock, "run_mock_server", lambda host, port, config, **_: seen.append(config))
    args = build_parser().parse_args(["serve-mock", "--gemini-daily-limit", "250",
                                      "--gemini-min-cache-tokens", "1024"])
    assert args.handler(args, []) == 0
    assert (seen[0].gemini_daily_request_limit, seen[0].gemini_min_cache_tokens) == (250, 1024)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve-mock", "--gemini-daily-limit", "0"])
