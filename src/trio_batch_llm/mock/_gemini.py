"""The mock's Gemini ``generateContent`` dialect: a request read and checked, and the answer built.

Written from Google's REST reference (``GenerateContentRequest``,
``GenerateContentResponse``), not from any client of ours, so a client's wire
mistake fails a test. Proto JSON accepts a field by its lowerCamel name or its
proto (snake_case) name; an unknown field is refused with Google's 400
(``Invalid JSON payload received. Unknown name "x" at 'generation_config'``).

- The prompt (what fault markers are read from) is the text of
  ``systemInstruction`` and of every ``contents[].parts[].text``; its tokens are
  the mock tokenizer's over that text, plus 258 per ``inlineData``/``fileData``
  part (Gemini's count for an image).
- Structured output: ``generationConfig.responseMimeType`` ``application/json``
  with ``responseJsonSchema`` (JSON Schema) or ``responseSchema`` (Google's
  OpenAPI subset: upper- or lower-case ``type``, ``nullable``, int64 counts as
  strings) is answered with JSON that follows it, with the usual markers.
- Function calling: ``toolConfig.functionCallingConfig.mode`` ``ANY`` (or the
  ``[[tool_call]]`` marker) answers a ``functionCall`` part of the first allowed
  function, with ``args`` following its ``parameters``/``parametersJsonSchema``.
- ``thinkingConfig`` with a non-zero ``thinkingBudget`` (or a ``thinkingLevel``)
  reports ``thoughtsTokenCount`` (as many as the answer, at most the budget), and
  a thought part with ``includeThoughts``.
- ``candidateCount`` answers that many candidates; ``maxOutputTokens`` below the
  answer's size cuts it with ``finishReason`` ``MAX_TOKENS``; a ``stopSequences``
  entry found in the answer ends it there.

Nothing here sends or reads a clock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from ._state import mock_token_count
from ._structured import answer_json

__all__ = [
    "MEDIA_TOKENS",
    "blocked_answer",
    "content_problem",
    "fields_of",
    "model_path",
    "prompt_text",
    "prompt_tokens",
    "request_problem",
    "requested_function",
    "requested_schema",
    "shape_answer",
    "unknown_field",
]

MEDIA_TOKENS: Final = 258
"""Tokens of one ``inlineData``/``fileData`` part (Gemini counts an image as 258)."""

_TOP: Final = frozenset({
    "model", "contents", "tools", "toolConfig", "safetySettings", "systemInstruction", "generationConfig",
    "cachedContent", "labels", "serviceTier", "store",
})
_GENERATION: Final = frozenset({
    "stopSequences", "responseMimeType", "responseSchema", "responseJsonSchema", "responseModalities",
    "candidateCount", "maxOutputTokens", "temperature", "topP", "topK", "seed", "presencePenalty",
    "frequencyPenalty", "responseLogprobs", "logprobs", "enableEnhancedCivicAnswers", "speechConfig",
    "thinkingConfig", "imageConfig", "mediaResolution", "audioTimestamp", "routingConfig",
})
_THINKING: Final = frozenset({"includeThoughts", "thinkingBudget", "thinkingLevel"})
_CONTENT: Final = frozenset({"role", "parts"})
_PART: Final = frozenset({
    "text", "inlineData", "fileData", "functionCall", "functionResponse", "executableCode",
    "codeExecutionResult", "thought", "thoughtSignature", "videoMetadata", "mediaResolution",
    "partMetadata", "toolCall", "toolResponse",
})
_ROUTE: Final = re.compile(r"/v1(?:beta|alpha)?/models/([^/:]+):(\w+)")


def model_path(path: str) -> tuple[str, str] | None:
    """``(model, method)`` of ``/v1beta/models/{model}:{method}`` (also ``/v1``), else ``None``."""
    match = _ROUTE.fullmatch(path)
    return (match.group(1), match.group(2)) if match else None


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def fields_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    """One level of a proto JSON object with every key in its lowerCamel spelling."""
    return {_camel(key): value for key, value in obj.items()}


def unknown_field(obj: Mapping[str, Any], known: frozenset[str], where: str) -> str | None:
    for key in obj:
        if _camel(key) not in known:
            at = f" at '{where}'" if where else ""
            return f'Invalid JSON payload received. Unknown name "{key}"{at}: Cannot find field.'
    return None


def request_problem(payload: Any) -> str | None:
    """The message of the 400 Google sends for this ``GenerateContentRequest``, or ``None`` if it is fine."""
    if not isinstance(payload, Mapping):
        return "Invalid JSON payload received. Expected an object."
    problem = unknown_field(payload, _TOP, "")
    if problem is not None:
        return problem
    top = fields_of(payload)
    contents = top.get("contents")
    if not isinstance(contents, list) or not contents:
        return "* GenerateContentRequest.contents: contents is not specified\n"
    for index, content in enumerate([top.get("systemInstruction"), *contents]):
        if content is None and index == 0:
            continue
        problem = content_problem(content, "contents" if index else "system_instruction")
        if problem is not None:
            return problem
    config = top.get("generationConfig")
    if config is not None:
        if not isinstance(config, Mapping):
            return "Invalid value at 'generation_config': expected an object."
        problem = unknown_field(config, _GENERATION, "generation_config")
        thinking = fields_of(config).get("thinkingConfig")
        if problem is None and isinstance(thinking, Mapping):
            problem = unknown_field(thinking, _THINKING, "generation_config.thinking_config")
        if problem is None:
            problem = _schema_problem(fields_of(config))
    return problem


def content_problem(content: Any, where: str) -> str | None:
    if not isinstance(content, Mapping):
        return f"Invalid value at '{where}': expected a Content object."
    problem = unknown_field(content, _CONTENT, where)
    if problem is not None:
        return problem
    fields = fields_of(content)
    role = fields.get("role")
    if where == "contents" and role not in (None, "user", "model", "function"):
        return f"Please use a valid role: user, model. (got {role!r})"
    parts = fields.get("parts")
    if not isinstance(parts, list) or not parts:
        return f"* GenerateContentRequest.{where}.parts: contents.parts must not be empty.\n"
    for part in parts:
        if not isinstance(part, Mapping):
            return f"Invalid value at '{where}.parts': expected a Part object."
        problem = unknown_field(part, _PART, f"{where}.parts[0]")
        if problem is not None:
            return problem
        data = fields_of(part).get("inlineData")
        if data is not None and not (isinstance(data, Mapping) and fields_of(data).get("mimeType")
                                     and isinstance(fields_of(data).get("data"), str)):
            return f"* GenerateContentRequest.{where}.parts.inline_data: needs mime_type and base64 data\n"
    return None


def _schema_problem(config: Mapping[str, Any]) -> str | None:
    if "responseSchema" in config and "responseJsonSchema" in config:
        return ("* GenerateContentRequest.generation_config.response_schema: response_schema and "
                "response_json_schema cannot both be set.\n")
    has_schema = "responseSchema" in config or "responseJsonSchema" in config
    mime = config.get("responseMimeType")
    if has_schema and mime not in ("application/json", "text/x.enum"):
        return ("* GenerateContentRequest.generation_config.response_mime_type: "
                "response_mime_type must be application/json (or text/x.enum) to use response_schema.\n")
    return None


def _contents(payload: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    top = fields_of(payload)
    found = [top["systemInstruction"]] if isinstance(top.get("systemInstruction"), Mapping) else []
    contents = top.get("contents")
    return found + [c for c in contents if isinstance(c, Mapping)] if isinstance(contents, list) else found


def _parts(content: Mapping[str, Any]) -> list[dict[str, Any]]:
    parts = fields_of(content).get("parts")
    return [fields_of(p) for p in parts if isinstance(p, Mapping)] if isinstance(parts, list) else []


def prompt_text(payload: Mapping[str, Any]) -> str:
    """The text of the request (system instruction first), one line per text part."""
    return "\n".join(part["text"] for content in _contents(payload) for part in _parts(content)
                     if isinstance(part.get("text"), str))


def prompt_tokens(payload: Mapping[str, Any]) -> int:
    """The request's own input tokens (a cache's are added apart): its text, and 258 per media part."""
    media = sum(1 for content in _contents(payload) for part in _parts(content)
                if "inlineData" in part or "fileData" in part)
    return mock_token_count(prompt_text(payload)) + MEDIA_TOKENS * media


def _config(payload: Mapping[str, Any]) -> dict[str, Any]:
    config = fields_of(payload).get("generationConfig")
    return fields_of(config) if isinstance(config, Mapping) else {}


def requested_schema(payload: Mapping[str, Any]) -> dict[str, Any] | None:
    """The JSON Schema the answer must follow (``responseSchema`` translated), or ``None``."""
    config = _config(payload)
    if config.get("responseMimeType") != "application/json":
        return None
    schema = config.get("responseJsonSchema")
    if isinstance(schema, Mapping):
        return dict(schema)
    schema = config.get("responseSchema")
    return openapi_to_json_schema(schema) if isinstance(schema, Mapping) else {}


def openapi_to_json_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Google's OpenAPI ``Schema`` (``"OBJECT"``, ``nullable``, counts as strings) as JSON Schema."""
    fields = fields_of(schema)
    out: dict[str, Any] = {}
    kind = fields.get("type")
    if isinstance(kind, str) and kind.upper() != "TYPE_UNSPECIFIED":
        out["type"] = [kind.lower(), "null"] if fields.get("nullable") else kind.lower()
    for key in ("enum", "required", "format", "description", "minimum", "maximum", "pattern"):
        if key in fields:
            out[key] = fields[key]
    for key in ("minItems", "maxItems", "minLength", "maxLength"):
        if key in fields:
            out[key] = int(fields[key])  # int64 fields arrive as strings in proto JSON
    properties = fields.get("properties")
    if isinstance(properties, Mapping):
        out["properties"] = {name: openapi_to_json_schema(sub) for name, sub in properties.items()
                             if isinstance(sub, Mapping)}
    if isinstance(fields.get("items"), Mapping):
        out["items"] = openapi_to_json_schema(fields["items"])
    if isinstance(fields.get("anyOf"), list):
        out["anyOf"] = [openapi_to_json_schema(s) for s in fields["anyOf"] if isinstance(s, Mapping)]
    return out


