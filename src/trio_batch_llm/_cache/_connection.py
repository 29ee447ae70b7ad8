"""The connection protocol every response-cache backend implements (SQLite, PostgreSQL, Redis, memory)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from ._records import CachedAnswer, CacheKey

__all__ = ["CacheConnection"]


class CacheConnection(ABC):
    """One owner's open connection to a cache. Opened by :func:`~._open.open_cache`, closed by it.

    Entries are written whole or not at all (a crash mid-write leaves no half entry). ``claim``
    is the cross-process half of single flight: one holder at a time per key, for ``seconds``
    unless renewed or let go; a holder that dies lets go when its claim expires.
    """

    @abstractmethod
    async def get(self, key: CacheKey) -> CachedAnswer | None:
        """The live entry of ``key`` (not expired by the cache's TTL), or ``None``."""

    @abstractmethod
    async def put(self, key: CacheKey, answer: CachedAnswer) -> None:
        """Write (or overwrite) ``key``'s entry; ``key.request`` is kept only if the cache stores requests."""

    @abstractmethod
    async def claim(self, key: CacheKey, holder: str, seconds: float) -> bool:
        """Take (or renew, if ``holder`` has it) the claim on ``key``; ``False``: another holder has it."""

    @abstractmethod
    async def release(self, key: CacheKey, holder: str) -> None:
        """Let go of ``holder``'s claim on ``key`` (nothing if it has none)."""

    @abstractmethod
    async def aclose(self) -> None:
        """Close the connection. Idempotent."""
