"""What the response cache keys and keeps: a request's key and a validated answer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, final

__all__ = ["CacheKey", "CachedAnswer"]


@final
@dataclass(frozen=True, slots=True)
class CacheKey:
    """A request's identity in the cache: ``digest`` (SHA-256 hex of the canonical request) is the key;
    ``request`` is what it was made of (canonical JSON-able), stored only when the cache keeps requests."""

    digest: str
    request: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


@final
@dataclass(frozen=True, slots=True)
class CachedAnswer:
    """A provider's validated answer as the cache keeps it (plain JSON throughout).

    ``output``: the item's output as a checkpoint store keeps it (``decode_output`` gives it back);
    ``usage``: the tokens the original call used; ``metadata``: the call's metadata (details
    under their key); ``model``: the model that answered; ``created_at``: Unix seconds it was written.
    """

    output: Any
    usage: Mapping[str, int] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    model: str | None = None
    created_at: float = 0.0
