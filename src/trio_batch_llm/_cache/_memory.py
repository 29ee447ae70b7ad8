"""The in-memory cache backend (:class:`MemoryResponseCache`): a dict shared by the owners given one value."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio.lowlevel

from .._values._response_cache import MemoryResponseCache
from ._connection import CacheConnection, CacheStats
from ._records import CachedAnswer, CacheKey

__all__ = ["MemoryCacheConnection"]

_CLAIMS = "\x00claims"
"""The entries dict's slot for claims (holder, until): one value carries both."""


class MemoryCacheConnection(CacheConnection):
    """Entries in ``config.entries`` (digest -> (answer, request)); claims beside them."""

    def __init__(self, config: MemoryResponseCache, *, clock: Callable[[], float] = time.monotonic) -> None:
        """``clock``: the seconds claims expire by (tests pass the event loop's virtual clock)."""
        self._config = config
        self._clock = clock
        self._entries: dict[str, Any] = config.entries

    def _claims(self) -> dict[str, tuple[str, float]]:
        claims: dict[str, tuple[str, float]] = self._entries.setdefault(_CLAIMS, {})
        return claims

    async def get(self, key: CacheKey) -> CachedAnswer | None:
        await anyio.lowlevel.checkpoint()
        found = self._entries.get(key.digest)
        if found is None:
            return None
        answer: CachedAnswer = found[0]
        ttl = self._config.ttl
        if ttl is not None and answer.created_at + ttl <= time.time():
            return None
        return answer

    async def put(self, key: CacheKey, answer: CachedAnswer) -> None:
        await anyio.lowlevel.checkpoint()
        request = dict(key.request) if self._config.store_request else None
        self._entries[key.digest] = (answer, request)

    async def claim(self, key: CacheKey, holder: str, seconds: float) -> bool:
        await anyio.lowlevel.checkpoint()
        claims = self._claims()
        now = self._clock()
        held = claims.get(key.digest)
        if held is not None and held[0] != holder and held[1] > now:
            return False
        claims[key.digest] = (holder, now + seconds)
        return True

    async def release(self, key: CacheKey, holder: str) -> None:
        await anyio.lowlevel.checkpoint()
        claims = self._claims()
        held = claims.get(key.digest)
        if held is not None and held[0] == holder:
            del claims[key.digest]

    async def aclose(self) -> None:
        await anyio.lowlevel.checkpoint()

    def _answers(self) -> dict[str, CachedAnswer]:
        return {digest: found[0] for digest, found in self._entries.items() if digest != _CLAIMS}

    async def stats(self) -> CacheStats:
        await anyio.lowlevel.checkpoint()
        written = [answer.created_at for answer in self._answers().values()]
        return CacheStats(len(written), None, min(written, default=None), max(written, default=None))

    async def clear(self, *, older_than: float | None = None) -> int:
        await anyio.lowlevel.checkpoint()
        cutoff = None if older_than is None else time.time() - older_than
        gone = [digest for digest, answer in self._answers().items()
                if cutoff is None or answer.created_at < cutoff]
        for digest in gone:
            del self._entries[digest]
        return len(gone)