def requested_function(payload: Mapping[str, Any], prompt: str) -> tuple[str, dict[str, Any]] | None:
    """``(name, parameters as JSON Schema)`` of the function to call, or ``None`` for text."""
    functions: dict[str, dict[str, Any]] = {}
    tools = fields_of(payload).get("tools")
    for tool in tools if isinstance(tools, list) else ():
        declarations = fields_of(tool).get("functionDeclarations") if isinstance(tool, Mapping) else None
        for spec in declarations if isinstance(declarations, list) else ():
            spec = fields_of(spec) if isinstance(spec, Mapping) else {}
            if isinstance(spec.get("name"), str):
                if isinstance(spec.get("parametersJsonSchema"), Mapping):
                    functions[spec["name"]] = dict(spec["parametersJsonSchema"])
                elif isinstance(spec.get("parameters"), Mapping):
                    functions[spec["name"]] = openapi_to_json_schema(spec["parameters"])
                else:
                    functions[spec["name"]] = {"type": "object", "properties": {}}
    if not functions:
        return None
    tool_config = fields_of(payload).get("toolConfig")
    found = fields_of(tool_config).get("functionCallingConfig") if isinstance(tool_config, Mapping) else None
    calling = fields_of(found) if isinstance(found, Mapping) else {}
    if calling.get("mode") == "ANY" or "[[tool_call]]" in prompt:
        allowed = [n for n in calling.get("allowedFunctionNames") or () if n in functions]
        name = allowed[0] if allowed else next(iter(functions))
        return name, functions[name]
    return None


