"""Gemini's REST wire format, both directions, without I/O: GenerateContentRequest JSON and responses.

Requests are built as Google documents ``models.generateContent`` (camelCase JSON:
``contents``, ``systemInstruction``, ``generationConfig``, ``tools``, ``cachedContent``)
from an item's OpenAI-format messages and params; what Gemini cannot take is named by
:func:`request_problem` before any call. :func:`read_response` reads a response (the
REST JSON, or the SDK's response object) into ``(text, usage, metadata)``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from ..._values._categories import ErrorCategory
from ..._values._details import DETAILS_METADATA_KEY, ResponseDetails, ToolCall
from ..._values._errors import ProviderError
from ..._values._prompts import LLMRequest
from ..._values._results import TokenUsage
from ..._values._structured import ResponseModel

__all__ = ["BLOCKED_FINISH_REASONS", "GENERATION_FIELDS", "build_request_body",
           "read_response", "request_problem"]

BLOCKED_FINISH_REASONS: Final = frozenset({
    "SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY",
})
"""Finish reasons that mean the answer was withheld by a filter (CONTENT_POLICY, not retried)."""
GENERATION_FIELDS: Final = frozenset({
    "stopSequences", "responseMimeType", "responseSchema", "responseJsonSchema", "responseModalities",
    "candidateCount", "maxOutputTokens", "temperature", "topP", "topK", "seed", "presencePenalty",
    "frequencyPenalty", "responseLogprobs", "logprobs", "enableEnhancedCivicAnswers", "speechConfig",
    "thinkingConfig", "imageConfig", "mediaResolution",
})
"""Google's ``GenerationConfig`` fields: given in ``extra_body`` they are sent inside ``generationConfig``."""
_FINISH_NAMES: Final = {"STOP": "stop", "MAX_TOKENS": "length"}
_ROLES: Final = {"user": "user", "assistant": "model", "model": "model"}
_SCHEMA_DROPPED: Final = frozenset({"$schema"})


def request_problem(request: LLMRequest) -> str | None:
    """What Gemini cannot take in ``request``, said before any call; ``None`` if it can be sent."""
    prompt = request.prompt
    if not isinstance(prompt, str):
        for index, message in enumerate(prompt):
            role = message.get("role")
            if role in ("system", "developer"):
                if index != 0:
                    return (f"messages[{index}]: Gemini takes one system instruction, as the first "
                            f"message only (role {role!r} at position {index})")
                if not isinstance(message.get("content"), str):
                    return f"messages[{index}]: a system message's content must be text for Gemini"
            elif role == "tool":
                return (f"messages[{index}]: role 'tool' (a function result) is not supported by this "
                        "strategy's Gemini mapping; send the result as a user message")
            elif role not in _ROLES:
                return f"messages[{index}]: role {role!r} is not one Gemini knows (user, assistant, system)"
            content = message.get("content")
            if isinstance(content, list):
                for p, part in enumerate(content):
                    problem = _part_problem(part)
                    if problem is not None:
                        return f"messages[{index}].content[{p}]: {problem}"
    params = request.params
    for key in ("logprobs", "top_logprobs"):
        if params.get(key):
            return f"params[{key!r}]: Gemini's generateContent has no {key} in this strategy"
    tool_choice = params.get("tool_choice")
    if tool_choice is not None and _tool_config(tool_choice) is None:
        return f"params['tool_choice']={tool_choice!r:.60}: expected 'auto', 'none', 'required' or a function"
    return None


def _part_problem(part: Any) -> str | None:
    if not isinstance(part, Mapping):
        return "a content part must be a mapping"
    kind = part.get("type")
    if kind == "text":
        return None
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, Mapping) else image
        if not isinstance(url, str) or not url:
            return "image_url needs a url"
        if url.startswith("data:") and (";base64," not in url):
            return "a data: URL must be base64 (data:MIME;base64,...)"
        return None
    return f"content part type {kind!r} is not supported for Gemini (text and image_url are)"


