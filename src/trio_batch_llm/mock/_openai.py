"""The mock's OpenAI dialect: chat completions and responses, written from OpenAI's documented format.

Routes ``POST /v1/chat/completions`` and ``POST /v1/responses`` (also without
``/v1``); the key is ``Authorization: Bearer KEY``. Structured output is
``response_format`` ``json_schema`` (chat) or ``text.format`` (responses), and a
required tool choice (or one naming a function, or ``[[tool_call]]``) is
answered with a function call. Errors are ``{"error": {"message", "type",
"param", "code"}}``; waits go in ``Retry-After`` / ``retry-after-ms``; limits in
``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` (resets in Go's
duration notation).

OpenRouter speaks this dialect too, with its own error bodies (:func:`openrouter_error_payload`):
``[[error_in_200:429]]`` answers HTTP 200 whose body is ``{"error": {"code": 429, ...}}`` (an
error met once the model started), and ``[[no_provider]]`` (or ``[[no_provider:503]]``) a 502
whose ``metadata.reason`` is ``no_provider_available``.

The payload builders duplicate, on purpose, what the library's OpenAI client
parses: the mock imports nothing from ``_strategies``, so a wire mistake in a
client is not made again here, where no test could see it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final, Literal, final

from .._values._openai_text import openai_prompt_text
from .._values._schema_check import response_schema_problem
from ._dialect import Answer, LimitState, Problem, Route, chosen_tool, tool_schema_refusal, tool_schemas
from ._limits import go_duration
from ._structured import answer_json

__all__ = ["Api", "OpenAIDialect", "openai_error_payload", "openrouter_error_payload"]

Api = Literal["chat", "responses"]
_PATHS: Final[dict[str, Api]] = {
    "/v1/chat/completions": "chat", "/chat/completions": "chat",
    "/v1/responses": "responses", "/responses": "responses",
}


def openai_error_payload(message: str, *, kind: str, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error body."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def openrouter_error_payload(status: int, message: str, code: str | None) -> dict[str, Any]:
    """OpenRouter's error body, ``{"error": {"code": <number>, "message", "metadata"}}`` (its docs' shape):
    for a 200 that carries an error met once the model started, or a 502 when no provider could serve."""
    reason = "no_provider_available" if code == "no_provider_available" else "provider_error"
    metadata = {"provider_name": "MockProvider", "reason": reason,
                "raw": json.dumps({"error": {"code": status, "message": message}})}
    return {"error": {"code": status, "message": message, "metadata": metadata}, "user_id": "user_mock"}


def _format_of(api: str, payload: Mapping[str, Any]) -> Mapping[str, Any] | None:
    if api == "chat":
        fmt = payload.get("response_format")
        if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
            inner = fmt.get("json_schema")
            return inner if isinstance(inner, Mapping) else None
        return None
    text = payload.get("text")
    fmt = text.get("format") if isinstance(text, Mapping) else None
    return fmt if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema" else None


@final
class OpenAIDialect:
    """OpenAI's chat completions and responses (see the module docstring)."""

    name = "openai"
    base_path = "/v1"
    structured_tools = False

    def __init__(self, *_: object) -> None:
        pass  # stateless; made per app like every dialect

    def route(self, method: str, path: str) -> Route | None:
        api = _PATHS.get(path)
        return Route(self, api) if api is not None and method == "POST" else None

    def credential(self, headers: Mapping[str, str], query: str) -> str | None:
        value = headers.get("authorization")
        return value.removeprefix("Bearer ") if value is not None and value.startswith("Bearer ") else None

    def check(self, route: Route, headers: Mapping[str, str], payload: Any) -> Problem | None:
        if self.prompt_text(route, payload) is None or not isinstance(payload, dict):
            return Problem(400, "the body needs messages (chat) or input (responses)")
        return None

    def prompt_text(self, route: Route, payload: Any) -> str | None:
        return openai_prompt_text(route.operation, payload)

    def requested_schema(self, route: Route, payload: Mapping[str, Any]) -> dict[str, Any] | None:
        fmt = _format_of(route.operation, payload)
        if fmt is None:
            return None
        schema = fmt.get("schema")
        return dict(schema) if isinstance(schema, Mapping) else {}

    def _functions(self, route: Route, payload: Mapping[str, Any]) -> dict[str, Any]:
        tools = payload.get("tools")
        found: dict[str, Any] = {}
        for tool in tools if isinstance(tools, list) else ():
            spec = tool.get("function") if route.operation == "chat" and isinstance(tool, Mapping) else tool
            if isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
                found[spec["name"]] = spec.get("parameters", {}) if "parameters" in spec else None
        return found

    def requested_tool(self, route: Route, payload: Mapping[str, Any],
                       prompt: str) -> tuple[str, dict[str, Any]] | None:
        functions = tool_schemas(self._functions(route, payload))
        if not functions:
            return None
        choice = payload.get("tool_choice")
        named = None
        if isinstance(choice, Mapping):
            function = choice.get("function")
            named = function.get("name") if route.operation == "chat" and isinstance(function, Mapping) \
                else choice.get("name")
        return chosen_tool(functions, named if isinstance(named, str) else None, forced=choice == "required",
                           prompt=prompt)

    def schema_refusal(self, route: Route, payload: Mapping[str, Any]) -> str | None:
        schema = self.requested_schema(route, payload)
        if schema is not None:
            problem = response_schema_problem(schema)
            if problem is not None:
                fmt = _format_of(route.operation, payload)
                name = fmt.get("name") if fmt is not None else None
                return f"Invalid schema for response_format {name!r}: the schema {problem} (mock)"
        return tool_schema_refusal(
            self._functions(route, payload),
            lambda name, problem: f"Invalid schema for function {name!r}: the parameters {problem} (mock)",
        )

    def success_body(self, route: Route, payload: Mapping[str, Any], prompt: str,
                     answer: Answer) -> dict[str, Any]:
        if route.operation == "chat":
            body = _chat_body(answer)
            asked = bool(payload.get("logprobs"))
        else:
            body = _responses_body(answer)
            asked = "message.output_text.logprobs" in (payload.get("include") or [])
        if asked and answer.text and answer.tool_call is None and answer.refusal is None:
            # Deterministic: one entry per word of the answer, in the provider's shape for each API.
            entries = [{"token": word, "logprob": -0.01 * (index + 1), "bytes": list(word.encode()),
                        "top_logprobs": []} for index, word in enumerate(answer.text.split())]
            if route.operation == "chat":
                body["choices"][0]["logprobs"] = {"content": entries, "refusal": None}
            else:
                body["output"][0]["content"][0]["logprobs"] = entries
        return body

    def usage_of(self, body: Mapping[str, Any]) -> tuple[int, int]:
        usage = body["usage"]
        return (int(usage.get("prompt_tokens", usage.get("input_tokens", 0))),
                int(usage.get("completion_tokens", usage.get("output_tokens", 0))))

    def error_text(self, status: int, code: str | None) -> tuple[str, str, str | None]:
        if code == "no_provider_available":
            return ("No available provider could serve this model: no_provider_available (mock)",
                    "server_error", code)
        if code == "spend_limit":
            return ("You exceeded your current quota, please check your plan and billing details (mock)",
                    "insufficient_quota", "insufficient_quota")
        if status == 429:
            return "Rate limit reached (mock)", "requests", code or "rate_limit_exceeded"
        if status >= 500:
            return "The server had an error while processing your request (mock)", "server_error", code
        if code == "context_length_exceeded":
            return ("This model's maximum context length is 128 tokens; the messages are longer (mock)",
                    "invalid_request_error", code)
        if code == "content_policy_violation":
            return "This request was rejected by the content policy (mock)", "invalid_request_error", code
        if code == "invalid_json_schema":
            return ("Invalid schema for response_format: the mock refuses this schema, as a provider refuses "
                    "one it does not support (mock)", "invalid_request_error", code)
        named = {401: "invalid_api_key", 402: "insufficient_quota", 403: "permission_denied",
                 404: "model_not_found"}
        return f"mock error {status}", "invalid_request_error", code or named.get(status)

    def error_body(self, status: int, message: str, kind: str, code: str | None, *,
                   retry_after: float | None, request_id: str) -> dict[str, Any]:
        if code in ("error_in_200", "no_provider_available"):
            return openrouter_error_payload(status, message, code)
        return openai_error_payload(message, kind=kind, code=code)

    def retry_headers(self, retry_after: float, hints: tuple[str, ...]) -> list[tuple[bytes, bytes]]:
        headers: list[tuple[bytes, bytes]] = []
        if "retry-after" in hints:
            headers.append((b"retry-after", str(math.ceil(retry_after)).encode()))
            headers.append((b"retry-after-ms", str(math.ceil(retry_after * 1000)).encode()))
        if "llm_provider-retry-after" in hints:
            # LiteLLM's proxy forwards a provider's headers under this prefix; Retry-After is whole seconds.
            headers.append((b"llm_provider-retry-after", str(math.ceil(retry_after)).encode()))
        return headers

    def ratelimit_headers(self, limits: list[LimitState], wall: float) -> list[tuple[bytes, bytes]]:
        out: list[tuple[bytes, bytes]] = []
        for state in limits:
            if state.kind not in ("requests", "tokens"):  # OpenAI tells no input/output split
                continue
            out += [
                (f"x-ratelimit-limit-{state.kind}".encode(), str(state.limit).encode()),
                (f"x-ratelimit-remaining-{state.kind}".encode(), str(state.remaining).encode()),
                (f"x-ratelimit-reset-{state.kind}".encode(), go_duration(state.empty_in).encode()),
            ]
        return out

    def response_headers(self, request_id: str) -> list[tuple[bytes, bytes]]:
        return [(b"x-request-id", request_id.encode())]


