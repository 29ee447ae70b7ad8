"""Structured answers of the mock: deterministic JSON that satisfies a JSON schema, or breaks it on purpose.

A request asking for a JSON schema (each dialect says where it asks: :mod:`._openai`,
:mod:`._anthropic`) is answered with JSON generated from that schema:
objects (required properties always, optional ones by a seeded coin), arrays
(1-3 items, within ``minItems``/``maxItems``), ``enum``/``const``, strings,
integers and numbers (within ``minimum``/``maximum``), booleans, null,
``anyOf``/``oneOf`` (the first option) and local ``$ref``. The same seed and
prompt give the same JSON; a forced tool's arguments are generated the same way
from its input schema. :func:`schema_violation` gives valid JSON that breaks a schema.

A malformed schema (checked by the dialects with the same check the library makes
before sending one) is refused with 400 ``invalid_json_schema``, as a provider refuses it.

Nothing here sends or reads a clock.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any, Final

from .._values._schema_check import resolve_ref

__all__ = ["answer_json", "example_of", "schema_violation"]

_WORDS: Final = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")
_MAX_DEPTH: Final = 12
_HARD_DEPTH: Final = 2 * _MAX_DEPTH


def example_of(schema: Mapping[str, Any], rng: random.Random) -> Any:
    """A value that satisfies ``schema``, drawn from ``rng`` (deterministic for a seeded one)."""
    return _example(schema, rng, schema, 0)


def _example(schema: Mapping[str, Any], rng: random.Random, root: Mapping[str, Any], depth: int) -> Any:
    ref = schema.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")) and depth < _MAX_DEPTH:
        target = resolve_ref(ref, root)
        if target is not None:
            return _example(target, rng, root, depth + 1)
        return None
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options and isinstance(options[0], Mapping):
            return _example(options[0], rng, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        result: dict[str, Any] = {}
        required = set(schema.get("required") or ())
        properties = schema.get("properties") or {}
        for name, sub in properties.items():
            # Past _MAX_DEPTH only required properties go on (a recursive schema's answer stays
            # valid: its arrays end there), and nothing past _HARD_DEPTH.
            deep_enough = depth < _MAX_DEPTH or (name in required and depth < _HARD_DEPTH)
            if (name in required or rng.random() < 0.5) and deep_enough and isinstance(sub, Mapping):
                result[name] = _example(sub, rng, root, depth + 1)
        return result
    if kind == "array":
        items = schema.get("items")
        low = int(schema.get("minItems", 1))
        high = max(low, int(schema.get("maxItems", max(low, 3))))
        count = rng.randint(low, min(high, low + 2))
        if not isinstance(items, Mapping) or depth >= _MAX_DEPTH:
            return []
        return [_example(items, rng, root, depth + 1) for _ in range(count)]
    if kind == "integer":
        low = int(schema.get("minimum", 0))
        return rng.randint(low, int(schema.get("maximum", low + 100)))
    if kind == "number":
        bottom = float(schema.get("minimum", 0.0))
        return round(rng.uniform(bottom, float(schema.get("maximum", bottom + 100.0))), 3)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))


def schema_violation(schema: Mapping[str, Any], rng: random.Random) -> Any:
    """Valid JSON that breaks ``schema``: an object without its first required property, or a wrong type."""
    value = example_of(schema, rng)
    if isinstance(value, dict):
        required = [name for name in schema.get("required") or () if name in value]
        if required:
            del value[required[0]]
            return value
        return ["not", "an", "object"]
    return {"unexpected": value}


def answer_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
