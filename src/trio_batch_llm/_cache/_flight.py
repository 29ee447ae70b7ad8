"""One owner's use of one cache under a :data:`CacheMode`: look a key up, or claim it and settle it.

(Wave-3 vocabulary: no single flight yet; the ``cache`` work makes identical requests in
flight at once wait for one call, in this process and across processes.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

import anyio.lowlevel

from .._values._response_cache import CacheMode, ResponseCache
from ._connection import CacheConnection
from ._records import CachedAnswer, CacheKey

__all__ = ["CacheGate", "Claim"]


@final
@dataclass(slots=True)
class Claim:
    """The caller makes the call for ``key`` and must :meth:`CacheGate.settle` it (in a ``finally``)."""

    key: CacheKey
    settled: bool = False


class CacheGate:
    """Lookups and writes of one owner (a processor, a pool, a run's driver) through one connection."""

    def __init__(self, connection: CacheConnection, config: ResponseCache, mode: CacheMode) -> None:
        self.connection = connection
        self.config = config
        self.mode = mode
        self.reads = mode in ("read-write", "read-only")
        self.writes = mode != "read-only"

    async def lookup(self, key: CacheKey) -> CachedAnswer | Claim:
        """A hit (when the mode reads), or a :class:`Claim`: make the call, then settle it."""
        if self.reads:
            found = await self.connection.get(key)
            if found is not None:
                return found
        else:
            await anyio.lowlevel.checkpoint()
        return Claim(key)

    async def settle(self, claim: Claim, answer: CachedAnswer | None) -> None:
        """The claimed call ended: ``answer`` (a validated success) is written when the mode writes;
        ``None`` (a failure, a cancellation) writes nothing. Call it exactly once per claim."""
        if claim.settled:
            await anyio.lowlevel.checkpoint()
            return
        claim.settled = True
        if answer is not None and self.writes:
            await self.connection.put(claim.key, answer)
        else:
            await anyio.lowlevel.checkpoint()
