"""A request's cache key: the SHA-256 of its canonical JSON (provider, model, the whole request, a sample).

The strategy says what its request is made of (``LLMCallStrategy.cache_key_material``);
the item's ``sample`` index is added, so k items equal but for it are k entries.

Canonical, so that equal requests get equal keys however they were written: mapping
keys sorted (their order never matters on the wire), tuples as lists, a float that is
a whole number as that integer (``temperature=1`` and ``1.0`` ask the same), ``-0.0``
as ``0``; pydantic models and model classes as their JSON (schema), enums as their
values, dataclasses as dicts. Anything else becomes its type's name and ``repr``: a
plain object's repr holds its address, so such material misses rather than risk
answering one request with another's answer.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
from collections.abc import Mapping, Set
from typing import Any

from ._records import CacheKey

__all__ = ["canonical_material", "request_key"]

KEY_VERSION = 2
"""Part of every key: a change in how keys are made starts a fresh key space (old entries miss)."""


def canonical_material(value: Any) -> Any:
    """``value`` as the plain JSON data its key is made of (see the module docstring)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, enum.Enum):
        return canonical_material(value.value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer():
            return int(value)
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, Mapping):
        return {str(k): canonical_material(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [canonical_material(v) for v in value]
    if isinstance(value, (Set, frozenset)):
        items = [canonical_material(v) for v in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": bytes(value).hex()}
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):  # a pydantic model instance
        return canonical_material(dump(mode="json"))
    schema = getattr(value, "model_json_schema", None)
    if isinstance(value, type) and callable(schema):  # a pydantic model class: what it asks for
        return canonical_material(schema())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return canonical_material(dataclasses.asdict(value))
    return {"object": f"{type(value).__module__}.{type(value).__qualname__}", "repr": repr(value)}


def request_key(material: Mapping[str, Any], sample: int = 0) -> CacheKey:
    """The key of ``material`` (the strategy's canonical request) as its ``sample``-th sample."""
    canonical = {"v": KEY_VERSION, "sample": sample, "request": canonical_material(material)}
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return CacheKey(hashlib.sha256(text.encode("ascii")).hexdigest(), canonical)
