"""The OpenAI wire format, both directions, without I/O: request bodies, response bodies, payloads.

One table for everyone who speaks it: :class:`OpenAICompatibleStrategy` builds
request bodies and parses responses with it, :class:`OpenAIStrategy` parses the
SDK's responses with the same :func:`parse_response_body`, the Batch API writes
its request lines from the same bodies, and the mock server builds its
responses with the ``*_payload`` functions, so a change to the format is made
once and round-trip tested. Error answers are :mod:`._wire_errors`; keys are
:mod:`._keys`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from ..._values._categories import ErrorCategory
from ..._values._details import DETAILS_METADATA_KEY, ResponseDetails, ToolCall
from ..._values._errors import ConfigurationError, ProviderError
from ..._values._results import TokenUsage
from ._wire_errors import error_from_status, error_in_body
from ._wire_requests import RESPONSES_REFUSED, build_request_body, merge_params, wire_body

__all__ = [
    "API_PATHS",
    "RESPONSES_REFUSED",
    "Api",
    "build_request_body",
    "chat_completion_payload",
    "check_api",
    "merge_params",
    "wire_body",
    "decode_json",
    "error_payload",
    "parse_response_body",
    "responses_payload",
]

Api = Literal["chat", "responses"]
API_PATHS: dict[str, str] = {"chat": "/chat/completions", "responses": "/responses"}


def check_api(api: str) -> Api:
    if api not in API_PATHS:
        raise ConfigurationError("api", api, 'must be "chat" or "responses"')
    return "chat" if api == "chat" else "responses"


# -- responses --------------------------------------------------------------------------------


def decode_json(content: bytes) -> Any:
    try:
        return json.loads(content)
    except ValueError as exc:
        raise ProviderError(
            f"response body is not valid JSON ({len(content)} bytes)", category=ErrorCategory.PARSE
        ) from exc


def parse_response_body(api: Api, payload: Any) -> tuple[str, TokenUsage | None, dict[str, Any]]:
    """``(text, usage, metadata)`` of a successful response; :class:`ProviderError` (PARSE) if malformed."""
    if not isinstance(payload, Mapping):
        raise _parse_error("response body is not a JSON object")
    in_body = error_in_body(payload)
    if in_body is not None:
        raise in_body
    if api == "chat":
        return _parse_chat(payload)
    return _parse_responses(payload)


def _parse_chat(payload: Mapping[str, Any]) -> tuple[str, TokenUsage | None, dict[str, Any]]:
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise _parse_error("response has no choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, Mapping):
        raise _parse_error("first choice has no message")
    finish_reason = choice.get("finish_reason")
    if finish_reason == "content_filter":
        raise ProviderError("the provider's content filter stopped the answer",
                            category=ErrorCategory.CONTENT_POLICY)
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise _parse_error("message content is not a string")
    metadata: dict[str, Any] = {"id": payload.get("id"), "model": payload.get("model"),
                                "finish_reason": finish_reason}
    refusal = message.get("refusal") if isinstance(message.get("refusal"), str) else None
    if refusal:
        metadata["refusal"] = refusal
    calls = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            calls.append(ToolCall(str(call.get("id", "")), str(function.get("name", "")),
                                  str(function.get("arguments", ""))))
    logprobs = choice.get("logprobs")
    content_logprobs = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    metadata[DETAILS_METADATA_KEY] = ResponseDetails(
        finish_reason=finish_reason if isinstance(finish_reason, str) else None,
        refusal=refusal or None,
        tool_calls=tuple(calls),
        logprobs=content_logprobs if isinstance(content_logprobs, list) else None,
    )
    usage = _usage(payload.get("usage"), "prompt_tokens", "completion_tokens", "prompt_tokens_details",
                   "completion_tokens_details")
    return content or "", usage, metadata


def _parse_responses(payload: Mapping[str, Any]) -> tuple[str, TokenUsage | None, dict[str, Any]]:
    output = payload.get("output")
    if not isinstance(output, list):
        raise _parse_error("response has no output list")
    status = payload.get("status")
    incomplete = payload.get("incomplete_details")
    reason = incomplete.get("reason") if isinstance(incomplete, Mapping) else None
    if status == "incomplete" and reason == "content_filter":
        raise ProviderError("the provider's content filter stopped the answer",
                            category=ErrorCategory.CONTENT_POLICY)
    if status == "failed":
        error = payload.get("error") if isinstance(payload.get("error"), Mapping) else {}
        raise error_from_status(500, {}, {"error": error})
    texts: list[str] = []
    refusals: list[str] = []
    calls: list[ToolCall] = []
    logprobs: list[Any] = []
    for item in output:
        if not isinstance(item, Mapping):
            continue
        if item.get("type") == "message":
            for part in item.get("content") or ():
                if isinstance(part, Mapping) and part.get("type") == "output_text":
                    texts.append(str(part.get("text", "")))
                    if isinstance(part.get("logprobs"), list):
                        logprobs.extend(part["logprobs"])
                elif isinstance(part, Mapping) and part.get("type") == "refusal":
                    refusals.append(str(part.get("refusal", "")))
        elif item.get("type") == "function_call":
            calls.append(ToolCall(str(item.get("call_id") or item.get("id") or ""), str(item.get("name", "")),
                                  str(item.get("arguments", ""))))
    metadata: dict[str, Any] = {"id": payload.get("id"), "model": payload.get("model"), "status": status}
    if refusals:
        metadata["refusal"] = "".join(refusals)
    if status == "incomplete":
        finish = "length" if reason == "max_output_tokens" else reason
    elif calls:
        finish = "tool_calls"
    else:
        finish = "stop" if status == "completed" else status
    metadata[DETAILS_METADATA_KEY] = ResponseDetails(
        finish_reason=finish if isinstance(finish, str) else None,
        refusal="".join(refusals) or None,
        tool_calls=tuple(calls),
        logprobs=logprobs or None,
    )
    usage = _usage(payload.get("usage"), "input_tokens", "output_tokens", "input_tokens_details",
                   "output_tokens_details")
    return "".join(texts), usage, metadata


def _usage(raw: Any, input_key: str, output_key: str, details_key: str, output_details_key: str
           ) -> TokenUsage | None:
    if not isinstance(raw, Mapping):
        return None
    usage: TokenUsage = {}
    for source, target in ((input_key, "input_tokens"), (output_key, "output_tokens"),
                           ("total_tokens", "total_tokens")):
        value = raw.get(source)
        if _is_count(value):
            usage[target] = value  # type: ignore[literal-required]
    details = raw.get(details_key)
    if isinstance(details, Mapping) and _is_count(details.get("cached_tokens")):
        usage["cached_input_tokens"] = details["cached_tokens"]
    out_details = raw.get(output_details_key)
    if isinstance(out_details, Mapping) and _is_count(out_details.get("reasoning_tokens")):
        usage["reasoning_tokens"] = out_details["reasoning_tokens"]
    return usage or None


def _is_count(value: object) -> bool:
    """A count a provider may report: an ``int`` (not a ``bool``) >= 0; anything else is unknown.

    A negative or boolean count is the provider's glitch: kept, it would fail the strategy's own
    answer at the engine's check of token usage (a LOGIC_ERROR), blaming our code for it."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parse_error(what: str) -> ProviderError:
    return ProviderError(f"malformed response: {what}", category=ErrorCategory.PARSE)


