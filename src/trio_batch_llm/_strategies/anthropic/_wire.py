"""Anthropic's Messages API, answers: a ``Message`` (the SDK's object or its JSON) as our result.

``read_message`` gives ``(text, usage, metadata)``. Usage follows our convention that
``input_tokens`` counts every input token: Anthropic's ``input_tokens`` leaves out the
tokens written to and read from the prompt cache, so they are added back, and kept apart as
``cache_write_input_tokens`` and ``cached_input_tokens``. No SDK import.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from ..._values._categories import ErrorCategory
from ..._values._details import DETAILS_METADATA_KEY, ResponseDetails, ToolCall
from ..._values._errors import ProviderError
from ..._values._results import TokenUsage

__all__ = ["FINISH_REASONS", "read_message", "usage_of"]

FINISH_REASONS: Final = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                         "tool_use": "tool_calls", "refusal": "content_filter",
                         "model_context_window_exceeded": "length"}
"""Anthropic's ``stop_reason`` in :class:`ResponseDetails`' words (the original stays in metadata)."""


def read_message(message: Any) -> tuple[str, TokenUsage, dict[str, Any]]:
    """``(text, usage, metadata)`` of a Message: the text blocks joined; metadata ``id``, ``model``,
    ``stop_reason``, ``stop_sequence``, ``tool_calls`` (``tool_use`` blocks: id, name, input),
    ``refusal`` (when ``stop_reason`` is ``"refusal"``) and the details (``response_details``).
    A body that is no Message is a PARSE :class:`ProviderError`."""
    payload = message.to_dict(mode="json") if hasattr(message, "to_dict") else message
    if not isinstance(payload, Mapping) or not isinstance(payload.get("content"), list):
        raise ProviderError("the answer is not an Anthropic Message (no content list)",
                            category=ErrorCategory.PARSE)
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in payload["content"]:
        if not isinstance(block, Mapping):
            continue
        if block.get("type") == "text":
            texts.append(str(block.get("text", "")))
        elif block.get("type") == "tool_use":
            calls.append({"id": str(block.get("id", "")), "name": str(block.get("name", "")),
                          "input": block.get("input")})
    stop_reason = payload.get("stop_reason")
    metadata: dict[str, Any] = {"id": payload.get("id"), "model": payload.get("model"),
                                "stop_reason": stop_reason, "stop_sequence": payload.get("stop_sequence")}
    if calls:
        metadata["tool_calls"] = calls
    refusal = ("".join(texts) or "the model refused") if stop_reason == "refusal" else None
    if refusal:  # a structured answer is then final (CONTENT_POLICY), as OpenAI's refusals are
        metadata["refusal"] = refusal
    finish = FINISH_REASONS.get(stop_reason, stop_reason) if isinstance(stop_reason, str) else None
    metadata[DETAILS_METADATA_KEY] = ResponseDetails(
        finish_reason=finish,
        refusal=refusal,
        tool_calls=tuple(ToolCall(call["id"], call["name"], json.dumps(call["input"], ensure_ascii=False))
                         for call in calls),
    )
    return "".join(texts), usage_of(payload.get("usage")), metadata


def usage_of(usage: Any) -> TokenUsage:
    """Anthropic's ``usage`` in our convention (every input token in ``input_tokens``)."""
    fields = usage if isinstance(usage, Mapping) else {}

    def count(name: str) -> int:
        value = fields.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

    written, read = count("cache_creation_input_tokens"), count("cache_read_input_tokens")
    output = count("output_tokens")
    total_input = count("input_tokens") + written + read
    return TokenUsage(input_tokens=total_input, output_tokens=output, total_tokens=total_input + output,
                      cached_input_tokens=read, cache_write_input_tokens=written)
