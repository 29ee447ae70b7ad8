"""``--system``, ``--temperature``, ``--max-tokens``, ``--response-schema``: the strategy's request
defaults, checked before anything runs, and the checkpoint identity that covers them."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
from pathlib import Path
from typing import Any, Final

from .._artifacts._identity import infer_artifact_identity
from .._strategies._base import LLMCallStrategy
from .._strategies.openai._compatible import OpenAICompatibleStrategy
from .._values._config import ArtifactIdentity
from .._values._item_checks import text_nesting_column
from .._values._schema_check import MAX_SCHEMA_DEPTH, response_schema_problem
from ._command import UsageError

__all__ = ["REQUEST_FLAGS", "checkpoint_identity", "load_response_schema", "request_settings"]

REQUEST_FLAGS: Final = "--system, --temperature, --max-tokens, --response-schema"


def load_response_schema(path: str) -> dict[str, Any]:
    """The JSON schema in ``path``: a JSON object, or :class:`UsageError` naming the file (and the line)."""
    flag = f"--response-schema {path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{flag}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{flag}: cannot be read: {exc}") from None
    # Nesting is measured on the text, before json.loads, which recurses per level.
    column = text_nesting_column(text, MAX_SCHEMA_DEPTH)
    if column is not None:
        line = text.count("\n", 0, column - 1) + 1
        column -= text.rfind("\n", 0, column - 1) + 1
        raise UsageError(f"{flag}: nested more than {MAX_SCHEMA_DEPTH} levels deep at line {line}, column "
                         f"{column} (a response schema may nest at most {MAX_SCHEMA_DEPTH} levels)")
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{flag}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    if not isinstance(schema, dict) or not schema:
        got = type(schema).__name__
        raise UsageError(f"{flag}: a JSON schema must be a non-empty JSON object, got {got}")
    if "type" not in schema and "properties" not in schema and "$ref" not in schema and "anyOf" not in schema:
        raise UsageError(f'{flag}: not a JSON schema (no "type", "properties", "$ref" or "anyOf" key)')
    problem = response_schema_problem(schema)  # the check ResponseModel makes, named by the file here
    if problem is not None:
        raise UsageError(f"{flag}: the JSON schema {problem}")
    return schema


def _takes_response_model() -> bool:
    # Both OpenAI strategies share their constructor's settings; structured output may be missing
    # from an older build, which must say so rather than run without the schema.
    return "response_model" in inspect.signature(OpenAICompatibleStrategy.__init__).parameters


def request_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of the strategy that the request flags set (none: an empty dict)."""
    settings: dict[str, Any] = {}
    if getattr(args, "system", None) is not None:
        settings["system_prompt"] = args.system
    if getattr(args, "temperature", None) is not None:
        settings["temperature"] = args.temperature
    if getattr(args, "max_tokens", None) is not None:
        settings["max_output_tokens"] = args.max_tokens
    schema_path = getattr(args, "response_schema", None)
    if schema_path is not None:
        schema = load_response_schema(schema_path)
        if not _takes_response_model():
            raise UsageError("--response-schema: this build's strategies have no structured output")
        settings["response_model"] = schema
    return settings


def checkpoint_identity(provider: str, model: str, strategy: LLMCallStrategy[Any]) -> ArtifactIdentity:
    """The strategy's inferred identity under the command line's names for provider and model, so a
    run without request flags keeps the ``(provider, model)`` identity earlier releases wrote."""
    return dataclasses.replace(infer_artifact_identity(strategy), provider=provider, model=model)
