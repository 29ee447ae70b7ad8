"""Anthropic's prompt caching in the mock: a ``cache_control`` block marks a prefix, written then read.

As Anthropic documents it: the prefix is everything up to and including a block
that carries ``cache_control`` (tools, then system, then messages, in that
order), per model. The first request with a prefix *writes* it
(``cache_creation_input_tokens``); a later one within its TTL (5 minutes, or an
hour with ``"ttl": "1h"``) *reads* it (``cache_read_input_tokens``), and each read
refreshes the TTL. With several breakpoints the longest prefix found is read and
the segments after it are written, each under the TTL of the breakpoint that ends
it. The mock counts a prefix's tokens with its own tokenizer over the prefix's
text (tools and images count none) and has no minimum cacheable length.
Times are the app's clock, so tests are exact under a manual or virtual one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, final

from ._state import mock_token_count

__all__ = ["CacheUse", "PromptCache"]

_TTL_5M = 300.0
_TTL_1H = 3600.0


@final
@dataclass(frozen=True, slots=True)
class CacheUse:
    """What one request read from the cache and wrote to it (by TTL), in tokens."""

    read: int = 0
    written_5m: int = 0
    written_1h: int = 0

    @property
    def written(self) -> int:
        return self.written_5m + self.written_1h


@final
class PromptCache:
    """The prefixes cached so far, with their expiry times, for one app."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._expiry: dict[str, tuple[float, float]] = {}  # prefix key -> (expires at, its TTL)

    def peek(self, model: str, blocks: Sequence[tuple[str, Any]], total_tokens: int) -> int:
        """The tokens a request with ``blocks`` would read from the cache now (nothing changes)."""
        marks = [i for i, (_, block) in enumerate(blocks)
                 if isinstance(block, Mapping) and isinstance(block.get("cache_control"), Mapping)]
        now = self._clock()
        read_at = next((i for i in reversed(marks)
                        if self._expiry.get(_key(model, blocks[: i + 1]), (-1.0, 0.0))[0] > now), None)
        return min(total_tokens, _tokens(blocks[: read_at + 1])) if read_at is not None else 0

    def use(self, model: str, blocks: Sequence[tuple[str, Any]], total_tokens: int) -> CacheUse:
        """Read and write the prefixes ``blocks`` mark (``(text, block)`` in prompt order)."""
        marks = [i for i, (_, block) in enumerate(blocks)
                 if isinstance(block, Mapping) and isinstance(block.get("cache_control"), Mapping)]
        if not marks:
            return CacheUse()
        now = self._clock()
        keys = {i: _key(model, blocks[: i + 1]) for i in marks}
        read_at = next((i for i in reversed(marks) if self._expiry.get(keys[i], (-1.0, 0.0))[0] > now), None)
        read = min(total_tokens, _tokens(blocks[: read_at + 1])) if read_at is not None else 0
        if read_at is not None:
            ttl = self._expiry[keys[read_at]][1]
            self._expiry[keys[read_at]] = (now + ttl, ttl)
        written = {_TTL_5M: 0, _TTL_1H: 0}
        done = read
        for i in marks:
            if read_at is not None and i <= read_at:
                continue
            control = blocks[i][1]["cache_control"]
            ttl = _TTL_1H if control.get("ttl") == "1h" else _TTL_5M
            self._expiry[keys[i]] = (now + ttl, ttl)
            upto = min(total_tokens, _tokens(blocks[: i + 1]))
            written[ttl] += max(0, upto - done)
            done = max(done, upto)
        return CacheUse(read, written[_TTL_5M], written[_TTL_1H])


def _tokens(blocks: Sequence[tuple[str, Any]]) -> int:
    text = "\n".join(t for t, _ in blocks if t)
    return mock_token_count(text) if text else 0


def _key(model: str, blocks: Sequence[tuple[str, Any]]) -> str:
    # The blocks themselves (images, tools included), not only their text: a prefix is its exact content.
    raw = json.dumps([model, [block for _, block in blocks]], sort_keys=True, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()
