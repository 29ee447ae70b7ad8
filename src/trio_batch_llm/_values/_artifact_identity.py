"""``ArtifactIdentity``: what a checkpoint was produced by (provider, model, versions).

Its own module, not one of :mod:`._config`'s records: the stores, the runs and the
strategies name it, and none of them needs a processor's configuration to do so
(:mod:`._config` re-exports it, where the engine has always imported it from).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

from ._errors import ConfigurationError

__all__ = ["ArtifactIdentity"]


@final
@dataclass(frozen=True, slots=True)
class ArtifactIdentity:
    """What a checkpoint was produced by; a resume refuses a different identity."""

    provider: str
    model: str
    prompt_version: str | None = None
    parser_version: str | None = None
    application_version: str | None = None

    def __post_init__(self) -> None:
        for name in ("provider", "model"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ConfigurationError(name, value, "must be a non-empty string")

    def to_dict(self) -> dict[str, str | None]:
        return {
            "provider": self.provider,
            "model": self.model,
            "prompt_version": self.prompt_version,
            "parser_version": self.parser_version,
            "application_version": self.application_version,
        }
