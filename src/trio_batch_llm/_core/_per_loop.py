"""One value per running event loop, made on first use: the registries two loops must never share.

An anyio primitive (an ``Event``, a ``CapacityLimiter``) belongs to the loop
that made it, so a registry holding them cannot be a module global: two
``trio.run`` or ``asyncio.run`` calls, in turn or in two threads, would touch
each other's primitives. A ``RunVar`` is anyio's loop-local slot; this wraps
the get-or-create that each such registry needs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar, final

import anyio.lowlevel

__all__ = ["PerLoop"]

T = TypeVar("T")


@final
class PerLoop(Generic[T]):
    """``factory()``'s value for the running event loop, made once per loop when first asked for."""

    __slots__ = ("_factory", "_var")

    def __init__(self, name: str, factory: Callable[[], T]) -> None:
        self._var: anyio.lowlevel.RunVar[T] = anyio.lowlevel.RunVar(name)
        self._factory = factory

    def get(self) -> T:
        """This loop's value; only inside a running event loop."""
        try:
            return self._var.get()
        except LookupError:
            value = self._factory()
            self._var.set(value)
            return value
