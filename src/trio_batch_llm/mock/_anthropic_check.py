"""What makes a Messages API request invalid, as Anthropic refuses it: a 400 naming the field.

Written from Anthropic's documentation of ``POST /v1/messages``: the
``anthropic-version`` header, ``model``, ``max_tokens`` (an integer >= 1) and
``messages`` are required; ``system`` is a string or a list of text blocks;
each message has a ``role`` (``user`` or ``assistant``) and a string or a list
of content blocks (``text``, ``image`` with a ``base64`` or ``url`` source,
``document``, ``tool_use``, ``tool_result``, ...); ``temperature`` is within 0..1;
``stop_sequences`` is a list of strings; ``tools`` have a ``name`` and an
``input_schema``; ``tool_choice`` is ``auto``, ``any``, ``none`` or ``tool`` (which
names one of the tools). Field paths are Anthropic's (``messages.0.content.1.source``).
From ``anthropic-version`` 2026-10-21 on (what the official SDK 2.x sends) the params have
no ``temperature``, ``top_p`` or ``top_k``: a request with one is refused naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["request_problem"]

_BLOCK_TYPES: Final = frozenset({"text", "image", "document", "tool_use", "tool_result", "thinking",
                                 "redacted_thinking", "search_result", "server_tool_use",
                                 "web_search_tool_result"})
SAMPLING_REMOVED: Final = "2026-10-21"
"""The API version (the official SDK 2.x's) whose Messages params have no temperature, top_p or top_k."""
_MEDIA_TYPES: Final = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})


def request_problem(headers: Mapping[str, str], payload: Any) -> str | None:
    """The message of the 400 for this request, or ``None`` when Anthropic would accept it."""
    if "anthropic-version" not in headers:
        return "anthropic-version: header is required"
    version = headers["anthropic-version"]
    if version >= SAMPLING_REMOVED and isinstance(payload, Mapping):
        for name in ("temperature", "top_p", "top_k"):
            if name in payload:
                return f"{name}: Extra inputs are not permitted (anthropic-version {version})"
    if not isinstance(payload, Mapping):
        return "The request body is not valid JSON (mock)"
    for name in ("model", "max_tokens", "messages"):
        if name not in payload:
            return f"{name}: Field required"
    if not isinstance(payload["model"], str) or not payload["model"]:
        return "model: Input should be a non-empty string"
    tokens = payload["max_tokens"]
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        return f"max_tokens: Input should be an integer greater than or equal to 1 (got {tokens!r})"
    problem = _system_problem(payload.get("system"))
    if problem is None:
        problem = _messages_problem(payload["messages"])
    if problem is None:
        problem = _params_problem(payload)
    return problem


def _system_problem(system: Any) -> str | None:
    if system is None or isinstance(system, str):
        return None
    if not isinstance(system, list):
        return "system: Input should be a valid string or a list of text blocks"
    for index, block in enumerate(system):
        text = block.get("text") if isinstance(block, Mapping) else None
        if not isinstance(block, Mapping) or block.get("type") != "text" or not isinstance(text, str):
            return f"system.{index}: Input should be a text block with a string text"
    return None


def _messages_problem(messages: Any) -> str | None:
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    for index, entry in enumerate(messages):
        where = f"messages.{index}"
        if not isinstance(entry, Mapping):
            return f"{where}: Input should be an object"
        if entry.get("role") not in ("user", "assistant"):
            return f"{where}.role: Input should be 'user' or 'assistant' (got {entry.get('role')!r})"
        content = entry.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            return f"{where}.content: Input should be a valid string or a list of content blocks"
        for number, block in enumerate(content):
            problem = _block_problem(block, f"{where}.content.{number}")
            if problem is not None:
                return problem
    return None


def _block_problem(block: Any, where: str) -> str | None:
    if not isinstance(block, Mapping) or block.get("type") not in _BLOCK_TYPES:
        kind = block.get("type") if isinstance(block, Mapping) else block
        return f"{where}.type: Input tag {kind!r} does not match any of the expected content block tags"
    if block["type"] == "text" and not isinstance(block.get("text"), str):
        return f"{where}.text: Field required"
    if block["type"] == "image":
        source = block.get("source")
        if not isinstance(source, Mapping):
            return f"{where}.source: Field required"
        if source.get("type") == "base64":
            if source.get("media_type") not in _MEDIA_TYPES:
                return f"{where}.source.media_type: Input should be one of {sorted(_MEDIA_TYPES)}"
            if not isinstance(source.get("data"), str):
                return f"{where}.source.data: Field required"
        elif source.get("type") == "url":
            if not isinstance(source.get("url"), str):
                return f"{where}.source.url: Field required"
        elif source.get("type") != "file":
            return f"{where}.source.type: Input should be 'base64', 'url' or 'file'"
    return None


def _params_problem(payload: Mapping[str, Any]) -> str | None:
    temperature = payload.get("temperature")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, int | float)
                                    or not 0.0 <= temperature <= 1.0):
        return f"temperature: Input should be a number within 0..1 (got {temperature!r})"
    stops = payload.get("stop_sequences")
    if stops is not None and (not isinstance(stops, list) or not all(isinstance(s, str) for s in stops)):
        return "stop_sequences: Input should be a valid list of strings"
    tools = payload.get("tools")
    names: list[str] = []
    if tools is not None:
        if not isinstance(tools, list):
            return "tools: Input should be a valid list"
        for index, tool in enumerate(tools):
            if not isinstance(tool, Mapping) or not isinstance(tool.get("name"), str):
                return f"tools.{index}.name: Field required"
            if "type" not in tool and not isinstance(tool.get("input_schema"), Mapping):
                return f"tools.{index}.input_schema: Field required"
            names.append(tool["name"])
    choice = payload.get("tool_choice")
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, Mapping) else None
        if kind not in ("auto", "any", "tool", "none"):
            return "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'"
        if kind == "tool" and choice.get("name") not in names:
            return f"tool_choice.name: no tool named {choice.get('name')!r} in tools"
        if kind in ("any", "tool") and not names:
            return "tool_choice: tools are required when tool_choice is 'any' or 'tool'"
    return None