def _chat_body(answer: Answer) -> dict[str, Any]:
    call, refusal = answer.tool_call, answer.refusal
    message: dict[str, Any] = {"role": "assistant",
                               "content": answer.text if call is None and refusal is None else None,
                               "refusal": refusal}
    if call is not None:
        message["tool_calls"] = [{"id": "call_" + answer.call_digest, "type": "function",
                                  "function": {"name": call[0], "arguments": answer_json(call[1])}}]
    return {
        "id": "chatcmpl-" + answer.digest,
        "object": "chat.completion",
        "created": answer.created,
        "model": answer.model,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": "tool_calls" if call is not None else "stop"}],
        "usage": {
            "prompt_tokens": answer.prompt_tokens,
            "completion_tokens": answer.completion_tokens,
            "total_tokens": answer.prompt_tokens + answer.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0},
        },
        "system_fingerprint": "mock",
    }


def _responses_body(answer: Answer) -> dict[str, Any]:
    call, refusal = answer.tool_call, answer.refusal
    output: list[dict[str, Any]]
    if call is not None:
        output = [{"type": "function_call", "id": "fc_" + answer.digest,
                   "call_id": "call_" + answer.call_digest, "name": call[0],
                   "arguments": answer_json(call[1]), "status": "completed"}]
    else:
        part = {"type": "refusal", "refusal": refusal} if refusal is not None else \
            {"type": "output_text", "text": answer.text, "annotations": []}
        output = [{"type": "message", "id": "msg_" + answer.digest, "status": "completed",
                   "role": "assistant", "content": [part]}]
    return {
        "id": "resp_" + answer.digest,
        "object": "response",
        "created_at": answer.created,
        "status": "completed",
        "model": answer.model,
        "output": output,
        "usage": {
            "input_tokens": answer.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": answer.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": answer.prompt_tokens + answer.completion_tokens,
        },
        "error": None,
        "incomplete_details": None,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }
