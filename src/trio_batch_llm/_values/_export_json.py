"""Results as strict JSON, the way the stores keep them: what ``to_json``/``to_jsonl`` write."""

from __future__ import annotations

import json
from typing import Any

from ._models import plain_json_of_model

__all__ = ["export_dict", "json_default"]


def json_default(value: Any) -> Any:
    """What the exports write for a value JSON has no form for: a pydantic model as the stores keep
    it (``model_dump(mode="json")``), anything else as ``str()``."""
    is_model, dumped = plain_json_of_model(value)
    return dumped if is_model else str(value)


def _strict_problem(value: Any) -> str | None:
    try:
        json.dumps(value, default=json_default, allow_nan=False)
    except (ValueError, RecursionError) as exc:
        return str(exc)
    return None


def _strict(value: Any) -> bool:
    return _strict_problem(value) is None


def export_dict(result: Any) -> dict[str, Any]:
    """``result.to_dict()`` that strict JSON can hold: context and metadata values it cannot hold
    (a ``NaN``) become their ``repr()``, as the stores keep them; such an output is refused."""
    data: dict[str, Any] = result.to_dict()
    if _strict(data):
        return data
    problem = _strict_problem(data["output"])
    if problem is not None:
        raise ValueError(
            f"item {result.item_id!r}: its output cannot be written as strict JSON ({problem}; "
            "JSON has no NaN or Infinity): replace such values (for example with None) before exporting"
        )
    if not _strict(data["context"]):
        data["context"] = repr(data["context"])
    data["metadata"] = {str(k): v if _strict(v) else repr(v) for k, v in data["metadata"].items()}
    return data
