"""User callables that may be sync or async: telling which, and calling either."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import anyio.lowlevel

__all__ = ["call_sync_or_async", "is_async_callable"]


def is_async_callable(fn: object) -> bool:
    """Whether ``fn(...)`` makes a coroutine: an ``async def``, or an object with ``async def __call__``."""
    if inspect.iscoroutinefunction(fn):
        return True
    return not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__)


async def call_sync_or_async(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, awaited if it returned an awaitable; checkpoints either way."""
    value = fn(*args)
    if inspect.isawaitable(value):
        return await value
    await anyio.lowlevel.checkpoint()
    return value