def build_request_body(
    prompt: str | LLMRequest,
    *,
    system_prompt: str | None = None,
    params: Mapping[str, Any] | None = None,
    max_output_tokens: int | None = None,
    response: ResponseModel | None = None,
    cached_content: str | None = None,
) -> dict[str, Any]:
    """The REST ``GenerateContentRequest`` for ``prompt``: the item's params over ``params=`` over
    the strategy's settings; ``extra_body`` keys (camelCase, Gemini's own) are merged last."""
    request = prompt if isinstance(prompt, LLMRequest) else LLMRequest(prompt)
    merged: dict[str, Any] = {}
    if max_output_tokens is not None:
        merged["max_output_tokens"] = max_output_tokens
    if system_prompt is not None:
        merged["system"] = system_prompt
    extra: dict[str, Any] = {}
    for layer in (params or {}, request.params):
        for key, value in layer.items():
            if key == "extra_body":
                extra.update(value or {})
            elif value is not None:
                merged["max_output_tokens" if key == "max_tokens" else key] = value
    messages = request.messages
    if messages and messages[0].get("role") in ("system", "developer"):
        merged["system"] = messages[0].get("content")
        messages = messages[1:]
    body: dict[str, Any] = {"contents": [_content(m) for m in messages]}
    if merged.get("system") is not None and cached_content is None:
        body["systemInstruction"] = {"parts": [{"text": merged["system"]}]}
    config = _generation_config(merged, response)
    if config:
        body["generationConfig"] = config
    if merged.get("tools") is not None and cached_content is None:
        body["tools"] = _tools(merged["tools"])
    if merged.get("tool_choice") is not None:
        tool_config = _tool_config(merged["tool_choice"])
        if tool_config is not None:
            body["toolConfig"] = tool_config
    if cached_content is not None:
        body["cachedContent"] = cached_content
    _merge_extra(body, extra)
    return body


def _merge_extra(body: dict[str, Any], extra: Mapping[str, Any]) -> None:
    """``extra_body`` last: a ``GenerationConfig`` field (``thinkingConfig``, ``topK``...) or a
    ``generationConfig`` mapping goes into ``generationConfig``, where Gemini reads it; the rest on top."""
    for key, value in extra.items():
        if key == "generationConfig" and isinstance(value, Mapping):
            body.setdefault("generationConfig", {}).update(value)
        elif key in GENERATION_FIELDS:
            body.setdefault("generationConfig", {})[key] = value
        else:
            body[key] = value


def _content(message: Mapping[str, Any]) -> dict[str, Any]:
    role = _ROLES.get(str(message.get("role", "user")), "user")
    content = message.get("content")
    if isinstance(content, str):
        return {"role": role, "parts": [{"text": content}]}
    parts: list[dict[str, Any]] = []
    for part in content or ():
        if part.get("type") == "text":
            parts.append({"text": str(part.get("text", ""))})
        elif part.get("type") == "image_url":
            parts.append(_image_part(part.get("image_url")))
    return {"role": role, "parts": parts}


def _image_part(image: Any) -> dict[str, Any]:
    """An OpenAI ``image_url`` as ``inlineData`` (a base64 data: URL) or ``fileData`` (any other URI)."""
    url = str(image.get("url") if isinstance(image, Mapping) else image)
    file_data: dict[str, Any] = {"fileUri": url}
    if url.startswith("data:"):
        header, _, data = url.partition(",")
        mime = header.removeprefix("data:").split(";", 1)[0] or "application/octet-stream"
        return {"inlineData": {"mimeType": mime, "data": data}}
    guessed = _guess_mime(url)
    if guessed is not None:
        file_data["mimeType"] = guessed
    return {"fileData": file_data}


def _guess_mime(url: str) -> str | None:
    path = url.split("?", 1)[0].lower()
    for ending, mime in ((".png", "image/png"), (".jpg", "image/jpeg"), (".jpeg", "image/jpeg"),
                         (".webp", "image/webp"), (".gif", "image/gif"), (".pdf", "application/pdf")):
        if path.endswith(ending):
            return mime
    return None


def _generation_config(merged: Mapping[str, Any], response: ResponseModel | None) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for ours, theirs in (("temperature", "temperature"), ("top_p", "topP"),
                         ("max_output_tokens", "maxOutputTokens"), ("seed", "seed")):
        if merged.get(ours) is not None:
            config[theirs] = merged[ours]
    stop = merged.get("stop")
    if stop is not None:
        config["stopSequences"] = [stop] if isinstance(stop, str) else list(stop)
    schema = _response_schema(merged.get("response_format"), response)
    if schema is not None:
        config["responseMimeType"] = "application/json"
        config["responseJsonSchema"] = schema
    elif isinstance(merged.get("response_format"), Mapping) and \
            merged["response_format"].get("type") == "json_object":
        config["responseMimeType"] = "application/json"
    return config


def _response_schema(response_format: Any, response: ResponseModel | None) -> dict[str, Any] | None:
    """The JSON schema for ``responseJsonSchema`` (which takes JSON Schema as is, unlike the
    OpenAPI subset of ``responseSchema``): the item's ``response_format``, else the response model's."""
    if isinstance(response_format, Mapping) and response_format.get("type") == "json_schema":
        inner = response_format.get("json_schema")
        schema = inner.get("schema") if isinstance(inner, Mapping) else response_format.get("schema")
        if isinstance(schema, Mapping):
            return {k: v for k, v in schema.items() if k not in _SCHEMA_DROPPED}
    if response is not None:
        return {k: v for k, v in response.schema.items() if k not in _SCHEMA_DROPPED}
    return None


