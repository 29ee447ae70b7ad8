"""A response schema checked once, before any work: its depth, the keywords we and providers read, its $refs.

Not a full JSON Schema meta-schema validator (that would be a dependency for one
check): the keywords the local validator (:func:`~._structured.schema_problem`),
the mock and providers' strict mode read are checked to have the meta-schema's
shape (``type`` names a JSON type, ``properties`` is an object of schemas,
``required`` a list of names, ...); other keywords pass, as JSON Schema ignores
keywords it does not know. ``$ref`` must be local (``#`` or ``#/...``) and
resolve. A schema may recurse through ``properties`` or ``items`` (each level
then takes a level of the answer, which is finite), but a ``$ref`` that comes
back to itself without descending (``{"$ref": "#"}``, or through ``anyOf``)
would recurse forever and is refused. Nesting is measured before anything
recurses, so a schema 5,000 levels deep is a clear error, not a RecursionError.

Values only: :class:`~._structured.ResponseModel` calls :func:`response_schema_problem`
(the API), the command line calls it on ``--response-schema``'s file, the mock
answers 400 with it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

from ._item_checks import nesting_exceeds

__all__ = ["MAX_SCHEMA_DEPTH", "resolve_ref", "response_schema_problem", "schema_depth_problem"]

MAX_SCHEMA_DEPTH: Final = 100
"""Levels of JSON nesting (objects and arrays) a response schema may have: far above what providers
take (OpenAI's strict mode allows 10 levels of objects), far below Python's recursion limit."""

_TYPE_NAMES: Final = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})
_SCHEMA_MAPS: Final = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS: Final = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMAS: Final = ("additionalProperties", "not", "contains", "propertyNames", "if", "then", "else",
                   "unevaluatedProperties", "unevaluatedItems", "additionalItems")
_COUNTS: Final = ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties")
_NUMBERS: Final = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_TEXTS: Final = ("title", "description", "pattern", "format", "$id", "$schema", "$comment")
_PASSES: Final = ("$ref", "anyOf", "oneOf", "allOf", "not", "if", "then", "else")
"""Keywords whose schemas apply to the same value: a cycle through only these never ends."""


def schema_depth_problem(schema: object) -> str | None:
    """Why ``schema`` nests too deep to be checked (or contains itself), or ``None``. Never recurses."""
    if nesting_exceeds(schema, MAX_SCHEMA_DEPTH):
        return (f"is nested more than {MAX_SCHEMA_DEPTH} levels deep, or contains itself "
                f"(a response schema may nest at most {MAX_SCHEMA_DEPTH} levels)")
    return None


def response_schema_problem(schema: object) -> str | None:
    """Why ``schema`` cannot be a response schema, naming the place (``$.properties.a``), or ``None``."""
    problem = schema_depth_problem(schema)
    if problem is not None:
        return problem
    if not isinstance(schema, Mapping):
        return f"must be a JSON object, not {_kind(schema)}"
    if not schema:
        return "must not be empty"
    for where, node in _nodes(schema, "$"):
        problem = _node_problem(node, schema)
        if problem is not None:
            return f"at {where}: {problem}"
    return _loop_problem(schema)


def _kind(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _is_schema(value: object) -> bool:
    return isinstance(value, (Mapping, bool))


def _children(node: Mapping[str, Any], where: str) -> Iterator[tuple[str, Any]]:
    """The subschemas of ``node`` with their places (only those of well-formed keywords)."""
    for key in _SCHEMA_MAPS:
        value = node.get(key)
        if isinstance(value, Mapping):
            for name, sub in value.items():
                yield f"{where}.{key}.{name}", sub
    for key in _SCHEMA_LISTS:
        value = node.get(key)
        if isinstance(value, list):
            for index, sub in enumerate(value):
                yield f"{where}.{key}[{index}]", sub
    items = node.get("items")
    if isinstance(items, list):
        for index, sub in enumerate(items):
            yield f"{where}.items[{index}]", sub
    elif items is not None:
        yield f"{where}.items", items
    for key in _SCHEMAS:
        if key in node:
            yield f"{where}.{key}", node[key]


def _nodes(schema: Mapping[str, Any], root: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every schema object inside ``schema`` (a stack: the depth was bounded already)."""
    stack: list[tuple[str, Any]] = [(root, schema)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, Mapping):
            yield where, node
            stack.extend(reversed(list(_children(node, where))))


def _node_problem(node: Mapping[str, Any], root: Mapping[str, Any]) -> str | None:
    kind = node.get("type")
    if "type" in node:
        kinds = kind if isinstance(kind, list) else [kind]
        if not kinds or not all(isinstance(k, str) and k in _TYPE_NAMES for k in kinds):
            return (f"type={kind!r:.80} must be one of {', '.join(sorted(_TYPE_NAMES))}, "
                    "or a list of them")
    for key in _SCHEMA_MAPS:
        if key in node and not (isinstance(node[key], Mapping)
                                and all(_is_schema(sub) for sub in node[key].values())):
            return f"{key} must be an object whose values are schemas, not {_kind(node[key])}"
    for key in _SCHEMA_LISTS:
        value = node.get(key, [None])
        if key in node and not (isinstance(value, list) and value and all(_is_schema(v) for v in value)):
            return f"{key} must be a non-empty array of schemas"
    items = node.get("items")
    if "items" in node and not (_is_schema(items) or (isinstance(items, list)
                                                      and all(_is_schema(v) for v in items))):
        return f"items must be a schema, not {_kind(items)}"
    for key in _SCHEMAS:
        if key in node and not _is_schema(node[key]):
            return f"{key} must be a schema, not {_kind(node[key])}"
    required = node.get("required")
    if "required" in node and not (isinstance(required, list) and all(isinstance(r, str) for r in required)):
        return f"required must be an array of property names, not {required!r:.80}"
    if "enum" in node and not (isinstance(node["enum"], list) and node["enum"]):
        return f"enum must be a non-empty array, not {node['enum']!r:.80}"
    for key in _COUNTS:
        value = node.get(key)
        if key in node and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            return f"{key}={value!r:.40} must be a whole number >= 0"
    for key in _NUMBERS:
        value = node.get(key)
        if key in node and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return f"{key}={value!r:.40} must be a number"
    for key in _TEXTS:
        if key in node and not isinstance(node[key], str):
            return f"{key} must be a string, not {_kind(node[key])}"
    if "$ref" in node:
        return _ref_problem(node["$ref"], root)
    return None


def _ref_problem(ref: object, root: Mapping[str, Any]) -> str | None:
    if not isinstance(ref, str):
        return f"$ref must be a string, not {_kind(ref)}"
    if ref != "#" and not ref.startswith("#/"):
        return f"$ref={ref!r:.80}: only local references (\"#\" or \"#/...\") are supported"
    if resolve_ref(ref, root) is None:
        return f"$ref={ref!r:.80} does not resolve to a schema in this document"
    return None


def resolve_ref(ref: str, root: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The schema object a local ``$ref`` names (JSON Pointer, ``~1`` and ``~0`` unescaped), or ``None``."""
    target: Any = root
    for part in ref[2:].split("/") if ref != "#" else ():
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(target, Mapping):
            target = target.get(part)
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            return None
    return target if isinstance(target, Mapping) else None


def _loop_problem(root: Mapping[str, Any]) -> str | None:
    """A ``$ref`` that reaches itself through keywords that apply to the same value (:data:`_PASSES`)."""
    def passes(node: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
        ref = node.get("$ref")
        if isinstance(ref, str):
            target = resolve_ref(ref, root)
            if target is not None:
                yield f"$ref {ref!r}", target
        for key in ("anyOf", "oneOf", "allOf"):
            options = node.get(key)
            for option in options if isinstance(options, list) else ():
                if isinstance(option, Mapping):
                    yield key, option
        for key in ("not", "if", "then", "else"):
            if isinstance(node.get(key), Mapping):
                yield key, node[key]

    done: set[int] = set()
    for where, start in _nodes(root, "$"):
        if id(start) in done:
            continue
        # Depth-first along the same-value passes only, with the path held on a stack.
        on_path: dict[int, str] = {id(start): ""}
        stack = [(start, iter(list(passes(start))))]
        while stack:
            node, pending = stack[-1]
            step = next(pending, None)
            if step is None:
                stack.pop()
                on_path.pop(id(node), None)
                done.add(id(node))
                continue
            how, target = step
            if id(target) in on_path:
                return (f"at {where}: {how} leads back to itself without descending into a property or "
                        "an item: checking an answer against it would never end")
            if id(target) not in done:
                on_path[id(target)] = how
                stack.append((target, iter(list(passes(target)))))
    return None
