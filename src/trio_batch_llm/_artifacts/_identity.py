"""``infer_artifact_identity``: the identity a checkpoint gets when none is given.

A resume never guesses: the identity is read only from what the strategy
declares. Provider and model name the strategy (its ``artifact_identity``, or
its ``provider_name`` and ``model_name``); a strategy that declares no model
has no inferred identity, and a store used with it needs ``identity=`` (the
error says so before any work starts). The request settings that change its
answers go into two fingerprints, so that a changed setting makes a stored
checkpoint a mismatch (refused, or rerun under ``allow_identity_mismatch``)
while the same settings match in every process:

* ``prompt_version``: the system prompt and the default request params;
* ``parser_version``: the response schema (structured output).

Each is ``"auto-"`` and 16 hex digits of SHA-256 over canonical JSON, or
``None`` when the strategy has no such setting, so a plain strategy keeps the
bare ``(provider, model)`` identity of earlier releases.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from .._strategies._callable import CallableStrategy
from .._values._artifact_identity import ArtifactIdentity
from .._values._errors import ConfigurationError
from .._values._strategy_settings import default_params, system_prompt_of
from ._fingerprint import canonical_json

if TYPE_CHECKING:
    from .._strategies._base import LLMCallStrategy

__all__ = ["adopt_identity", "infer_artifact_identity", "response_schema_of"]

_PREFIX: Final = "auto-"


def _digest(name: str, value: Any) -> str:
    try:
        text = canonical_json(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ConfigurationError(
            name, value,
            f"cannot be fingerprinted for the artifact identity ({exc}); pass identity=... yourself",
        ) from None
    return _PREFIX + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def response_schema_of(strategy: object) -> dict[str, Any] | None:
    """The JSON schema a strategy's answers are validated against: its ``response_schema``, else
    that of its ``response_model`` (a schema dict, or a pydantic model class)."""
    schema = getattr(strategy, "response_schema", None)
    if isinstance(schema, Mapping):
        return dict(schema)
    model = getattr(strategy, "response_model", None)
    if isinstance(model, Mapping):
        return dict(model)
    model_json_schema = getattr(model, "model_json_schema", None)
    if isinstance(model, type) and callable(model_json_schema):
        produced = model_json_schema()
        return dict(produced) if isinstance(produced, Mapping) else None
    return None


def infer_artifact_identity(strategy: LLMCallStrategy[Any]) -> ArtifactIdentity:
    """The :class:`ArtifactIdentity` of ``strategy``'s checkpoints: its provider (``provider_name``,
    else the class name), its model (``model_name``), and fingerprints of its system prompt and
    params (``prompt_version``) and of its response schema (``parser_version``).

    A strategy that declares an ``artifact_identity`` gets it, its unset versions filled in.
    One that declares no model is refused (:class:`ConfigurationError` saying how to pass
    ``identity=``): its checkpoints could not tell one model's answers from another's.
    """
    declared = getattr(strategy, "artifact_identity", None)
    if declared is not None and not isinstance(declared, ArtifactIdentity):
        raise ConfigurationError("artifact_identity", declared, "must be an ArtifactIdentity or None")
    if declared is None:
        model = getattr(strategy, "model_name", None)
        if not isinstance(model, str) or not model:
            raise _no_model(strategy, model)
        provider = getattr(strategy, "provider_name", None)
        if not isinstance(provider, str) or not provider:
            provider = type(strategy).__name__
        declared = ArtifactIdentity(provider=provider, model=model)
    prompt_version = declared.prompt_version
    if prompt_version is None:
        settings = {"system": system_prompt_of(strategy), "params": default_params(strategy)}
        if settings != {"system": None, "params": {}}:
            prompt_version = _digest("params", settings)
    parser_version = declared.parser_version
    if parser_version is None:
        schema = response_schema_of(strategy)
        parser_version = None if schema is None else _digest("response_schema", schema)
    return dataclasses.replace(declared, prompt_version=prompt_version, parser_version=parser_version)


def _no_model(strategy: object, model: object) -> ConfigurationError:
    """Why ``strategy`` has no inferred identity, and the two ways to give it one."""
    name = type(strategy).__name__
    if isinstance(strategy, CallableStrategy):
        declare = "CallableStrategy(fn, identity=ArtifactIdentity(provider=..., model=...))"
    else:
        declare = f"a model_name property on {name} (and provider_name)"
        if isinstance(getattr(strategy, "model", None), str):
            declare += "; its `model` attribute is not read as one"
    return ConfigurationError(
        "model_name", model,
        f"{name} declares no model, so the identity of its checkpoints cannot be inferred (a resume "
        "does not guess: another model's stored answers would be replayed as this one's). Pass "
        f"identity=ArtifactIdentity(provider=..., model=...) to the artifact store (or to open_run), "
        f"or declare it: {declare}",
    )


def adopt_identity(store: object, strategy: LLMCallStrategy[Any]) -> None:
    """Give ``store`` the identity inferred from ``strategy`` when it was built without one.

    A store of another kind (a user's :class:`ArtifactStore`) is left alone: it has its own.
    """
    infer = getattr(store, "infer_identity", None)
    if store is not None and callable(infer):
        infer(strategy)
