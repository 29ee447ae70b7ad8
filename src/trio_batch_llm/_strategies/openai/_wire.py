"""The OpenAI wire format, both directions, without I/O.

One table for everyone who speaks it: :class:`OpenAICompatibleStrategy` builds
request bodies and parses responses with it (its HTTP errors become
:func:`error_from_status`), :class:`OpenAIStrategy` classifies the SDK's own
status errors with the same :func:`status_category` (without wrapping them), and
the mock server builds its responses with the ``*_payload`` functions, so a
change to the format is made once and round-trip tested.

Nothing here imports an HTTP client: headers arrive as plain mappings.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import math
import os
import re
import time
from collections.abc import Mapping
from typing import Any, Literal, final

from ..._values._categories import ErrorCategory
from ..._values._errors import ConfigurationError, ProviderError
from ..._values._results import TokenUsage
from ..._values._urls import is_openai_api

__all__ = [
    "API_PATHS",
    "Api",
    "Secret",
    "build_request_body",
    "chat_completion_payload",
    "decode_error_body",
    "decode_json",
    "endpoint_api_key",
    "error_from_status",
    "error_payload",
    "parse_response_body",
    "parse_retry_after",
    "prompt_text_of_request",
    "resolve_api_key",
    "responses_payload",
    "status_category",
]

Api = Literal["chat", "responses"]
API_PATHS: dict[str, str] = {"chat": "/chat/completions", "responses": "/responses"}

CONTEXT_LENGTH_CODES = frozenset({"context_length_exceeded", "string_above_max_length"})
CONTENT_POLICY_CODES = frozenset(
    {"content_policy_violation", "content_filter", "moderation_blocked", "invalid_prompt"}
)
INSUFFICIENT_BALANCE_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached"})
_CONTEXT_LENGTH_TEXT = re.compile(
    r"context[ _]length|maximum context|prompt is too long|too many (input )?tokens", re.I
)
_CONTENT_POLICY_TEXT = re.compile(r"content[ _](management )?polic|content[ _]filter|safety system", re.I)
OPENAI_KEY_ENV = "OPENAI_API_KEY"
_MESSAGE_LIMIT = 500
_MIN_SECRET_LENGTH = 8


@final
class Secret:
    """An API key that never shows itself in a repr, a str, a log line or an f-string."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def fingerprint(self) -> str:
        """A short one-way digest: equal keys share quotas and clients without storing the key."""
        return hashlib.sha256(self._value.encode()).hexdigest()[:16]

    def redact(self, text: str) -> str:
        """``text`` without the key. Placeholder keys (``"EMPTY"``, ``"none"``) are too short to hide and
        would mangle ordinary words, so keys under eight characters are left alone."""
        return text.replace(self._value, "<redacted>") if len(self._value) >= _MIN_SECRET_LENGTH else text

    def __repr__(self) -> str:
        return "Secret('<redacted>')"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("an API key is not picklable")


def resolve_api_key(api_key: str | None, *, env: str | None = "OPENAI_API_KEY") -> Secret | None:
    """The key from the argument, else from the environment variable ``env``; ``None`` if neither."""
    if env is not None and (not isinstance(env, str) or not env):
        raise ConfigurationError("api_key_env", env, "must be the name of an environment variable, or None")
    if api_key is None and env:
        api_key = os.environ.get(env) or None
    if api_key is not None and not isinstance(api_key, str):
        raise ConfigurationError("api_key", type(api_key).__name__, "must be a string")
    return Secret(api_key) if api_key else None


def endpoint_api_key(api_key: str | None, api_key_env: str | None, base_url: str) -> Secret | None:
    """The key for ``base_url``: ``api_key``, else the variable ``api_key_env`` (for any endpoint),
    else ``OPENAI_API_KEY`` only when ``base_url`` is OpenAI's own API; ``None`` if none applies.

    A key is sent only where it belongs: the user named this key for this
    endpoint, or it is OpenAI's key and this is OpenAI.
    """
    if api_key is not None or api_key_env is not None:
        return resolve_api_key(api_key, env=api_key_env)
    return resolve_api_key(None, env=OPENAI_KEY_ENV if is_openai_api(base_url) else None)


