"""``infer_artifact_identity``: the identity a checkpoint gets when none is given.

Provider and model name the strategy; the request settings that change its
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

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from .._values._config import ArtifactIdentity
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
    else the class name), its model (``model_name``, else ``"unknown"``), and fingerprints of its
    system prompt and params (``prompt_version``) and of its response schema (``parser_version``).
    """
    provider = getattr(strategy, "provider_name", None)
    if not isinstance(provider, str) or not provider:
        provider = type(strategy).__name__
    model = getattr(strategy, "model_name", None)
    if not isinstance(model, str) or not model:
        model = "unknown"
    settings = {"system": system_prompt_of(strategy), "params": default_params(strategy)}
    prompt_version = None if settings == {"system": None, "params": {}} else _digest("params", settings)
    schema = response_schema_of(strategy)
    parser_version = None if schema is None else _digest("response_schema", schema)
    return ArtifactIdentity(provider=provider, model=model, prompt_version=prompt_version,
                            parser_version=parser_version)


def adopt_identity(store: object, strategy: LLMCallStrategy[Any]) -> None:
    """Give ``store`` the identity inferred from ``strategy`` when it was built without one.

    A store of another kind (a user's :class:`ArtifactStore`) is left alone: it has its own.
    """
    infer = getattr(store, "infer_identity", None)
    if store is not None and callable(infer):
        infer(strategy)
