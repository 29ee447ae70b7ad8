"""Structured output: a response model (pydantic class or JSON-schema dict), its schema and its check.

pydantic is optional: it is imported only when a pydantic model is used (its
``model_json_schema``/``model_validate_json``), or looked up in
``sys.modules`` to recognise a model instance (an output that is a model was
made by pydantic, so it is imported already). A JSON-schema dict is checked by
the small validator here (objects, arrays, enums, strings, numbers, integers,
booleans, null, ``anyOf``, local ``$ref``), which covers what providers accept
in a strict schema.

Values only, no I/O: the engine's parse stage calls :meth:`ResponseModel.parse`,
the stores and exports call :func:`plain_json_of_model`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final, final

from ._categories import ErrorCategory
from ._errors import ConfigurationError, ProviderError
from ._models import is_pydantic_model_class, plain_json_of_model
from ._schema_check import resolve_ref, response_schema_problem

__all__ = [
    "FENCE_METADATA_KEY",
    "ResponseModel",
    "StructuredOutputError",
    "is_pydantic_model_class",
    "plain_json_of_model",
]

FENCE_METADATA_KEY: Final = "fence_recovered"
"""``result.metadata[...] = True`` when the JSON answer came wrapped in a markdown code fence."""

_FENCE: Final = re.compile(r"^\s*```[A-Za-z0-9_-]*\s*\n(.*?)\n?\s*```\s*$", re.DOTALL)
_NAME: Final = re.compile(r"[^A-Za-z0-9_-]")
_SHOWN: Final = "<a JSON schema dict>"  # errors never print the schema: it may nest thousands of levels


class StructuredOutputError(ProviderError):
    """The answer is not valid JSON for the response model: a ``PARSE`` failure, retried without backoff.

    ``validation_error`` is the underlying error (a pydantic ``ValidationError``,
    a ``json.JSONDecodeError``, or a ``ValueError`` naming the schema path).
    """

    def __init__(self, message: str, *, validation_error: BaseException | None = None) -> None:
        super().__init__(message, category=ErrorCategory.PARSE)
        self.validation_error = validation_error


@final
class ResponseModel:
    """A checked ``response_model=``: the schema the provider gets and the local check of its answer."""

    __slots__ = ("label", "model", "name", "schema", "strict")

    def __init__(self, model: object) -> None:
        if isinstance(model, Mapping):
            if not model:
                raise ConfigurationError("response_model", model, "a JSON schema must not be empty")
            # Checked once, here, before any work: a bad schema would otherwise fail every item (or
            # recurse without end) at parse time, or make the provider answer 400 to every call.
            problem = response_schema_problem(model)
            if problem is not None:
                raise ConfigurationError("response_model", _SHOWN, f"the JSON schema {problem}")
            try:
                schema = json.loads(json.dumps(dict(model), allow_nan=False))  # a private, plain copy
            except (TypeError, ValueError) as exc:
                raise ConfigurationError("response_model", _SHOWN,
                                         f"this JSON schema is not JSON: {exc}") from None
            title = schema.get("title")
            name = title if isinstance(title, str) and title else "response"
            label = f"the response schema {title!r}" if name == title else "the response schema"
        elif isinstance(model, type) and _looks_like_pydantic(model):
            schema = _closed(model.model_json_schema())  # type: ignore[attr-defined]
            problem = response_schema_problem(schema)
            if problem is not None:
                raise ConfigurationError("response_model", model, f"its JSON schema {problem}")
            name = model.__name__
            label = f"the response model {name}"
        else:
            raise ConfigurationError(
                "response_model", model,
                "must be a pydantic BaseModel subclass (pip install pydantic) or a JSON-schema dict",
            )
        self.model: type | dict[str, Any] = model if isinstance(model, type) else dict(model)
        self.schema: dict[str, Any] = schema
        self.name = _NAME.sub("_", name)[:64] or "response"
        self.strict = _strict_compatible(schema)
        """``strict: true`` is sent when the schema allows it (objects closed, properties required)."""
        # What messages call it. ``name`` is the schema name the provider gets ("response" when the
        # schema has no title), which in a sentence read "the response model response".
        self.label = label

    @property
    def is_pydantic(self) -> bool:
        return isinstance(self.model, type)

    def parse(self, text: object) -> tuple[Any, bool]:
        """``(output, fence_recovered)``: the model instance (a dict for a schema); StructuredOutputError."""
        if not isinstance(text, str):
            raise StructuredOutputError(f"expected the answer's text, got {type(text).__name__}")
        body, fenced = _unfenced(text)
        try:
            if self.is_pydantic:
                return self.model.model_validate_json(body), fenced  # type: ignore[union-attr]
            data = json.loads(body)
        except ValueError as exc:  # json.JSONDecodeError and pydantic's ValidationError are ValueErrors
            # A schema's answer fails here only as JSON; a pydantic model's, as JSON or by its fields.
            how = "does not match" if self.is_pydantic else "is not JSON, as"
            asks = "" if self.is_pydantic else " asks"
            raise StructuredOutputError(
                f"the answer {how} {self.label}{asks}: {_short(exc)}", validation_error=exc,
            ) from exc
        except RecursionError as exc:
            raise StructuredOutputError(f"the answer is nested too deep to read as JSON for {self.label}",
                                        validation_error=exc) from None
        try:
            problem = schema_problem(self.schema, data)
        except RecursionError as exc:  # an answer nested deeper than Python recurses, for a recursive schema
            raise StructuredOutputError(f"the answer is nested too deep to check against {self.label}",
                                        validation_error=exc) from None
        if problem is not None:
            error = ValueError(problem)
            raise StructuredOutputError(
                f"the answer does not match {self.label}: {problem}",
                validation_error=error,
            ) from error
        return data, fenced

    def decode(self, stored: Any) -> Any:
        """A stored ``model_dump(mode="json")`` back to the model instance (a schema's dict as is)."""
        if stored is None or not self.is_pydantic:
            return stored
        return self.model.model_validate(stored)  # type: ignore[union-attr]

    def encode(self, output: Any) -> Any:
        is_model, data = plain_json_of_model(output)
        return data if is_model else output

    def chat_response_format(self) -> dict[str, Any]:
        return {"type": "json_schema",
                "json_schema": {"name": self.name, "schema": self.schema, "strict": self.strict}}

    def responses_text_format(self) -> dict[str, Any]:
        return {"type": "json_schema", "name": self.name, "schema": self.schema, "strict": self.strict}


def _looks_like_pydantic(model: type) -> bool:
    if is_pydantic_model_class(model):
        return True
    return callable(getattr(model, "model_json_schema", None)) and callable(
        getattr(model, "model_validate_json", None))


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 600 else text[:600] + " ..."


def _unfenced(text: str) -> tuple[str, bool]:
    match = _FENCE.match(text)
    if match is None:
        return text, False
    return match.group(1), True


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    """pydantic's schema with every object closed (``additionalProperties: false``), as strict mode needs."""
    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                node.setdefault("additionalProperties", False)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(schema)
    return schema


def _strict_compatible(schema: Any) -> bool:
    if isinstance(schema, dict):
        if schema.get("type") == "object" or "properties" in schema:
            props = schema.get("properties") or {}
            if schema.get("additionalProperties") is not False:
                return False
            if set(schema.get("required") or ()) != set(props):
                return False
        return all(_strict_compatible(v) for v in schema.values())
    if isinstance(schema, list):
        return all(_strict_compatible(v) for v in schema)
    return True


_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "object": (dict,), "array": (list,), "null": (type(None),),
}


