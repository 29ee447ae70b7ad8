"""The OpenAI wire format, requests: an item's request and params as each API spells them.

Chat Completions and Responses differ in most fields (messages vs ``input``,
the system prompt, the token limit, ``response_format`` vs ``text.format``,
the tools' shape); this is the one table of those differences. Re-exported by
:mod:`._wire`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from ..._values._prompts import LLMRequest, Prompt
from ..._values._structured import ResponseModel

__all__ = ["RESPONSES_REFUSED", "build_request_body", "merge_params", "wire_body"]

Api = Literal["chat", "responses"]


RESPONSES_REFUSED: Final = {
    "seed": "the Responses API has no seed",
    "stop": "the Responses API has no stop sequences",
}
"""Parameters ``api="responses"`` cannot send, and why (refused at input, before any call)."""


def merge_params(
    request: LLMRequest,
    *,
    defaults: Mapping[str, Any] | None = None,
    system_prompt: str | None = None,
    response: ResponseModel | None = None,
) -> dict[str, Any]:
    """A request's params over the strategy's: ``system`` from the item, else ``params=``, else
    ``system_prompt=``; ``response_format`` from the params, else the response model's;
    ``extra_body`` merged key by key (the item's win)."""
    merged: dict[str, Any] = {}
    if system_prompt is not None:
        merged["system"] = system_prompt
    if response is not None:
        merged["response_format"] = response.chat_response_format()
    extra: dict[str, Any] = {}
    for layer in (defaults or {}, request.params):
        for key, value in layer.items():
            if key == "extra_body":
                extra.update(value or {})
            elif value is not None:
                merged[key] = value
    if extra:
        merged["extra_body"] = extra
    return merged


def build_request_body(
    api: Api,
    model: str,
    prompt: str | LLMRequest,
    *,
    system_prompt: str | None = None,
    temperature: float | None = None,
    max_output_tokens: int | None = None,
    max_tokens_field: str = "max_tokens",
    extra_body: Mapping[str, Any] | None = None,
    params: Mapping[str, Any] | None = None,
    response: ResponseModel | None = None,
    include_extra: bool = True,
) -> dict[str, Any]:
    """The JSON body of one call; ``extra_body`` keys (the strategy's, then the params') are merged
    last and win, unless ``include_extra`` is false (the SDK sends them itself)."""
    request = prompt if isinstance(prompt, LLMRequest) else LLMRequest(prompt)
    defaults: dict[str, Any] = {}
    if temperature is not None:
        defaults["temperature"] = temperature
    if max_output_tokens is not None:
        defaults["max_output_tokens"] = max_output_tokens
    if extra_body:
        defaults["extra_body"] = dict(extra_body)
    defaults.update({k: v for k, v in (params or {}).items() if k != "extra_body"})
    if params and params.get("extra_body"):
        defaults["extra_body"] = {**defaults.get("extra_body", {}), **params["extra_body"]}
    merged = merge_params(request, defaults=defaults, system_prompt=system_prompt, response=response)
    body = wire_body(api, model, request.prompt, merged, max_tokens_field=max_tokens_field)
    if include_extra and merged.get("extra_body"):
        body.update(merged["extra_body"])
    return body


def wire_body(api: Api, model: str, prompt: Prompt, params: Mapping[str, Any], *,
              max_tokens_field: str = "max_tokens") -> dict[str, Any]:
    """``params`` (merged, :data:`PARAM_KEYS`) as ``api`` spells them; ``extra_body`` is left out."""
    body: dict[str, Any] = {"model": model}
    system = params.get("system")
    if api == "chat":
        messages: list[Any] = [] if system is None else [{"role": "system", "content": system}]
        messages.extend([{"role": "user", "content": prompt}] if isinstance(prompt, str)
                        else [dict(m) for m in prompt])
        body["messages"] = messages
        if params.get("max_output_tokens") is not None:
            body[max_tokens_field] = params["max_output_tokens"]
        for key in ("temperature", "top_p", "seed", "stop", "response_format", "tools", "tool_choice",
                    "logprobs", "top_logprobs"):
            if params.get(key) is not None:
                body[key] = params[key]
        return body
    body["input"] = prompt if isinstance(prompt, str) else [_responses_message(m) for m in prompt]
    if system is not None:
        body["instructions"] = system
    if params.get("max_output_tokens") is not None:
        body["max_output_tokens"] = params["max_output_tokens"]
    for key in ("temperature", "top_p", "top_logprobs"):
        if params.get(key) is not None:
            body[key] = params[key]
    if params.get("logprobs"):
        body["include"] = ["message.output_text.logprobs"]
    response_format = params.get("response_format")
    if isinstance(response_format, Mapping):
        body["text"] = {"format": _responses_format(response_format)}
    if params.get("tools") is not None:
        body["tools"] = [_responses_tool(t) for t in params["tools"]]
    choice = params.get("tool_choice")
    if choice is not None:
        if isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
            choice = {"type": "function", "name": choice["function"].get("name")}
        body["tool_choice"] = choice
    return body


def _responses_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A chat message as a Responses input item (content parts renamed: text -> input_text, ...)."""
    content = message.get("content")
    if not isinstance(content, list):
        return dict(message)
    output = message.get("role") == "assistant"
    parts = []
    for part in content:
        kind = part.get("type")
        if kind == "text":
            parts.append({"type": "output_text" if output else "input_text", "text": part.get("text", "")})
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            converted: dict[str, Any] = {"type": "input_image", "image_url": url}
            if isinstance(image, Mapping) and image.get("detail") is not None:
                converted["detail"] = image["detail"]
            parts.append(converted)
        else:
            parts.append(dict(part))  # already a Responses part (input_text, input_image, input_file, ...)
    return {**message, "content": parts}


def _responses_format(response_format: Mapping[str, Any]) -> dict[str, Any]:
    """Chat's ``response_format`` as the Responses API's ``text.format``."""
    inner = response_format.get("json_schema")
    if response_format.get("type") == "json_schema" and isinstance(inner, Mapping):
        return {"type": "json_schema", **inner}
    return dict(response_format)


def _responses_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A chat tool (``{"type": "function", "function": {...}}``) as a Responses tool (flat)."""
    if tool.get("type") == "function" and isinstance(tool.get("function"), Mapping):
        return {"type": "function", **tool["function"]}
    return dict(tool)