# -- server side: payloads the mock server sends ----------------------------------------------


def chat_completion_payload(
    *, response_id: str, model: str, text: str, prompt_tokens: int, completion_tokens: int, created: int,
    tool_call: tuple[str, str, str] | None = None, refusal: str | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text if tool_call is None and refusal is None
                               else None, "refusal": refusal}
    if tool_call is not None:
        call_id, name, arguments = tool_call
        message["tool_calls"] = [{"id": call_id, "type": "function",
                                  "function": {"name": name, "arguments": arguments}}]
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": message,
            "finish_reason": "tool_calls" if tool_call is not None else "stop",
            "logprobs": None,
        }],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0},
        },
        "system_fingerprint": "mock",
    }


def responses_payload(
    *, response_id: str, model: str, text: str, prompt_tokens: int, completion_tokens: int, created: int,
    tool_call: tuple[str, str, str] | None = None, refusal: str | None = None,
) -> dict[str, Any]:
    output: list[dict[str, Any]]
    if tool_call is not None:
        call_id, name, arguments = tool_call
        output = [{"type": "function_call", "id": "fc_" + response_id.removeprefix("resp_"),
                   "call_id": call_id, "name": name, "arguments": arguments, "status": "completed"}]
    else:
        part = {"type": "refusal", "refusal": refusal} if refusal is not None else \
            {"type": "output_text", "text": text, "annotations": []}
        output = [{
            "type": "message",
            "id": "msg_" + response_id.removeprefix("resp_"),
            "status": "completed",
            "role": "assistant",
            "content": [part],
        }]
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": "completed",
        "model": model,
        "output": output,
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "error": None,
        "incomplete_details": None,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


def error_payload(message: str, *, kind: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