def schema_problem(schema: Mapping[str, Any], value: Any, *, root: Mapping[str, Any] | None = None,
                   where: str = "$") -> str | None:
    """Why ``value`` does not satisfy ``schema``, naming the path (``$.a[0]``), or ``None``."""
    root = schema if root is None else root
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = resolve_ref(ref, root) if ref == "#" or ref.startswith("#/") else None
        if target is None:
            return f"{where}: unresolvable $ref {ref!r}"
        return schema_problem(target, value, root=root, where=where)
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options and all(
                schema_problem(o, value, root=root, where=where) for o in options):
            return f"{where}: {value!r:.60} matches none of {key}"
    if "const" in schema and value != schema["const"]:
        return f"{where}: expected {schema['const']!r}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where}: {value!r:.60} is not one of {schema['enum']!r:.120}"
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if isinstance(kind, str) else []
    if kinds and not any(_is(value, k) for k in kinds):
        return f"{where}: expected {'/'.join(kinds)}, got {type(value).__name__}"
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for name in schema.get("required") or ():
            if name not in value:
                return f"{where}: missing required property {name!r}"
        for name, item in value.items():
            if name in props:
                problem = schema_problem(props[name], item, root=root, where=f"{where}.{name}")
                if problem:
                    return problem
            elif schema.get("additionalProperties") is False:
                return f"{where}: unexpected property {name!r}"
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            problem = schema_problem(schema["items"], item, root=root, where=f"{where}[{index}]")
            if problem:
                return problem
    return None


def _is(value: Any, kind: str) -> bool:
    types = _TYPES.get(kind)
    if types is None:
        return True
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, types)