def shape_answer(payload: Mapping[str, Any], *, model: str, text: str, call: tuple[str, Any] | None,
                 response_id: str, cached_tokens: int = 0) -> dict[str, Any]:
    """The 200 ``GenerateContentResponse`` carrying ``text`` (or the function ``call``: name, args).

    ``cached_tokens`` are the tokens of the cache the request named: added to
    ``promptTokenCount`` and reported as ``cachedContentTokenCount``.
    """
    part: dict[str, Any]
    finish = "STOP"
    if call is not None:
        part = {"functionCall": {"name": call[0], "args": call[1]}}
        output = answer_json(call[1])
    else:
        text, finish = _limited(text, _config(payload))
        part, output = {"text": text}, text
    generation = _config(payload)
    count = generation.get("candidateCount")
    count = count if isinstance(count, int) and count > 1 else 1
    output_tokens = mock_token_count(output) * count
    thoughts = _thoughts(generation, output_tokens)
    thinking = generation.get("thinkingConfig")
    shown = isinstance(thinking, Mapping) and bool(thoughts and fields_of(thinking).get("includeThoughts"))
    parts: list[dict[str, Any]] = [{"text": "Thinking it over (mock).", "thought": True}] if shown else []
    candidates = [{"content": {"role": "model", "parts": [*parts, dict(part)]}, "finishReason": finish,
                   "index": i} for i in range(count)]
    own = prompt_tokens(payload)
    usage: dict[str, Any] = {
        "promptTokenCount": own + cached_tokens, "candidatesTokenCount": output_tokens,
        "totalTokenCount": own + cached_tokens + output_tokens + thoughts,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": own + cached_tokens}],
    }
    if cached_tokens:
        usage["cachedContentTokenCount"] = cached_tokens
        usage["cacheTokensDetails"] = [{"modality": "TEXT", "tokenCount": cached_tokens}]
    if thoughts:
        usage["thoughtsTokenCount"] = thoughts
    return {"candidates": candidates, "usageMetadata": usage, "modelVersion": model.removeprefix("models/"),
            "responseId": response_id}


