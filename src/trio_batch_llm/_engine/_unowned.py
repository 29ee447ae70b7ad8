"""async-batch-llm's batch shape without ``async with``: input held until the processor opens.

``p = ParallelBatchProcessor(config); await p.add_work(item); batch = await p.process_all()``
is structured here because in batch mode every task of the processor lives inside
``process_all()``: the call opens the processor (its task group and close ledger), runs the
batch, and closes it in contract order before it returns (a failed close raises, as at the
end of an ``async with`` block), so nothing outlives the call. Streaming mode has no such
call: its workers run while the caller reads ``results()``, so only a block can own them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Generic, NoReturn, TypeVar, final

import anyio.lowlevel

from .._values._errors import QueueFullError
from .._values._requests import LLMWorkItem, item_id_problem
from ._inputs import DuplicateTracker

__all__ = ["STREAMING_NEEDS_A_BLOCK", "PendingInput", "StreamBlock", "run_in_own_block"]

T = TypeVar("T")
TOutput = TypeVar("TOutput")

STREAMING_NEEDS_A_BLOCK = (
    "streaming mode needs `async with ParallelBatchProcessor(...) as proc:` first: its workers "
    "keep running while you read results(), and only a block can own tasks that outlive a call "
    "(batch mode, add_work() then process_all(), works without one)"
)


class PendingInput(Generic[TOutput]):
    """Items added before the processor was opened; they are accepted when it opens."""

    __slots__ = ("_ids", "_items", "_max")

    def __init__(self, max_queue_size: int) -> None:
        self._max = max_queue_size
        self._items: list[LLMWorkItem[TOutput]] = []
        self._ids = DuplicateTracker()

    async def add(self, item: LLMWorkItem[TOutput]) -> None:
        # The cheap checks now, so a bad item fails at its add_work() as it would inside a block.
        if not isinstance(item, LLMWorkItem):
            raise TypeError(f"item={item!r}: must be an LLMWorkItem")
        if (problem := item_id_problem(item.item_id)) is not None:
            raise ValueError(f"item_id={item.item_id!r} {problem}")
        if self._max and len(self._items) >= self._max:
            raise QueueFullError(
                f"input queue is full (max_queue_size={self._max}); in batch mode workers start "
                "only in process_all(): use streaming mode (start()) for backpressure"
            )
        self._ids.check(item.item_id)
        self._items.append(item)
        await anyio.lowlevel.checkpoint()

    def drain(self) -> list[LLMWorkItem[TOutput]]:
        items, self._items = self._items, []
        return items


async def run_in_own_block(owner: AbstractAsyncContextManager[Any], run: Callable[[], Awaitable[T]]) -> T:
    """``run()`` inside ``async with owner``: the owner opens and closes within this call."""
    async with owner:
        return await run()


@final
class StreamBlock(AbstractAsyncContextManager[T]):
    """What ``process_stream()`` returns: an async context manager, refused as an async iterator.

    async-batch-llm's ``async for r in process_stream(...)`` fails here at once with the
    form to use, rather than with Python's bare "requires an object with __aiter__".
    """

    __slots__ = ("_block",)

    def __init__(self, block: AbstractAsyncContextManager[T]) -> None:
        self._block = block

    async def __aenter__(self) -> T:
        return await self._block.__aenter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return await self._block.__aexit__(exc_type, exc, tb)

    def __aiter__(self) -> NoReturn:
        raise TypeError(
            "process_stream() is an async context manager here: write `async with "
            "process_stream(...) as results: async for result in results: ...` (a generator "
            "cannot own the tasks that produce its results; see the migration guide)"
        )

