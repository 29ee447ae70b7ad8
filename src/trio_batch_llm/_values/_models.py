"""Recognising pydantic models without importing pydantic: a model instance was made by pydantic,
so pydantic is in ``sys.modules`` already whenever there is one to recognise."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["is_pydantic_model_class", "plain_json_of_model"]


def is_pydantic_model_class(value: object) -> bool:
    """Whether ``value`` is a pydantic ``BaseModel`` subclass (without importing pydantic unasked)."""
    if not isinstance(value, type):
        return False
    pydantic = sys.modules.get("pydantic")
    if pydantic is None:
        return False
    return issubclass(value, pydantic.BaseModel)


def plain_json_of_model(value: object) -> tuple[bool, Any]:
    """``(True, value.model_dump(mode="json"))`` for a pydantic model instance, else ``(False, None)``."""
    pydantic = sys.modules.get("pydantic")
    if pydantic is None or not isinstance(value, pydantic.BaseModel):
        return False, None
    return True, value.model_dump(mode="json")