def blocked_answer(payload: Mapping[str, Any], *, model: str, response_id: str) -> dict[str, Any]:
    """The 200 Google sends when the prompt itself is blocked: ``promptFeedback``, no candidates."""
    own = prompt_tokens(payload)
    return {
        "promptFeedback": {"blockReason": "SAFETY", "safetyRatings": [
            {"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH", "blocked": True}]},
        "usageMetadata": {"promptTokenCount": own, "totalTokenCount": own},
        "modelVersion": model.removeprefix("models/"), "responseId": response_id,
    }


def _limited(text: str, generation: Mapping[str, Any]) -> tuple[str, str]:
    """The text cut at a stop sequence (``STOP``) or at ``maxOutputTokens`` (``MAX_TOKENS``)."""
    stops = generation.get("stopSequences")
    for stop in stops if isinstance(stops, list) else ():
        if isinstance(stop, str) and stop and stop in text:
            text = text[: text.index(stop)]
    limit = generation.get("maxOutputTokens")
    if isinstance(limit, int) and limit > 0 and mock_token_count(text) > limit:
        return text[: 4 * limit], "MAX_TOKENS"
    return text, "STOP"


def _thoughts(generation: Mapping[str, Any], output_tokens: int) -> int:
    thinking = generation.get("thinkingConfig")
    if not isinstance(thinking, Mapping):
        return 0
    fields = fields_of(thinking)
    budget = fields.get("thinkingBudget")
    if isinstance(budget, int) and budget > 0:
        return min(budget, output_tokens)
    if budget == -1 or (budget is None and fields.get("thinkingLevel")):
        return output_tokens  # dynamic thinking: as much as the answer
    return 0
