"""Issue 31, point 8: a response schema is checked once, up front, with a depth bound.

A schema 5,000 levels deep, ``{"$ref": "#"}``, ``{"type": "banana"}``, ``properties`` that is a
list: the API refuses them when the strategy is made (``ConfigurationError`` naming
``response_model``), the command line refuses ``--response-schema FILE`` in one line naming the
file (exit status 2), and the bundled mock answers a malformed schema with the 400 a provider sends.
A recursive schema (through ``properties``) stays legal and is checked without RecursionError.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import pytest

from trio_batch_llm import ConfigurationError, ErrorCategory, OpenAICompatibleStrategy, process_prompts
from trio_batch_llm._values._schema_check import MAX_SCHEMA_DEPTH, response_schema_problem
from trio_batch_llm._values._structured import ResponseModel
from trio_batch_llm.cli import main
from trio_batch_llm.mock import MockServerConfig, serve_mock

KEY = "sk-mock-schema-check-0123"


def deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


BAD: list[tuple[str, Any, str]] = [
    ("nested-5000", deep(5000), f"nested more than {MAX_SCHEMA_DEPTH} levels deep"),
    ("ref-to-itself", {"$ref": "#"}, "leads back to itself"),
    ("ref-loop-through-anyof", {"anyOf": [{"$ref": "#"}, {"type": "null"}]}, "leads back to itself"),
    ("ref-loop-through-defs", {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"},
                                                             "b": {"$ref": "#/$defs/a"}}},
     "leads back to itself"),
    ("banana", {"type": "banana"}, "type='banana' must be one of"),
    ("banana-inside", {"type": "object", "properties": {"x": {"type": ["string", "banana"]}}},
     "at $.properties.x: type="),
    ("properties-list", {"type": "object", "properties": ["a", "b"]},
     "properties must be an object whose values are schemas, not an array"),
    ("required-not-names", {"type": "object", "properties": {}, "required": "a"},
     "required must be an array of property names"),
    ("items-a-string", {"type": "array", "items": "string"}, "items must be a schema, not a string"),
    ("unresolved-ref", {"$ref": "#/$defs/missing"}, "does not resolve"),
    ("remote-ref", {"$ref": "https://example.com/schema.json"}, "only local references"),
    ("enum-empty", {"type": "string", "enum": []}, "enum must be a non-empty array"),
]

RECURSIVE: dict[str, Any] = {
    "title": "Tree", "type": "object", "additionalProperties": False, "required": ["name", "children"],
    "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}},
}


@pytest.mark.parametrize(("name", "schema", "problem"), BAD, ids=[case[0] for case in BAD])
def test_the_api_refuses_a_bad_schema_when_the_strategy_is_made(name: str, schema: Any, problem: str) -> None:
    with pytest.raises(ConfigurationError, match="response_model") as caught:
        OpenAICompatibleStrategy("m", base_url="http://127.0.0.1:9/v1", response_model=schema)
    assert problem in str(caught.value)
    assert len(str(caught.value)) < 400  # the schema itself is never printed


def test_a_dict_that_contains_itself_is_refused_too() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {}}
    schema["properties"]["me"] = schema
    with pytest.raises(ConfigurationError, match="contains itself"):
        ResponseModel(schema)


@pytest.mark.parametrize(("name", "schema", "problem"), BAD, ids=[case[0] for case in BAD])
def test_the_cli_refuses_the_schema_file_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, schema: Any, problem: str,
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "prompt": "x"}\n')
    schema_file = tmp_path / "schema.json"
    # No json.dumps for the deep one: it recurses per level too. The text is built by hand.
    text = json.dumps(schema) if name != "nested-5000" else (
        '{"type": "object", "properties": {"a": ' * 5000 + '{"type": "string"}' + "}}" * 5000)
    schema_file.write_text(text)
    out = tmp_path / "out.jsonl"
    code = main(["run", str(source), "--model", "openai-compatible:m", "--base-url", "http://127.0.0.1:9/v1",
                 "--out", str(out), "--response-schema", str(schema_file)])
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"trio-batch-llm: error: --response-schema {schema_file}:")
    assert problem in lines[0], lines[0]
    assert "Traceback" not in output and not out.exists()


def test_a_recursive_schema_is_legal_and_checked_without_recursion_error() -> None:
    model = ResponseModel(RECURSIVE)
    tree: dict[str, Any] = {"name": "leaf", "children": []}
    for level in range(300):
        tree = {"name": f"n{level}", "children": [tree]}
    output, _ = model.parse(json.dumps(tree))
    assert output["name"] == "n299"
    with pytest.raises(Exception, match="children") as caught:
        model.parse(json.dumps({"name": "x", "children": [{"name": "y", "children": "no"}]}))
    assert type(caught.value).__name__ == "StructuredOutputError"
    # An answer nested deeper than Python recurses is a PARSE failure, not a RecursionError.
    very_deep = '{"name": "x", "children": [' * 3000 + '{"name": "y", "children": []}' + "]}" * 3000
    with pytest.raises(Exception, match="nested too deep") as caught:
        model.parse(very_deep)
    assert type(caught.value).__name__ == "StructuredOutputError"


def test_good_schemas_pass() -> None:
    assert response_schema_problem(RECURSIVE) is None
    assert response_schema_problem(deep(MAX_SCHEMA_DEPTH // 2 - 1)) is None
    assert response_schema_problem({"type": ["string", "null"], "enum": ["a", None]}) is None
    escaped = {"$defs": {"a~b/c": {"type": "string"}}, "$ref": "#/$defs/a~0b~1c"}
    assert response_schema_problem(escaped) is None
    assert response_schema_problem({"type": "object", "x-vendor": {"anything": [1, 2]}}) is None


# --- the mock answers a malformed schema as a provider does -------------------------------------

@pytest.mark.anyio
@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize(("name", "schema"), [("banana", {"type": "banana"}),
                                              ("properties-list", {"type": "object", "properties": ["a"]}),
                                              ("ref-to-itself", {"$ref": "#"})])
async def test_the_mock_answers_a_malformed_schema_with_400(api: str, name: str, schema: Any) -> None:
    if api == "chat":
        body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}],
                                "response_format": {"type": "json_schema",
                                                    "json_schema": {"name": "Bad", "schema": schema}}}
    else:
        body = {"model": "m", "input": "x",
                "text": {"format": {"type": "json_schema", "name": "Bad", "schema": schema}}}
    async with serve_mock(MockServerConfig(api_key=KEY)) as server, httpx2.AsyncClient() as client:
        path = "/chat/completions" if api == "chat" else "/responses"
        answer = await client.post(server.base_url + path, json=body,
                                   headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_json_schema"
    assert error["message"].startswith("Invalid schema for response_format 'Bad': ")


@pytest.mark.anyio
async def test_the_mock_answers_malformed_tool_parameters_with_400() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required",
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                                    "properties": [1]}}}]}
    async with serve_mock(MockServerConfig(api_key=KEY)) as server, httpx2.AsyncClient() as client:
        answer = await client.post(server.base_url + "/chat/completions", json=body,
                                   headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["message"].startswith("Invalid schema for function 'f': ")


@pytest.mark.anyio
async def test_a_recursive_schema_runs_against_the_mock() -> None:
    async with serve_mock(MockServerConfig(api_key=KEY)) as server:
        strategy = OpenAICompatibleStrategy("m", base_url=server.base_url, api_key=KEY,
                                            response_model=RECURSIVE)
        batch = await process_prompts(strategy, ["a", "b"])
    assert all(result.success for result in batch.results), [r.error for r in batch.results]
    assert all(result.error_category is not ErrorCategory.UNKNOWN for result in batch.results)


@pytest.mark.anyio
async def test_an_items_own_response_format_schema_is_checked_before_any_call() -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "Bad", "schema": {"type": "banana"}}}
    async with serve_mock(MockServerConfig(api_key=KEY)) as server:
        strategy = OpenAICompatibleStrategy("m", base_url=server.base_url, api_key=KEY)
        with pytest.raises(ValueError, match=r"params\['response_format'\].*type='banana'"):
            await process_prompts(strategy, ["fine", {"id": "b", "prompt": "x",
                                                      "params": {"response_format": bad}}])
        assert server.requests == []
