"""The mock's Anthropic dialect: ``POST /v1/messages``, written from Anthropic's documented format.

- Route ``POST /v1/messages`` (a client's ``base_url`` is the server root); the key
  is ``x-api-key``; ``anthropic-version`` is required, and the body is checked as
  Anthropic checks it (:mod:`._anthropic_check`: a 400 naming the field).
- The prompt (what markers are read from) is the system text and every text block
  of the messages, joined by newlines.
- The answer is ``{"id": "msg_…", "type": "message", "role": "assistant", "model",
  "content": [...], "stop_reason", "stop_sequence", "usage"}``; ``stop_sequences``
  end the text at the first one found (``stop_reason`` ``stop_sequence``) and
  ``max_tokens`` caps it (``max_tokens``).
- Structured output: a forced tool (``tool_choice`` ``{"type": "tool", "name"}`` or
  ``{"type": "any"}``, or ``[[tool_call]]`` with tools) is answered with a
  ``tool_use`` block whose ``input`` follows the tool's ``input_schema``
  (``stop_reason`` ``tool_use``); native JSON output (``output_config.format``, or
  the beta's ``output_format``, ``{"type": "json_schema", "schema"}``) with a text
  block of JSON. The content markers (``[[schema_violation]]``, ``[[refusal]]``…)
  break either; a refusal is ``stop_reason`` ``refusal``.
- Prompt caching: :mod:`._anthropic_cache` (a top-level ``cache_control`` marks the last
  block); ``input_tokens`` excludes the tokens
  written to and read from the cache, as Anthropic counts them.
- Errors: ``{"type": "error", "error": {"type", "message"}, "request_id"}`` with
  the type Anthropic gives each status (429 ``rate_limit_error``, 529
  ``overloaded_error``, ...); the spend-limit refusal is a 429 ``rate_limit_error``
  whose ``error.details.error_code`` is ``enforced_spend_limit_reached`` (the form
  the official SDK 2.x reads into ``error_code``), sent without a wait.
  Waits go in ``retry-after`` (whole seconds); every answer has a ``request-id``.
- Rate limits: ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,
  remaining,reset}`` from the server's own limits (``rpm_limit``, ``tpm_limit``,
  ``input_tpm_limit``, ``output_tpm_limit``), the reset an RFC 3339 time on the wall clock.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Mapping
from typing import Any, Final, final

from .._values._schema_check import response_schema_problem
from ._anthropic_cache import PromptCache
from ._anthropic_check import request_problem
from ._dialect import Answer, LimitState, Problem, Route, chosen_tool, tool_schema_refusal, tool_schemas
from ._state import MockServerConfig, mock_token_count

__all__ = ["AnthropicDialect"]

_ERROR_TYPES: Final = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
                       403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                       429: "rate_limit_error", 500: "api_error", 504: "timeout_error",
                       529: "overloaded_error"}
SPEND_LIMIT_CODE: Final = "enforced_spend_limit_reached"


def _blocks(payload: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``(text, block)`` of every part of the prompt in cache order: tools, system, messages."""
    tools = payload.get("tools") or ()
    out: list[tuple[str, Any]] = [("", tool) for tool in tools if isinstance(tool, Mapping)]
    system = payload.get("system")
    if isinstance(system, str):
        out.append((system, {"type": "text", "text": system}))
    elif isinstance(system, list):
        out += [(str(b.get("text", "")), b) for b in system if isinstance(b, Mapping)]
    for entry in payload.get("messages") or ():
        content = entry.get("content") if isinstance(entry, Mapping) else None
        if isinstance(content, str):
            out.append((content, {"type": "text", "text": content}))
        elif isinstance(content, list):
            out += [(_block_text(b), b) for b in content if isinstance(b, Mapping)]
    control = payload.get("cache_control")
    if isinstance(control, Mapping) and out:  # top-level: marks the last cacheable block
        text, block = out[-1]
        out[-1] = (text, {**block, "cache_control": control})
    return out


