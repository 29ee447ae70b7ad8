"""The connection protocol every response-cache backend implements (SQLite, PostgreSQL, Redis, memory)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import final

import anyio.lowlevel

from ._records import CachedAnswer, CacheKey

__all__ = ["CacheConnection", "CacheStats"]


@final
@dataclass(frozen=True, slots=True)
class CacheStats:
    """What a cache holds (``trio-batch-llm cache stats``): entries live or expired but not yet
    deleted, their approximate size in bytes (``None``: the backend cannot tell), and when the
    oldest and the newest were written (Unix seconds; ``None`` when empty)."""

    entries: int
    bytes: int | None = None
    oldest: float | None = None
    newest: float | None = None


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

    # The operator's two questions (``trio-batch-llm cache stats|clear``); a backend that cannot
    # answer them yet keeps these defaults, and the command says so.

    async def stats(self) -> CacheStats:
        """How many entries the cache holds, their size and age."""
        await anyio.lowlevel.checkpoint()
        raise NotImplementedError(f"{type(self).__name__} cannot count its entries yet")

    async def clear(self, *, older_than: float | None = None) -> int:
        """Delete every entry (claims untouched), or those written more than ``older_than``
        seconds ago; the number deleted."""
        await anyio.lowlevel.checkpoint()
        raise NotImplementedError(f"{type(self).__name__} cannot clear its entries yet")
