"""Structured output and response details, over real loopback HTTP against the mock server, both backends.

The mock answers a request that asks for a JSON schema with deterministic schema-valid JSON, and
breaks it on demand (``[[schema_violationx1]]``: the first answer only), so a PARSE retry, a fence,
a refusal and a schema rejection are exact.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import pydantic
import pytest

from trio_batch_llm import (
    ArtifactIdentity,
    BatchResult,
    ErrorCategory,
    GuardrailConfig,
    JsonlArtifactStore,
    ProcessorConfig,
    ResumePolicy,
    RetryConfig,
    SqliteArtifactStore,
    llm,
    process_prompts,
)
from trio_batch_llm._strategies.openai._compatible import OpenAICompatibleStrategy
from trio_batch_llm._strategies.openai._sdk import OpenAIStrategy
from trio_batch_llm._values._details import ResponseDetails, ToolCall
from trio_batch_llm._values._results import WorkItemResult
from trio_batch_llm._values._structured import ResponseModel, StructuredOutputError, schema_problem
from trio_batch_llm.mock import MockServer, MockServerConfig, serve_mock
from trio_batch_llm.mock._structured import example_of, schema_violation

pytestmark = pytest.mark.anyio

KEY = "sk-mock-structured-0123"
KINDS = [("compatible", "chat"), ("compatible", "responses"), ("sdk", "chat"), ("sdk", "responses")]


class Address(pydantic.BaseModel):
    city: str
    zip_code: str


class Person(pydantic.BaseModel):
    name: str
    age: int
    mood: Literal["happy", "sad"]
    tags: list[str]
    address: Address
    score: float
    active: bool


SCHEMA: dict[str, Any] = {
    "title": "Verdict", "type": "object", "additionalProperties": False,
    "properties": {"label": {"type": "string", "enum": ["spam", "ham"]}, "confidence": {"type": "number"}},
    "required": ["label", "confidence"],
}


@pytest.fixture
async def server() -> AsyncIterator[MockServer]:
    async with serve_mock(MockServerConfig(api_key=KEY)) as running:
        yield running


Strategy = OpenAICompatibleStrategy | OpenAIStrategy


def build(kind: str, server: MockServer, api: str, **kwargs: Any) -> Strategy:
    kwargs.setdefault("api_key", KEY)
    if kind == "compatible":
        return OpenAICompatibleStrategy("mock-model", base_url=server.base_url, api=api, **kwargs)
    return OpenAIStrategy("mock-model", base_url=server.base_url, api=api, **kwargs)


# Backoff so long that any wait before a retry would blow the item's deadline: a PARSE retry
# that succeeds proves it waited for nothing (a backoff would end the item as DEADLINE at once).
NO_ROOM_FOR_BACKOFF = ProcessorConfig(
    retry=RetryConfig(max_attempts=3, initial_wait=1000.0, max_wait=1000.0, jitter=False),
    guardrails=GuardrailConfig(total_timeout_per_item=60.0),
)


@pytest.mark.parametrize(("kind", "api"), KINDS)
async def test_model_sent_validated_and_retried_without_backoff(server: MockServer, kind: str,
                                                                api: str) -> None:
    strategy = build(kind, server, api, response_model=Person)
    prompts = [("ok", "describe someone"), ("retry", "describe [[schema_violationx1]] someone"),
               ("junk", "describe [[invalid_jsonx1]] someone"), ("fence", "describe [[fencedx1]] someone")]
    batch = await process_prompts(strategy, prompts, config=NO_ROOM_FOR_BACKOFF)
    results = batch.by_id()
    assert batch.succeeded == 4, [r.error for r in batch]
    for result in results.values():
        assert isinstance(result.output, Person)
    assert results["ok"].attempts == 1 and results["fence"].attempts == 1
    assert results["retry"].attempts == 2 and results["junk"].attempts == 2
    assert results["retry"].timing.backoff < 30  # no 1000 s backoff (it would not fit the deadline)
    assert results["fence"].metadata.get("fence_recovered") is True
    assert "fence_recovered" not in results["ok"].metadata
    assert "structured  1 answers recovered from a code fence" in batch.summary()
    sent = server.requests[0].body
    if api == "chat":
        assert sent["response_format"]["type"] == "json_schema"
        spec = sent["response_format"]["json_schema"]
    else:
        spec = sent["text"]["format"]
        assert spec["type"] == "json_schema"
    assert spec["name"] == "Person" and spec["strict"] is True
    assert spec["schema"] == strategy.response_schema
    assert spec["schema"]["additionalProperties"] is False


@pytest.mark.parametrize(("kind", "api"), [("compatible", "chat"), ("sdk", "responses")])
async def test_validation_failures_use_the_attempt_budget_and_keep_the_last_error(
        server: MockServer, kind: str, api: str) -> None:
    strategy = build(kind, server, api, response_model=SCHEMA)
    batch = await process_prompts(strategy, [("bad", "always [[schema_violation]]")],
                                  config=NO_ROOM_FOR_BACKOFF)
    (result,) = batch.results
    assert not result.success and result.error_category is ErrorCategory.PARSE
    assert result.attempts == 3 and len(server.requests) == 3
    assert isinstance(result.exception, StructuredOutputError)
    assert "missing required property 'label'" in (result.error or "")


@pytest.mark.parametrize(("kind", "api"), KINDS)
async def test_schema_rejection_is_terminal_and_says_so(kind: str, api: str) -> None:
    async with serve_mock(MockServerConfig(api_key=KEY, reject_json_schema=True)) as server:
        strategy = build(kind, server, api, response_model=SCHEMA)
        batch = await process_prompts(strategy, ["x"], config=NO_ROOM_FOR_BACKOFF)
    (result,) = batch.results
    assert result.error_category is ErrorCategory.INVALID_REQUEST and result.attempts == 1
    assert "schema" in (result.error or "").lower()
    if kind == "compatible":
        assert "rejected the response schema 'Verdict'" in (result.error or "")
    assert len(server.requests) == 1


@pytest.mark.parametrize("store_kind", ["jsonl", "sqlite"])
async def test_resume_and_from_json_return_model_instances(server: MockServer, tmp_path: Path,
                                                           store_kind: str) -> None:
    strategy = llm("openai-compatible:mock-model", base_url=server.base_url, api_key=KEY,
                   response_model=Person)
    identity = ArtifactIdentity(provider="openai-compatible", model="mock-model")
    path = tmp_path / ("run.jsonl" if store_kind == "jsonl" else "run.db")
    store_type = JsonlArtifactStore if store_kind == "jsonl" else SqliteArtifactStore
    first = await process_prompts(strategy, ["a", "b"], artifact_store=store_type(path, identity=identity))
    assert first.succeeded == 2
    again = await process_prompts(strategy, ["a", "b"], artifact_store=store_type(path, identity=identity),
                                  resume=ResumePolicy.REUSE_SUCCESSES)
    assert all(r.replayed for r in again) and len(server.requests) == 2
    assert [type(o) for o in again.outputs()] == [Person, Person]
    assert {r.item_id: r.output for r in again} == {r.item_id: r.output for r in first}
    exported = first.to_json()
    assert json.loads(exported)["results"][0]["output"] == first.results[0].output.model_dump(mode="json")  # type: ignore[union-attr]
    restored = BatchResult.from_json(exported, response_model=Person)
    assert [r.output for r in restored] == [r.output for r in first]
    jsonl = tmp_path / "out.jsonl"
    first.to_jsonl(jsonl)
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [line["output"] for line in lines] == [r.output.model_dump(mode="json") for r in first]  # type: ignore[union-attr]


@pytest.mark.parametrize(("kind", "api"), KINDS)
async def test_tool_calls_refusals_and_usage_details(server: MockServer, kind: str, api: str) -> None:
    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                       "additionalProperties": False}}}
    strategy = build(kind, server, api)
    batch = await process_prompts(strategy, [
        {"id": "tool", "prompt": "weather in Paris?",
         "params": {"tools": [weather], "tool_choice": "required"}},
        {"id": "text", "prompt": "hello"},
    ])
    results = batch.by_id()
    details = results["tool"].details
    assert details is not None and details.finish_reason == "tool_calls"
    (call,) = details.tool_calls
    assert call.name == "get_weather" and set(json.loads(call.arguments)) == {"city"}
    assert results["text"].details == ResponseDetails(finish_reason="stop")
    sent = next(r.body for r in server.requests if "Paris" in (r.prompt or ""))
    if api == "chat":
        assert sent["tools"] == [weather] and sent["tool_choice"] == "required"
    else:
        assert sent["tools"] == [{"type": "function", **weather["function"]}]
    assert results["text"].token_usage.get("reasoning_tokens") == 0
    assert results["text"].token_usage.get("cached_input_tokens") == 0
    assert results["text"].details.logprobs is None  # not asked for
    asked = await process_prompts(strategy, [{"id": "lp", "prompt": "hello", "params": {"logprobs": True}}])
    (with_logprobs,) = asked.results
    assert with_logprobs.success and with_logprobs.details is not None
    words = str(with_logprobs.output).split()
    assert words and [entry["token"] for entry in with_logprobs.details.logprobs or []] == words
    body = server.requests[-1].body
    if api == "chat":
        assert body.get("logprobs") is True
    else:
        assert "message.output_text.logprobs" in body["include"]
    structured = build(kind, server, api, response_model=SCHEMA)
    refused = await process_prompts(structured, ["please [[refusal]]"])
    (result,) = refused.results
    assert result.error_category is ErrorCategory.CONTENT_POLICY and result.attempts == 1
    assert "refused" in (result.error or "")


def test_details_round_trip_and_old_records() -> None:
    details = ResponseDetails("tool_calls", None, (ToolCall("c1", "f", '{"a":1}'),), [{"token": "x"}])
    result = WorkItemResult(item_id="a", success=True, output="", metadata={"response_details": details})
    assert result.details == details and "response_details" not in result.metadata
    data = json.loads(json.dumps(result.to_dict()))
    assert WorkItemResult.from_dict(data).details == details
    old = {"item_id": "a", "success": True, "output": "x"}  # a record written before details existed
    assert WorkItemResult.from_dict(old).details is None
    assert "details" not in WorkItemResult(item_id="b", success=True).to_dict()


def test_schema_generator_output_validates() -> None:
    model = ResponseModel(Person)
    rng = random.Random(3)
    for _ in range(50):
        value = example_of(model.schema, rng)
        assert schema_problem(model.schema, value) is None
        Person.model_validate(value)
        assert schema_problem(model.schema, schema_violation(model.schema, rng)) is not None
    output, fenced = model.parse('```json\n{"name":"a","age":1,"mood":"sad","tags":[],"score":1.5,'
                                 '"active":true,"address":{"city":"c","zip_code":"z"}}\n```')
    assert fenced and isinstance(output, Person)
    with pytest.raises(StructuredOutputError):
        model.parse('{"name": "a"}')
    assert ResponseModel(SCHEMA).strict and not ResponseModel({"type": "object", "properties": {
        "a": {"type": "string"}}}).strict
