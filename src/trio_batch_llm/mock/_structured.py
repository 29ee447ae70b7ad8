"""Structured answers of the mock: deterministic JSON that satisfies a request's JSON schema, tool calls.

A request asking for ``response_format`` ``json_schema`` (chat) or ``text.format``
``json_schema`` (responses) is answered with JSON generated from that schema:
objects (required properties always, optional ones by a seeded coin), arrays
(1-3 items, within ``minItems``/``maxItems``), ``enum``/``const``, strings,
integers and numbers (within ``minimum``/``maximum``), booleans, null,
``anyOf``/``oneOf`` (the first option) and local ``$ref``. The same seed and
prompt give the same JSON. A request with ``tools`` whose ``tool_choice`` is
``"required"`` or names a function (or whose prompt carries ``[[tool_call]]``)
is answered with one call of that (or the first) function, with arguments
generated from its parameters' schema.

A request whose schema is malformed (a ``type`` that names no JSON type, ``properties``
that is not an object of schemas, a ``$ref`` that does not resolve or loops, a schema
nested too deep) is refused with 400 ``invalid_json_schema``, as a provider refuses it
(:func:`schema_refusal`), by the same check the library makes before sending one.

Nothing here sends or reads a clock.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any, Final

from .._strategies.openai._wire import Api
from .._values._schema_check import resolve_ref, response_schema_problem

__all__ = ["example_of", "requested_schema", "requested_tool", "schema_refusal", "schema_violation"]

_WORDS: Final = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")
_MAX_DEPTH: Final = 12
_HARD_DEPTH: Final = 2 * _MAX_DEPTH


def requested_schema(api: Api, payload: Mapping[str, Any]) -> dict[str, Any] | None:
    """The JSON schema the request asks its answer to follow, or ``None``."""
    if api == "chat":
        fmt = payload.get("response_format")
        inner = fmt.get("json_schema") if isinstance(fmt, Mapping) else None
        if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema" and isinstance(inner, Mapping):
            schema = inner.get("schema")
            return dict(schema) if isinstance(schema, Mapping) else {}
        return None
    text = payload.get("text")
    fmt = text.get("format") if isinstance(text, Mapping) else None
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
        schema = fmt.get("schema")
        return dict(schema) if isinstance(schema, Mapping) else {}
    return None


def schema_refusal(api: Api, payload: Mapping[str, Any]) -> str | None:
    """The message of the 400 a provider sends for a malformed schema in the request, or ``None``:
    the response format's schema, and the parameters of every function tool."""
    schema = requested_schema(api, payload)
    if schema is not None:
        problem = response_schema_problem(schema)
        if problem is not None:
            name = _format_name(api, payload)
            return f"Invalid schema for response_format {name!r}: the schema {problem} (mock)"
    tools = payload.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        spec = tool.get("function") if api == "chat" and isinstance(tool, Mapping) else tool
        if not isinstance(spec, Mapping) or "parameters" not in spec:
            continue
        parameters = spec["parameters"]
        problem = response_schema_problem(parameters) if parameters != {} else None
        if problem is not None:
            return f"Invalid schema for function {spec.get('name')!r}: the parameters {problem} (mock)"
    return None


def _format_name(api: Api, payload: Mapping[str, Any]) -> object:
    if api == "chat":
        fmt = payload.get("response_format")
        inner = fmt.get("json_schema") if isinstance(fmt, Mapping) else None
        return inner.get("name") if isinstance(inner, Mapping) else None
    text = payload.get("text")
    fmt = text.get("format") if isinstance(text, Mapping) else None
    return fmt.get("name") if isinstance(fmt, Mapping) else None


def requested_tool(api: Api, payload: Mapping[str, Any], prompt: str) -> tuple[str, dict[str, Any]] | None:
    """``(function name, parameters schema)`` of the call to answer with, or ``None`` for text."""
    tools = payload.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    functions: dict[str, dict[str, Any]] = {}
    for tool in tools:
        if not isinstance(tool, Mapping):
            continue
        spec = tool.get("function") if api == "chat" else tool
        if isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
            parameters = spec.get("parameters")
            functions[spec["name"]] = dict(parameters) if isinstance(parameters, Mapping) else {}
    if not functions:
        return None
    choice = payload.get("tool_choice")
    if isinstance(choice, Mapping):
        named = choice.get("function", {}).get("name") if api == "chat" else choice.get("name")
        if isinstance(named, str) and named in functions:
            return named, functions[named]
    if choice == "required" or "[[tool_call]]" in prompt:
        name = next(iter(functions))
        return name, functions[name]
    return None


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