def _tools(tools: list[Any]) -> list[dict[str, Any]]:
    """OpenAI function tools as one Gemini tool of ``functionDeclarations``; other tools pass as is."""
    declarations: list[dict[str, Any]] = []
    others: list[dict[str, Any]] = []
    for tool in tools:
        function = tool.get("function") if tool.get("type") == "function" else None
        if isinstance(function, Mapping):
            declaration = {"name": function.get("name")}
            if function.get("description") is not None:
                declaration["description"] = function["description"]
            if function.get("parameters") is not None:
                declaration["parametersJsonSchema"] = function["parameters"]
            declarations.append(declaration)
        else:
            others.append(dict(tool))
    return ([{"functionDeclarations": declarations}] if declarations else []) + others


def _tool_config(choice: Any) -> dict[str, Any] | None:
    modes = {"auto": "AUTO", "none": "NONE", "required": "ANY", "any": "ANY"}
    if isinstance(choice, str):
        mode = modes.get(choice.lower())
        return None if mode is None else {"functionCallingConfig": {"mode": mode}}
    function = choice.get("function") if isinstance(choice, Mapping) else None
    if isinstance(function, Mapping) and isinstance(function.get("name"), str):
        return {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": [function["name"]]}}
    return None


# -- responses --------------------------------------------------------------------------------


def read_response(payload: Any) -> tuple[str, TokenUsage, dict[str, Any]]:
    """``(text, usage, metadata)`` of a ``GenerateContentResponse`` (REST JSON, or the SDK's object).

    A prompt blocked by ``promptFeedback.blockReason`` or an answer stopped by a safety
    filter is a CONTENT_POLICY :class:`ProviderError` (final); a malformed body is PARSE.
    """
    if not isinstance(payload, Mapping) and hasattr(payload, "model_dump"):
        payload = payload.model_dump(mode="json", by_alias=True, exclude_none=True)
    if not isinstance(payload, Mapping):
        raise ProviderError("Gemini's response is not a JSON object", category=ErrorCategory.PARSE)
    usage = _usage(payload.get("usageMetadata"))
    feedback = payload.get("promptFeedback")
    block = feedback.get("blockReason") if isinstance(feedback, Mapping) else None
    candidates = payload.get("candidates")
    if block:
        raise ProviderError(f"Gemini blocked the prompt (promptFeedback.blockReason={block})",
                            category=ErrorCategory.CONTENT_POLICY, token_usage=_counts(usage))
    if not isinstance(candidates, list) or not candidates or not isinstance(candidates[0], Mapping):
        raise ProviderError("Gemini's response has no candidates", category=ErrorCategory.PARSE)
    candidate = candidates[0]
    finish = candidate.get("finishReason")
    if finish in BLOCKED_FINISH_REASONS:
        raise ProviderError(f"Gemini's safety filter stopped the answer (finishReason={finish})",
                            category=ErrorCategory.CONTENT_POLICY, token_usage=_counts(usage))
    content = candidate.get("content")
    parts = content.get("parts") if isinstance(content, Mapping) else None
    texts: list[str] = []
    calls: list[ToolCall] = []
    for part in parts if isinstance(parts, list) else ():
        if not isinstance(part, Mapping) or part.get("thought"):
            continue  # thought summaries are not the answer
        if isinstance(part.get("text"), str):
            texts.append(part["text"])
        call = part.get("functionCall")
        if isinstance(call, Mapping):
            calls.append(ToolCall(str(call.get("id", "")), str(call.get("name", "")),
                                  json.dumps(call.get("args") or {}, separators=(",", ":"))))
    metadata: dict[str, Any] = {"model": payload.get("modelVersion"), "id": payload.get("responseId"),
                                "finish_reason": finish}
    metadata[DETAILS_METADATA_KEY] = ResponseDetails(
        finish_reason=_FINISH_NAMES.get(finish, finish) if isinstance(finish, str) else None,
        refusal=None, tool_calls=tuple(calls),
        logprobs=None,
    )
    return "".join(texts), usage, metadata


def _counts(usage: TokenUsage) -> dict[str, int] | None:
    counts = {key: int(value) for key, value in usage.items() if isinstance(value, int)}
    return counts or None


def _usage(meta: Any) -> TokenUsage:
    """Gemini's usage in our words: every prompt token is input (cached ones included); thoughts are
    output (billed as output) and reported again as reasoning."""
    if not isinstance(meta, Mapping):
        return TokenUsage()

    def count(name: str) -> int:
        value = meta.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

    prompt, cached = count("promptTokenCount"), count("cachedContentTokenCount")
    thoughts = count("thoughtsTokenCount")
    output = count("candidatesTokenCount") + thoughts
    total = count("totalTokenCount") or prompt + output + count("toolUsePromptTokenCount")
    return TokenUsage(input_tokens=prompt, output_tokens=output, total_tokens=total,
                      cached_input_tokens=cached, reasoning_tokens=thoughts)