def _block_text(block: Mapping[str, Any]) -> str:
    if block.get("type") == "text":
        return str(block.get("text", ""))
    if block.get("type") == "tool_result":  # its content is a string or text blocks
        inner = block.get("content")
        if isinstance(inner, list):
            return "".join(str(b.get("text", "")) for b in inner if isinstance(b, Mapping))
        return inner if isinstance(inner, str) else ""
    return ""


@final
class AnthropicDialect:
    """Anthropic's Messages API (see the module docstring)."""

    name = "anthropic"
    base_path = ""
    structured_tools = True

    def __init__(self, config: MockServerConfig, clock: Callable[[], float]) -> None:
        self._config = config
        self._cache = PromptCache(clock)

    def route(self, method: str, path: str) -> Route | None:
        return Route(self, "messages") if path == "/v1/messages" and method == "POST" else None

    def credential(self, headers: Mapping[str, str], query: str) -> str | None:
        # x-api-key as the API reference shows it; the official SDK 2.x sends Authorization: Bearer.
        bearer = headers.get("authorization", "")
        from_bearer = bearer.removeprefix("Bearer ") if bearer.startswith("Bearer ") else None
        return headers.get("x-api-key") or from_bearer

    def check(self, route: Route, headers: Mapping[str, str], payload: Any) -> Problem | None:
        problem = request_problem(headers, payload)
        return Problem(400, problem) if problem is not None else None

    def prompt_text(self, route: Route, payload: Any) -> str | None:
        if not isinstance(payload, Mapping) or not isinstance(payload.get("messages"), list):
            return None
        return "\n".join(text for text, _ in _blocks(payload) if text)

    def requested_schema(self, route: Route, payload: Mapping[str, Any]) -> dict[str, Any] | None:
        config = payload.get("output_config")
        fmt = config.get("format") if isinstance(config, Mapping) else payload.get("output_format")
        if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
            schema = fmt.get("schema")
            return dict(schema) if isinstance(schema, Mapping) else {}
        return None

    def _tools(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        tools = payload.get("tools")
        return {tool["name"]: tool.get("input_schema") for tool in tools if isinstance(tool, Mapping)
                and isinstance(tool.get("name"), str)} if isinstance(tools, list) else {}

    def requested_tool(self, route: Route, payload: Mapping[str, Any],
                       prompt: str) -> tuple[str, dict[str, Any]] | None:
        tools = tool_schemas(self._tools(payload))
        choice = payload.get("tool_choice")
        kind = choice.get("type") if isinstance(choice, Mapping) else None
        if not tools or kind == "none":
            return None
        named = choice.get("name") if kind == "tool" and isinstance(choice, Mapping) else None
        return chosen_tool(tools, named, forced=kind == "any", prompt=prompt)

    def schema_refusal(self, route: Route, payload: Mapping[str, Any]) -> str | None:
        schema = self.requested_schema(route, payload)
        problem = response_schema_problem(schema) if schema is not None else None
        if problem is not None:
            return f"output_config.format.schema: the schema {problem} (mock)"
        return tool_schema_refusal(
            self._tools(payload),
            lambda name, problem: f"tools: input_schema of tool {name!r}: the schema {problem} (mock)",
        )

    def success_body(self, route: Route, payload: Mapping[str, Any], prompt: str,
                     answer: Answer) -> dict[str, Any]:
        content: list[dict[str, Any]]
        stop_reason, stop_sequence, output_tokens = "end_turn", None, answer.completion_tokens
        if answer.tool_call is not None:
            content = [{"type": "tool_use", "id": "toolu_" + answer.call_digest, "name": answer.tool_call[0],
                        "input": answer.tool_call[1]}]
            stop_reason = "tool_use"
        elif answer.refusal is not None:
            content, stop_reason = [{"type": "text", "text": answer.refusal}], "refusal"
        else:
            text = answer.text
            for stop in payload.get("stop_sequences") or ():
                at = text.find(stop) if stop else -1
                if at >= 0 and (stop_sequence is None or at < text.find(stop_sequence)):
                    stop_sequence = stop
            if stop_sequence is not None:
                text, stop_reason = text[: text.find(stop_sequence)], "stop_sequence"
                output_tokens = mock_token_count(text)
            limit = int(payload["max_tokens"])
            if output_tokens > limit:
                text, stop_reason, stop_sequence, output_tokens = text[: 4 * limit], "max_tokens", None, limit
            content = [{"type": "text", "text": text}]
        cache = self._cache.use(answer.model, _blocks(payload), answer.prompt_tokens)
        return {
            "id": "msg_" + answer.digest,
            "type": "message",
            "role": "assistant",
            "model": answer.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": {
                "input_tokens": max(0, answer.prompt_tokens - cache.read - cache.written),
                "output_tokens": output_tokens,
                "cache_creation_input_tokens": cache.written,
                "cache_read_input_tokens": cache.read,
                "cache_creation": {"ephemeral_5m_input_tokens": cache.written_5m,
                                   "ephemeral_1h_input_tokens": cache.written_1h},
                "service_tier": "standard",
            },
        }

    def cached_input_tokens(self, route: Route, payload: Mapping[str, Any], prompt_tokens: int) -> int:
        """The input tokens this request would read from the prompt cache: they do not count
        against the input-token limit (an optional hook of a dialect, read by the app's limiter)."""
        model = str(payload.get("model") or "mock-model")
        return self._cache.peek(model, _blocks(payload), prompt_tokens)

    def usage_of(self, body: Mapping[str, Any]) -> tuple[int, int]:
        usage = body["usage"]
        every_input = sum(usage[k] for k in ("input_tokens", "cache_creation_input_tokens",
                                             "cache_read_input_tokens"))
        return int(every_input), int(usage["output_tokens"])

    def error_text(self, status: int, code: str | None) -> tuple[str, str, str | None]:
        kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        if code == "spend_limit":
            return ("You have reached your specified workspace API usage limits. You will regain access on "
                    "the first day of next month at 00:00 UTC (mock)", "rate_limit_error", SPEND_LIMIT_CODE)
        if code == "context_length_exceeded":
            return "prompt is too long: 208310 tokens > 200000 maximum (mock)", kind, None
        if code == "content_policy_violation":
            return "Output blocked by content filtering policy (mock)", kind, None
        if code == "invalid_json_schema":
            return "output_config.format.schema: the mock refuses this schema (mock)", kind, None
        messages = {429: "Number of requests has exceeded your rate limit (mock)", 529: "Overloaded (mock)",
                    500: "Internal server error (mock)", 404: "model: not found (mock)",
                    401: "invalid x-api-key (mock)", 413: "Request exceeds the maximum allowed size (mock)"}
        return messages.get(status, f"mock error {status}"), kind, None

    def error_body(self, status: int, message: str, kind: str, code: str | None, *,
                   retry_after: float | None, request_id: str) -> dict[str, Any]:
        error: dict[str, Any] = {"type": _ERROR_TYPES.get(status, "api_error" if status >= 500
                                                          else "invalid_request_error"), "message": message}
        if code == SPEND_LIMIT_CODE:
            error["details"] = {"error_code": SPEND_LIMIT_CODE}
        return {"type": "error", "error": error, "request_id": request_id}

    def retry_headers(self, retry_after: float, hints: tuple[str, ...]) -> list[tuple[bytes, bytes]]:
        seconds = str(math.ceil(retry_after)).encode()
        headers = [(b"retry-after", seconds)] if "retry-after" in hints else []
        if "llm_provider-retry-after" in hints:
            headers.append((b"llm_provider-retry-after", seconds))
        return headers

    def ratelimit_headers(self, limits: list[LimitState], wall: float) -> list[tuple[bytes, bytes]]:
        out: list[tuple[bytes, bytes]] = []
        for state in limits:
            reset = datetime.datetime.fromtimestamp(math.ceil(wall + state.empty_in), datetime.UTC)
            prefix = f"anthropic-ratelimit-{state.kind}-"
            out += [((prefix + "limit").encode(), str(state.limit).encode()),
                    ((prefix + "remaining").encode(), str(state.remaining).encode()),
                    ((prefix + "reset").encode(), reset.strftime("%Y-%m-%dT%H:%M:%SZ").encode())]
        return out

    def response_headers(self, request_id: str) -> list[tuple[bytes, bytes]]:
        return [(b"request-id", request_id.encode())]
