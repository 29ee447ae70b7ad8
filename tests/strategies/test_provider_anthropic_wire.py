"""The Anthropic client's wire format against Anthropic's documented one (tests/data/wire/).

Each request case is an item and the Messages params Anthropic's reference shows for it;
the body must match exactly, use only the fields the SDK's ``MessageCreateParams`` documents,
and be what the SDK really puts on the wire. Answers and error bodies are read back from the
documented shapes. No sockets: the SDK runs over httpx2.MockTransport.
"""

from __future__ import annotations

import json
import typing
from typing import Any

import anthropic
import httpx2
import pytest
from anthropic.types import message_create_params, tool_param

from trio_batch_llm import AnthropicStrategy, ErrorCategory, LLMRequest
from trio_batch_llm._strategies.anthropic._errors import error_from_body
from trio_batch_llm._strategies.anthropic._requests import IMAGE_TYPES
from trio_batch_llm._strategies.anthropic._wire import read_message

from .._paths import TESTS

DATA = json.loads((TESTS / "data" / "wire" / "anthropic_messages.json").read_text("utf-8"))
KEY = "sk-ant-wire-0001-secret"
TOP_LEVEL = set(typing.get_type_hints(message_create_params.MessageCreateParamsBase, include_extras=True))
TOOL_FIELDS = set(typing.get_type_hints(tool_param.ToolParam, include_extras=True))
BLOCKS = {"text", "image", "document", "tool_use", "tool_result", "search_result"}
CHOICES = {"auto", "any", "tool", "none"}


def build(case: dict[str, Any], client: Any = None) -> AnthropicStrategy:
    if client is not None:
        return AnthropicStrategy("claude-haiku-4-5", client=client, **case["strategy"])
    return AnthropicStrategy("claude-haiku-4-5", api_key=KEY, base_url="http://wire.test", **case["strategy"])


def documented_problems(body: dict[str, Any]) -> list[str]:
    """What in ``body`` Anthropic's reference does not document."""
    problems = [f"unknown field {key!r}" for key in body if key not in TOP_LEVEL]
    problems += [f"missing {key!r}" for key in ("model", "max_tokens", "messages") if key not in body]
    for message in body.get("messages", []):
        if message.get("role") not in ("user", "assistant"):
            problems.append(f"role {message.get('role')!r}")
        content = message.get("content")
        for block in content if isinstance(content, list) else ():
            if block.get("type") not in BLOCKS:
                problems.append(f"block type {block.get('type')!r}")
            source = block.get("source", {})
            if block.get("type") == "image" and source.get("type") == "base64" \
                    and source.get("media_type") not in IMAGE_TYPES:
                problems.append(f"media type {source.get('media_type')!r}")
    problems += [f"tool field {key!r}" for tool in body.get("tools", []) for key in tool
                 if key not in TOOL_FIELDS]
    if "tool_choice" in body and body["tool_choice"].get("type") not in CHOICES:
        problems.append(f"tool_choice {body['tool_choice']!r}")
    system = body.get("system")
    if isinstance(system, list):
        problems += [f"system block {b.get('type')!r}" for b in system if b.get("type") != "text"]
    return problems


@pytest.mark.parametrize("case", DATA["requests"], ids=[c["name"] for c in DATA["requests"]])
def test_request_bodies_match_the_documented_examples(case: dict[str, Any]) -> None:
    body = build(case).request_body(LLMRequest(case["prompt"], params=case["params"]))
    assert body == case["body"]
    assert documented_problems(body) == []


@pytest.mark.anyio
@pytest.mark.parametrize("case", DATA["requests"], ids=[c["name"] for c in DATA["requests"]])
async def test_the_sdk_puts_exactly_that_body_on_the_wire(anyio_backend: Any, case: dict[str, Any]) -> None:
    sent: list[httpx2.Request] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        sent.append(request)
        return httpx2.Response(200, json=DATA["messages"][0]["message"])

    http = httpx2.AsyncClient(transport=httpx2.MockTransport(answer))
    client = anthropic.AsyncAnthropic(api_key=KEY, base_url="http://wire.test", http_client=http)
    strategy = build(case, client)
    await strategy.execute_request(LLMRequest(case["prompt"], params=case["params"]), 1, None)
    assert [json.loads(r.content) for r in sent] == [case["body"]]
    assert sent[0].url.path == "/v1/messages"


def test_the_documented_field_check_can_fail() -> None:
    bad = {"model": "m", "max_tokens": 1, "temperature": 0.5, "messages": [
        {"role": "system", "content": [{"type": "image_url", "image_url": "x"}]}]}
    assert documented_problems(bad) == ["unknown field 'temperature'", "role 'system'",
                                        "block type 'image_url'"]


@pytest.mark.parametrize("case", DATA["messages"], ids=[c["name"] for c in DATA["messages"]])
def test_documented_answers_are_read_into_text_and_usage(case: dict[str, Any]) -> None:
    text, usage, metadata = read_message(case["message"])
    assert (text, usage) == (case["text"], case["usage"])
    assert metadata["stop_reason"] == case["message"]["stop_reason"]
    assert metadata["stop_sequence"] == case["message"]["stop_sequence"]


@pytest.mark.parametrize("case", DATA["errors"],
                         ids=[f"{c['status']}-{i}" for i, c in enumerate(DATA["errors"])])
def test_documented_errors_are_filed(case: dict[str, Any]) -> None:
    made = error_from_body(case["status"], case["body"])
    assert made.category is ErrorCategory(case["category"])
    assert (made.stops_batch is not None) == case.get("stops_batch", False)
    assert made.status_code == case["status"]
