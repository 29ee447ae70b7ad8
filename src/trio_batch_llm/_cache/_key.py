"""A request's cache key: the SHA-256 of its canonical JSON (provider, model, the whole request, a sample).

The strategy says what its request is made of (``LLMCallStrategy.cache_key_material``);
the item's ``sample`` index is added, so k items equal but for it are k entries.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from ._records import CacheKey

__all__ = ["request_key"]

KEY_VERSION = 1
"""Part of every key: a change in how keys are made starts a fresh key space (old entries miss)."""


def request_key(material: Mapping[str, Any], sample: int = 0) -> CacheKey:
    """The key of ``material`` (the strategy's canonical request) as its ``sample``-th sample."""
    canonical = {"v": KEY_VERSION, "sample": sample, "request": material}
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return CacheKey(hashlib.sha256(text.encode("utf-8")).hexdigest(), canonical)
