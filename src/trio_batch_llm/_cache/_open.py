"""Open a connection to the backend a :class:`ResponseCache` value names (the backend modules load lazily)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.lowlevel

from .._values._response_cache import (
    MemoryResponseCache,
    PostgresResponseCache,
    RedisResponseCache,
    ResponseCache,
    SqliteResponseCache,
)
from ._connection import CacheConnection

__all__ = ["connect_cache", "open_cache"]


async def connect_cache(config: ResponseCache) -> CacheConnection:
    """A new open connection for ``config``; the caller closes it (``aclose``)."""
    if isinstance(config, MemoryResponseCache):
        from ._memory import MemoryCacheConnection

        await anyio.lowlevel.checkpoint()
        return MemoryCacheConnection(config)
    if isinstance(config, SqliteResponseCache):
        from ._sqlite import SqliteCacheConnection  # type: ignore[import-not-found,unused-ignore]

        return await SqliteCacheConnection.open(config)  # type: ignore[no-any-return,unused-ignore]
    if isinstance(config, PostgresResponseCache):
        from ._postgres import PostgresCacheConnection  # type: ignore[import-not-found,unused-ignore]

        return await PostgresCacheConnection.open(config)  # type: ignore[no-any-return,unused-ignore]
    if isinstance(config, RedisResponseCache):
        from ._redis import RedisCacheConnection  # type: ignore[import-not-found,unused-ignore]

        return await RedisCacheConnection.open(config)  # type: ignore[no-any-return,unused-ignore]
    raise TypeError(f"no backend for {type(config).__name__}")


@asynccontextmanager
async def open_cache(config: ResponseCache) -> AsyncIterator[CacheConnection]:
    """A connection to ``config`` for the ``async with`` block, closed (bounded, shielded) after it."""
    connection = await connect_cache(config)
    try:
        yield connection
    finally:
        with anyio.CancelScope(shield=True) as scope:
            scope.deadline = anyio.current_time() + 5.0
            await connection.aclose()