def check_api(api: str) -> Api:
    if api not in API_PATHS:
        raise ConfigurationError("api", api, 'must be "chat" or "responses"')
    return "chat" if api == "chat" else "responses"


# -- requests ---------------------------------------------------------------------------------


def build_request_body(
    api: Api,
    model: str,
    prompt: str,
    *,
    system_prompt: str | None = None,
    temperature: float | None = None,
    max_output_tokens: int | None = None,
    max_tokens_field: str = "max_tokens",
    extra_body: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON body of one call; ``extra_body`` keys are merged last and win."""
    body: dict[str, Any] = {"model": model}
    if api == "chat":
        messages = [] if system_prompt is None else [{"role": "system", "content": system_prompt}]
        messages.append({"role": "user", "content": prompt})
        body["messages"] = messages
        if max_output_tokens is not None:
            body[max_tokens_field] = max_output_tokens
    else:
        body["input"] = prompt
        if system_prompt is not None:
            body["instructions"] = system_prompt
        if max_output_tokens is not None:
            body["max_output_tokens"] = max_output_tokens
    if temperature is not None:
        body["temperature"] = temperature
    if extra_body:
        body.update(extra_body)
    return body


def prompt_text_of_request(api: Api, body: Any) -> str | None:
    """All text a request carries, joined by newlines; ``None`` if the shape is wrong.

    The mock server keys its deterministic answers and its ``[[marker]]`` faults on this.
    """
    if not isinstance(body, Mapping):
        return None
    if api == "chat":
        items: Any = body.get("messages")
        if not isinstance(items, list) or not items:
            return None
        parts = [_content_text(m.get("content")) for m in items if isinstance(m, Mapping)]
    else:
        items = body.get("input")
        if isinstance(items, str):
            items = [{"content": items}]
        if not isinstance(items, list) or not items:
            return None
        parts = [_content_text(m.get("content")) for m in items if isinstance(m, Mapping)]
        if isinstance(body.get("instructions"), str):
            parts.insert(0, body["instructions"])
    return "\n".join(p for p in parts if p)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


# -- responses --------------------------------------------------------------------------------


def decode_json(content: bytes) -> Any:
    try:
        return json.loads(content)
    except ValueError as exc:
        raise ProviderError(
            f"response body is not valid JSON ({len(content)} bytes)", category=ErrorCategory.PARSE
        ) from exc


def decode_error_body(content: bytes) -> Any:
    """An error response's JSON, or its text when it is not JSON (an HTML page from a proxy)."""
    try:
        return json.loads(content)
    except ValueError:
        return content.decode("utf-8", "replace")


def parse_response_body(api: Api, payload: Any) -> tuple[str, TokenUsage | None, dict[str, Any]]:
    """``(text, usage, metadata)`` of a successful response; :class:`ProviderError` (PARSE) if malformed."""
    if not isinstance(payload, Mapping):
        raise _parse_error("response body is not a JSON object")
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
    metadata = {"id": payload.get("id"), "model": payload.get("model"), "finish_reason": finish_reason}
    if message.get("refusal"):
        metadata["refusal"] = message["refusal"]
    usage = _usage(payload.get("usage"), "prompt_tokens", "completion_tokens", "prompt_tokens_details")
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
    for item in output:
        if isinstance(item, Mapping) and item.get("type") == "message":
            for part in item.get("content") or ():
                if isinstance(part, Mapping) and part.get("type") == "output_text":
                    texts.append(str(part.get("text", "")))
    metadata = {"id": payload.get("id"), "model": payload.get("model"), "status": status}
    usage = _usage(payload.get("usage"), "input_tokens", "output_tokens", "input_tokens_details")
    return "".join(texts), usage, metadata


def _usage(raw: Any, input_key: str, output_key: str, details_key: str) -> TokenUsage | None:
    if not isinstance(raw, Mapping):
        return None
    usage: TokenUsage = {}
    for source, target in ((input_key, "input_tokens"), (output_key, "output_tokens"),
                           ("total_tokens", "total_tokens")):
        value = raw.get(source)
        if isinstance(value, int) and not isinstance(value, bool):
            usage[target] = value  # type: ignore[literal-required]
    details = raw.get(details_key)
    if isinstance(details, Mapping) and isinstance(details.get("cached_tokens"), int):
        usage["cached_input_tokens"] = details["cached_tokens"]
    return usage or None


def _parse_error(what: str) -> ProviderError:
    return ProviderError(f"malformed response: {what}", category=ErrorCategory.PARSE)


# -- errors -----------------------------------------------------------------------------------


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` (OpenAI, preferred) or ``Retry-After``.

    ``Retry-After`` may be delta-seconds or an HTTP date (compared with the wall
    clock ``now``, default ``time.time()``). Garbage and negative values are ignored.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    millis = _non_negative_float(lowered.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000.0
    value = lowered.get("retry-after")
    if value is None:
        return None
    seconds = _non_negative_float(value)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP date is always GMT; tolerate a missing zone
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _non_negative_float(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def error_from_status(
    status: int, headers: Mapping[str, str], body: Any, *, secret: Secret | None = None
) -> ProviderError:
    """Map an HTTP error response to a :class:`ProviderError` with category and Retry-After.

    ``body`` is the decoded JSON (``{"error": {...}}`` or the inner object, as the
    openai SDK keeps it), or text. The key in ``secret`` is scrubbed from the message.
    """
    code, kind, text = _error_fields(body)
    category = _category(status, code, kind, text)
    detail = f": {text[:_MESSAGE_LIMIT]}" if text else ""
    label = f" ({code})" if code else ""
    message = f"HTTP {status}{label}{detail}"
    if secret is not None:
        message = secret.redact(message)
    return ProviderError(
        message, category=category, retry_after=parse_retry_after(headers), status_code=status
    )


def status_category(status: int, body: Any) -> ErrorCategory:
    """The category of an HTTP error response with decoded ``body``, as :func:`error_from_status` files it."""
    code, kind, text = _error_fields(body)
    return _category(status, code, kind, text)


def _error_fields(body: Any) -> tuple[str, str, str]:
    """``(code, type, message)`` of an error body in any shape :func:`error_from_status` accepts."""
    error = body.get("error", body) if isinstance(body, Mapping) else None
    error = error if isinstance(error, Mapping) else {}
    code = str(error.get("code") or "")
    kind = str(error.get("type") or "")
    text = str(error.get("message") or "") if error else (body if isinstance(body, str) else "")
    return code, kind, text


def _category(status: int, code: str, kind: str, text: str) -> ErrorCategory:
    if code in INSUFFICIENT_BALANCE_CODES or kind in INSUFFICIENT_BALANCE_CODES or status == 402:
        return ErrorCategory.INSUFFICIENT_BALANCE
    if status == 429:
        return ErrorCategory.RATE_LIMIT
    if status == 408:
        return ErrorCategory.TIMEOUT
    if status >= 500:
        return ErrorCategory.SERVER
    if status in (401, 403):
        return ErrorCategory.AUTHENTICATION
    if 400 <= status < 500:
        if code in CONTEXT_LENGTH_CODES or _CONTEXT_LENGTH_TEXT.search(text):
            return ErrorCategory.CONTEXT_LENGTH
        if code in CONTENT_POLICY_CODES or kind in CONTENT_POLICY_CODES or _CONTENT_POLICY_TEXT.search(text):
            return ErrorCategory.CONTENT_POLICY
        return ErrorCategory.INVALID_REQUEST
    return ErrorCategory.UNKNOWN


# -- server side: payloads the mock server sends ----------------------------------------------


def chat_completion_payload(
    *, response_id: str, model: str, text: str, prompt_tokens: int, completion_tokens: int, created: int
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text, "refusal": None},
            "finish_reason": "stop",
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
    *, response_id: str, model: str, text: str, prompt_tokens: int, completion_tokens: int, created: int
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": "completed",
        "model": model,
        "output": [{
            "type": "message",
            "id": "msg_" + response_id.removeprefix("resp_"),
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }],
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
