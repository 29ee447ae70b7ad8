"""Gemini's wire format: request bodies, responses and error answers against documented payload shapes.

The payloads below follow Google's documented ``models.generateContent`` request and
response and its ``google.rpc`` error details, in our own words and values.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from trio_batch_llm import ErrorCategory, LLMRequest, ProviderError
from trio_batch_llm._strategies.gemini._errors import error_from_body
from trio_batch_llm._strategies.gemini._wire import build_request_body, read_response, request_problem
from trio_batch_llm._values._details import DETAILS_METADATA_KEY
from trio_batch_llm._values._structured import ResponseModel

from .._paths import TESTS

# A documented-shape response: text in candidates[0].content.parts, usage in usageMetadata.
RESPONSE: dict[str, Any] = {
    "candidates": [{
        "content": {"role": "model", "parts": [{"text": "Paris is "}, {"text": "the capital."}]},
        "finishReason": "STOP", "index": 0,
    }],
    "usageMetadata": {"promptTokenCount": 1200, "cachedContentTokenCount": 1000,
                      "candidatesTokenCount": 12, "thoughtsTokenCount": 30, "totalTokenCount": 1242},
    "modelVersion": "gemini-2.5-flash", "responseId": "resp-81x",
}


def _quota_error(quota_id: str, delay: str = "45.8s") -> dict[str, Any]:
    return {"error": {
        "code": 429, "status": "RESOURCE_EXHAUSTED",
        "message": "You exceeded your current quota, please check your plan and billing details.",
        "details": [
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{
                "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                "quotaId": quota_id, "quotaDimensions": {"location": "global", "model": "gemini-2.5-flash"},
                "quotaValue": "250"}]},
            {"@type": "type.googleapis.com/google.rpc.Help", "links": [{"description": "quota docs",
                                                                        "url": "https://ai.google.dev/"}]},
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay},
        ],
    }}


def test_a_text_prompt_with_settings_is_a_generate_content_request() -> None:
    body = build_request_body("Name a capital.", system_prompt="Be brief.", max_output_tokens=64,
                              params={"temperature": 0.2, "top_p": 0.9, "stop": "END"})
    assert body == {
        "contents": [{"role": "user", "parts": [{"text": "Name a capital."}]}],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "generationConfig": {"temperature": 0.2, "topP": 0.9, "maxOutputTokens": 64,
                             "stopSequences": ["END"]},
    }


def test_messages_map_to_user_and_model_roles_and_images_to_inline_or_file_data() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You label images."},
        {"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            {"type": "image_url", "image_url": "gs://bucket/cat.jpg"},
        ]},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": "And its colour?"},
    ]
    body = build_request_body(LLMRequest(messages, {"max_tokens": 10}), system_prompt="ignored")
    assert body["systemInstruction"] == {"parts": [{"text": "You label images."}]}
    assert body["contents"] == [
        {"role": "user", "parts": [{"text": "What is this?"},
                                   {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},
                                   {"fileData": {"fileUri": "gs://bucket/cat.jpg",
                                                 "mimeType": "image/jpeg"}}]},
        {"role": "model", "parts": [{"text": "A cat."}]},
        {"role": "user", "parts": [{"text": "And its colour?"}]},
    ]
    assert body["generationConfig"] == {"maxOutputTokens": 10}


def test_tools_become_function_declarations_and_tool_choice_a_tool_config() -> None:
    tool = {"type": "function", "function": {"name": "lookup", "description": "find a row",
                                             "parameters": {"type": "object", "properties": {}}}}
    body = build_request_body(LLMRequest("x", {"tools": [tool], "tool_choice": "required"}))
    assert body["tools"] == [{"functionDeclarations": [{
        "name": "lookup", "description": "find a row",
        "parametersJsonSchema": {"type": "object", "properties": {}}}]}]
    assert body["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}


def test_a_response_schema_is_sent_as_json_mime_type_and_json_schema() -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "city", "schema": {
        "$schema": "x", "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}
    body = build_request_body(LLMRequest("x", {"response_format": schema}))
    assert body["generationConfig"] == {"responseMimeType": "application/json", "responseJsonSchema": {
        "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}


def test_generation_config_fields_in_extra_body_go_into_generation_config() -> None:
    body = build_request_body(LLMRequest("q", {"temperature": 0.5, "extra_body": {
        "thinkingConfig": {"thinkingBudget": 0}, "generationConfig": {"topK": 3},
        "safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}]}}))
    assert body["generationConfig"] == {"temperature": 0.5, "thinkingConfig": {"thinkingBudget": 0},
                                        "topK": 3}
    assert body["safetySettings"][0]["threshold"] == "BLOCK_NONE"


def test_a_cached_content_replaces_the_system_instruction_and_extra_body_merges_last() -> None:
    body = build_request_body(LLMRequest("q", {"extra_body": {"safetySettings": []}}),
                              system_prompt="long shared prefix", cached_content="cachedContents/abc")
    assert "systemInstruction" not in body
    assert body["cachedContent"] == "cachedContents/abc"
    assert body["safetySettings"] == []


@pytest.mark.parametrize(("messages", "expected"), [
    ([{"role": "user", "content": "a"}, {"role": "system", "content": "late"}], "messages[1]"),
    ([{"role": "tool", "content": "r", "tool_call_id": "1"}], "role 'tool'"),
    ([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}], "messages[0].content[0]"),
])
def test_what_gemini_cannot_take_is_refused_at_input(messages: list[Any], expected: str) -> None:
    problem = request_problem(LLMRequest(messages))
    assert problem is not None and expected in problem


def test_logprobs_are_refused_at_input() -> None:
    assert "logprobs" in str(request_problem(LLMRequest("x", {"logprobs": True})))
    assert request_problem(LLMRequest("x", {"temperature": 1})) is None


def test_a_response_reads_text_usage_and_metadata_by_the_token_conventions() -> None:
    text, usage, metadata = read_response(RESPONSE)
    assert text == "Paris is the capital."
    assert usage == {"input_tokens": 1200, "cached_input_tokens": 1000, "output_tokens": 42,
                     "reasoning_tokens": 30, "total_tokens": 1242}
    assert (metadata["model"], metadata["id"], metadata["finish_reason"]) == (
        "gemini-2.5-flash", "resp-81x", "STOP")
    assert metadata[DETAILS_METADATA_KEY].finish_reason == "stop"


def test_thought_parts_are_not_the_answer_and_function_calls_are_tool_calls() -> None:
    payload = {"candidates": [{"content": {"parts": [
        {"text": "thinking...", "thought": True},
        {"functionCall": {"name": "lookup", "args": {"q": 1}}}]}, "finishReason": "STOP"}]}
    text, _, metadata = read_response(payload)
    assert text == ""
    calls = metadata[DETAILS_METADATA_KEY].tool_calls
    assert [(c.name, c.arguments) for c in calls] == [("lookup", '{"q":1}')]


@pytest.mark.parametrize("payload", [
    {"candidates": [{"content": {"parts": []}, "finishReason": "SAFETY"}]},
    {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 5}},
])
def test_a_blocked_prompt_or_answer_is_content_policy(payload: dict[str, Any]) -> None:
    with pytest.raises(ProviderError) as caught:
        read_response(payload)
    assert caught.value.category is ErrorCategory.CONTENT_POLICY
    assert "SAFETY" in str(caught.value)


def test_the_sdk_response_object_reads_like_its_json() -> None:
    types = pytest.importorskip("google.genai.types")
    sdk = types.GenerateContentResponse.model_validate(RESPONSE)
    assert read_response(sdk)[:2] == read_response(RESPONSE)[:2]


def test_a_per_minute_quota_is_a_rate_limit_with_the_retry_delay() -> None:
    error = error_from_body(429, _quota_error("GenerateRequestsPerMinutePerProjectPerModel-FreeTier"))
    assert error.category is ErrorCategory.RATE_LIMIT
    assert error.retry_after == pytest.approx(45.8)
    assert error.stops_batch is None
    assert "RESOURCE_EXHAUSTED" in str(error) and "PerMinute" in str(error)


def test_a_per_day_quota_stops_the_batch_and_names_quota_and_model() -> None:
    error = error_from_body(429, _quota_error("GenerateRequestsPerDayPerProjectPerModel-FreeTier", "12s"))
    assert error.category is ErrorCategory.INSUFFICIENT_BALANCE
    assert error.stops_batch is not None
    assert ("per-day quota GenerateRequestsPerDayPerProjectPerModel-FreeTier spent for model "
            "gemini-2.5-flash") in error.stops_batch
    assert error.retry_after is None


@pytest.mark.parametrize(("status", "body", "category"), [
    (503, {"error": {"code": 503, "status": "UNAVAILABLE", "message": "The model is overloaded."}},
     ErrorCategory.SERVER),
    (500, {"error": {"code": 500, "status": "INTERNAL", "message": "An internal error has occurred."}},
     ErrorCategory.SERVER),
    (504, {"error": {"code": 504, "status": "DEADLINE_EXCEEDED", "message": "Deadline expired."}},
     ErrorCategory.TIMEOUT),
    (400, {"error": {"code": 400, "status": "INVALID_ARGUMENT", "message":
                     "The input token count (1200000) exceeds the maximum number of tokens allowed "
                     "(1048576)."}},
     ErrorCategory.CONTEXT_LENGTH),
    (400, {"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": "API key not valid.", "details": [
        {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"}]}},
     ErrorCategory.AUTHENTICATION),
    (403, {"error": {"code": 403, "status": "PERMISSION_DENIED", "message": "denied"}},
     ErrorCategory.AUTHENTICATION),
    (404, {"error": {"code": 404, "status": "NOT_FOUND",
                     "message": "models/gemini-9 is not found for API version v1beta"}},
     ErrorCategory.INVALID_REQUEST),
    (400, {"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": "Invalid JSON payload."}},
     ErrorCategory.INVALID_REQUEST),
    (502, "<html>bad gateway</html>", ErrorCategory.SERVER),
])
def test_error_statuses_map_to_categories(status: int, body: Any, category: ErrorCategory) -> None:
    error = error_from_body(status, body)
    assert error.category is category
    assert error.status_code == status


def test_a_retry_after_header_is_used_when_the_body_has_no_retry_info() -> None:
    error = error_from_body(429, {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "slow"}},
                            {"retry-after": "7"})
    assert (error.category, error.retry_after) == (ErrorCategory.RATE_LIMIT, 7.0)


# -- the shared fixtures of documented payloads (tests/data/wire/, also checked against the mock) -----

WIRE = TESTS / "data" / "wire"


def _wire(name: str) -> Any:
    return json.loads((WIRE / name).read_text(encoding="utf-8"))


def test_our_request_body_has_the_documented_shape() -> None:
    documented = _wire("gemini_generate_content_request.json")
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "Which colour is the sea?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}
    body = build_request_body(LLMRequest(messages, {"temperature": 0.0, "max_output_tokens": 16}),
                              system_prompt="Answer in one word.", response=ResponseModel(schema))
    config = dict(body["generationConfig"])
    documented_config = dict(documented["generationConfig"])
    # Google documents two schema fields: responseSchema (its OpenAPI subset) and responseJsonSchema
    # (JSON Schema as is), which we send because our schemas are JSON Schema.
    documented_config.pop("responseSchema")
    assert config.pop("responseJsonSchema")["properties"] == {"colour": {"type": "string"}}
    assert config == documented_config
    assert {k: v for k, v in body.items() if k != "generationConfig"} == \
        {k: v for k, v in documented.items() if k != "generationConfig"}


def test_the_documented_response_and_errors_read_as_documented() -> None:
    text, usage, metadata = read_response(_wire("gemini_generate_content_response.json"))
    assert text == '{"colour": "blue"}'
    assert usage == {"input_tokens": 1290, "cached_input_tokens": 1024, "output_tokens": 19,
                     "reasoning_tokens": 12, "total_tokens": 1309}
    assert metadata["id"] == "ExampleOnlyResponseId01"
    minute = error_from_body(429, _wire("gemini_error_429.json"))
    assert (minute.category, minute.retry_after, minute.stops_batch) == (ErrorCategory.RATE_LIMIT, 45.0, None)
    overloaded = error_from_body(503, _wire("gemini_error_503.json"))
    assert overloaded.category is ErrorCategory.SERVER and "overloaded" in str(overloaded)
