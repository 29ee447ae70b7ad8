"""The text an OpenAI chat or responses body carries: one reading for the batch upload and the mock.

Values only: the OpenAI batch connection counts a line's tokens on it, and the mock
server keys its deterministic answers and its ``[[marker]]`` faults on it; one function,
so what the library counts is what the mock answers on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["openai_prompt_text"]


def openai_prompt_text(api: str, body: Any) -> str | None:
    """All text a chat or responses request carries, joined by newlines; ``None`` if the shape is wrong."""
    if not isinstance(body, Mapping):
        return None
    if api == "chat":
        items: Any = body.get("messages")
    else:
        items = body.get("input")
        if isinstance(items, str):
            items = [{"content": items}]
    if not isinstance(items, list) or not items:
        return None
    parts = [_content_text(m.get("content")) for m in items if isinstance(m, Mapping)]
    if api != "chat" and isinstance(body.get("instructions"), str):
        parts.insert(0, body["instructions"])
    return "\n".join(p for p in parts if p)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""
