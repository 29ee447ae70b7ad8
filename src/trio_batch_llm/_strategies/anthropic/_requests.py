"""Anthropic's Messages API, requests: an item's request and params as ``messages.create`` takes them.

Pure functions of values (no SDK import): :func:`request_problem` refuses at input what
the Messages API cannot take, :func:`build_params` spells the rest as the API does.
The SDK 2.x default API version (2026-10-21) has no sampling parameters at all
(``temperature``, ``top_p``, ``top_k`` are a 400 on every model), no seed, no
log-probabilities and one answer per call: those are refused here, before any call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..._values._prompts import LLMRequest
from ..._values._structured import ResponseModel

__all__ = ["DEFAULT_MAX_TOKENS", "IMAGE_TYPES", "REFUSED_PARAMS", "build_params", "request_problem"]

DEFAULT_MAX_TOKENS: Final = 4096
"""``max_tokens`` when neither the item nor the strategy sets ``max_output_tokens``: Anthropic
requires one, and 4096 is an output every Claude model accepts (a larger default would be a 400
on the models with the smallest output limits), yet long enough for most batch answers."""

REFUSED_PARAMS: Final = {
    "temperature": "the Messages API (version 2026-10-21, SDK 2.x) has no sampling temperature",
    "top_p": "the Messages API (version 2026-10-21, SDK 2.x) has no top_p",
    "seed": "the Messages API has no seed",
    "logprobs": "the Messages API returns no log-probabilities",
    "top_logprobs": "the Messages API returns no log-probabilities",
}
"""Parameters Anthropic cannot take, and why (refused at input, before any call)."""

_DATA_URL: Final = re.compile(r"^data:(?P<type>[\w.+-]+/[\w.+-]+);base64,(?P<data>.*)$", re.DOTALL)
_PASSED_PARTS: Final = frozenset({"text", "image", "document", "tool_use", "tool_result", "search_result",
                                  "thinking", "redacted_thinking"})
_EPHEMERAL: Final = {"type": "ephemeral"}
IMAGE_TYPES: Final = ("image/jpeg", "image/png", "image/gif", "image/webp")
"""The media types of a base64 image Anthropic documents."""


def request_problem(request: LLMRequest, params: Mapping[str, Any], response: ResponseModel | None) -> \
        str | None:
    """Why the Messages API cannot take ``request`` (``params``: the strategy's under the item's), or
    ``None``. The message names the field and says what to do instead."""
    merged = {**params, **request.params}
    for key in sorted(REFUSED_PARAMS):
        if merged.get(key) is not None and merged.get(key) is not False:
            return (f"params[{key!r}]: {REFUSED_PARAMS[key]}; remove it (or put it in params['extra_body'] "
                    "if your endpoint takes it)")
    response_format = merged.get("response_format")
    if isinstance(response_format, Mapping) and response_format.get("type") == "json_object":
        return ("params['response_format']: Anthropic has no JSON mode without a schema; pass a "
                "json_schema response_format or response_model=")
    if response is not None and isinstance(response_format, Mapping) \
            and response_format.get("type") == "json_schema":
        return "params['response_format']: response_model= already sets the answer's schema; pass one"
    prompt = request.prompt
    if isinstance(prompt, str):
        return None
    for index, message in enumerate(prompt):
        content = message.get("content")
        for part_index, part in enumerate(content if isinstance(content, list) else ()):
            kind = part.get("type")
            if kind == "image_url":
                image = part.get("image_url")
                url = image.get("url") if isinstance(image, Mapping) else image
                if not isinstance(url, str) or not (_DATA_URL.match(url) or url.startswith(("http://",
                                                                                            "https://"))):
                    return (f"messages[{index}].content[{part_index}]: an image_url must be an http(s) URL "
                            "or a base64 data URL (data:image/png;base64,...)")
                found = _DATA_URL.match(url)
                if found and found["type"] not in IMAGE_TYPES:
                    return (f"messages[{index}].content[{part_index}]: Anthropic takes no {found['type']} "
                            f"image (only {', '.join(IMAGE_TYPES)})")
            elif kind not in _PASSED_PARTS:
                return (f"messages[{index}].content[{part_index}]: Anthropic takes no {kind!r} content part "
                        "(text, image_url, and Anthropic's own blocks: image, document, tool_result, ...)")
    return None


def build_params(
    model: str,
    request: LLMRequest,
    *,
    params: Mapping[str, Any],
    system_prompt: str | None,
    cache_system_prompt: bool,
    max_output_tokens: int | None,
    response: ResponseModel | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(create_kwargs, extra_body)``: the keyword arguments of ``messages.create`` for ``request``, and
    the ``extra_body`` fields (the strategy's, then the item's) that go into the JSON body last.

    ``system``: the strategy's system prompt (``params["system"]``, else ``system_prompt=``, marked
    for caching with ``cache_system_prompt``), then the item's ``system``, then the system and
    developer messages of the item, as text blocks in that order.
    """
    item = request.params
    extra = {**(params.get("extra_body") or {}), **(item.get("extra_body") or {})}
    blocks: list[dict[str, Any]] = []
    shared = params.get("system", system_prompt)
    if shared:
        blocks.append({"type": "text", "text": shared, **({"cache_control": dict(_EPHEMERAL)}
                                                           if cache_system_prompt else {})})
    if item.get("system"):
        blocks.append({"type": "text", "text": item["system"]})
    messages = _messages(request.prompt, blocks)
    limit = item.get("max_output_tokens", params.get("max_output_tokens", max_output_tokens))
    body: dict[str, Any] = {"model": model, "max_tokens": limit or DEFAULT_MAX_TOKENS, "messages": messages}
    if blocks:
        plain = len(blocks) == 1 and "cache_control" not in blocks[0]
        body["system"] = blocks[0]["text"] if plain else blocks
    stop = item.get("stop", params.get("stop"))
    if stop is not None:
        body["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    tools = item.get("tools", params.get("tools"))
    if tools is not None:
        body["tools"] = [_tool(tool) for tool in tools]
    choice = item.get("tool_choice", params.get("tool_choice"))
    if choice is not None:
        body["tool_choice"] = _tool_choice(choice)
    schema = response.schema if response is not None else _format_schema(
        item.get("response_format", params.get("response_format")))
    if schema is not None:
        body["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
    return body, extra


def _messages(prompt: str | Sequence[Mapping[str, Any]], system: list[dict[str, Any]]) -> \
        list[dict[str, Any]]:
    """OpenAI-format messages as Anthropic's; system/developer messages are appended to ``system``."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    messages: list[dict[str, Any]] = []
    for message in prompt:
        role, content = message.get("role"), message.get("content")
        if role in ("system", "developer"):
            system.extend(_blocks(content) if isinstance(content, list)
                          else [{"type": "text", "text": str(content)}])
        elif role == "tool":  # a function's answer goes back as the user's tool_result block
            result = {"type": "tool_result", "tool_use_id": str(message.get("tool_call_id", "")),
                      "content": _blocks(content) if isinstance(content, list) else str(content or "")}
            messages.append({"role": "user", "content": [result]})
        elif role == "assistant" and message.get("tool_calls"):
            blocks = _blocks(content) if isinstance(content, list) else (
                [{"type": "text", "text": content}] if content else [])
            blocks.extend(_tool_use(call) for call in message["tool_calls"])
            messages.append({"role": "assistant", "content": blocks})
        else:
            messages.append({"role": str(role), "content": _blocks(content) if isinstance(content, list)
                             else content})
    return messages


def _blocks(parts: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Content parts as Anthropic blocks; a part's ``cache_control`` (prompt caching) is kept."""
    blocks = []
    for part in parts:
        kind = part.get("type")
        if kind == "image_url":
            image = part.get("image_url")
            url = str(image.get("url") if isinstance(image, Mapping) else image)
            found = _DATA_URL.match(url)
            source = ({"type": "base64", "media_type": found["type"], "data": found["data"]} if found
                      else {"type": "url", "url": url})
            block: dict[str, Any] = {"type": "image", "source": source}
        elif kind == "text":
            block = {"type": "text", "text": str(part.get("text", ""))}
        else:
            block = {key: value for key, value in part.items() if key != "cache_control"}
        if part.get("cache_control") is not None:
            block["cache_control"] = dict(part["cache_control"])
        blocks.append(block)
    return blocks


def _tool_use(call: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI assistant ``tool_calls`` entry as a ``tool_use`` block (arguments: JSON text)."""
    found = call.get("function")
    function: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    arguments = function.get("arguments") or "{}"
    try:
        given = json.loads(arguments) if isinstance(arguments, str) else dict(arguments)
    except ValueError:
        given = {}
    return {"type": "tool_use", "id": str(call.get("id", "")), "name": str(function.get("name", "")),
            "input": given}


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI function tool as an Anthropic tool (``parameters`` -> ``input_schema``); Anthropic's
    own tools (client tools with ``input_schema``, server tools by ``type``) pass as they are."""
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, Mapping):
        return dict(tool)
    converted: dict[str, Any] = {"name": function.get("name"),
                                 "input_schema": dict(function.get("parameters") or {"type": "object",
                                                                                     "properties": {}})}
    if function.get("description"):
        converted["description"] = function["description"]
    if function.get("strict") is not None:
        converted["strict"] = bool(function["strict"])
    if tool.get("cache_control") is not None:
        converted["cache_control"] = dict(tool["cache_control"])
    return converted


def _tool_choice(choice: Any) -> Any:
    """OpenAI's ``tool_choice`` as Anthropic's: ``"auto"``, ``"required"`` (-> any), ``"none"``, or a
    named function (-> ``{"type": "tool", "name": ...}``); Anthropic's own shape passes."""
    if isinstance(choice, str):
        return {"type": {"required": "any"}.get(choice, choice)}
    if isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
        return {"type": "tool", "name": choice["function"].get("name")}
    return dict(choice) if isinstance(choice, Mapping) else choice


def _format_schema(response_format: Any) -> dict[str, Any] | None:
    """The JSON schema of a ``json_schema`` response_format (OpenAI's chat shape or flat), or ``None``."""
    if not isinstance(response_format, Mapping) or response_format.get("type") != "json_schema":
        return None
    inner = response_format.get("json_schema")
    schema = (inner if isinstance(inner, Mapping) else response_format).get("schema")
    return dict(schema) if isinstance(schema, Mapping) else None
