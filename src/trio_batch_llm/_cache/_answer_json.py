"""A :class:`CachedAnswer` as the JSON text the shared backends (PostgreSQL, Redis) keep, and back.

One text per entry, written by one statement or command, so an entry is whole or absent.
A text that does not decode (written by something else, or by a future version with other
fields) is a miss, never an error: the call is made again and the entry overwritten.
"""

from __future__ import annotations

import json
from typing import Any

from ._records import CachedAnswer

__all__ = ["answer_from_json", "answer_to_json"]


def answer_to_json(answer: CachedAnswer) -> str:
    """The entry's text: output, usage, metadata, model and created_at (plain JSON throughout)."""
    return json.dumps(
        {"output": answer.output, "usage": dict(answer.usage), "metadata": dict(answer.metadata),
         "model": answer.model, "created_at": answer.created_at},
        separators=(",", ":"), ensure_ascii=False, default=str,
    )


def answer_from_json(value: str | bytes | dict[str, Any]) -> CachedAnswer | None:
    """The answer of an entry's text (or of its already parsed JSON), or ``None`` if it is not one."""
    try:
        data = json.loads(value) if isinstance(value, (str, bytes)) else value
    except ValueError:
        return None
    if not isinstance(data, dict) or "output" not in data:
        return None
    usage, metadata, model, created = (data.get("usage") or {}, data.get("metadata") or {},
                                       data.get("model"), data.get("created_at", 0.0))
    if (not isinstance(usage, dict) or not isinstance(metadata, dict)
            or not (model is None or isinstance(model, str))
            or isinstance(created, bool) or not isinstance(created, (int, float))):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in usage.values()):
        return None
    return CachedAnswer(output=data["output"], usage=usage, metadata=metadata, model=model,
                        created_at=float(created))
