"""Turn what users pass as ``prompts`` into work items, rejecting bad input before work starts."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from .._strategies._base import LLMCallStrategy
from .._values._item_checks import check_item
from .._values._requests import LLMWorkItem, item_id_problem

__all__ = ["aiter_items", "is_sized_source", "items_from_sequence", "validate_source"]

TOutput = TypeVar("TOutput")


def validate_source(prompts: object) -> None:
    """Reject a source that is clearly not an iterable of prompts (a bare string, bytes, a mapping)."""
    if isinstance(prompts, (str, bytes, bytearray)):
        raise TypeError(
            f"prompts={prompts[:40]!r}: pass an iterable of prompts (e.g. [prompt]), not one string"
        )
    if isinstance(prompts, Mapping):
        raise TypeError("prompts: a mapping is ambiguous; pass its items() as (item_id, prompt) pairs")
    if not isinstance(prompts, (Iterable, AsyncIterable)):
        raise TypeError(f"prompts={prompts!r}: must be a sync or async iterable")


def is_sized_source(prompts: object) -> bool:
    return isinstance(prompts, (list, tuple))


def to_item(entry: object, index: int, strategy: LLMCallStrategy[TOutput]) -> LLMWorkItem[TOutput]:
    """One entry, checked: ``str``, ``(id, prompt[, context])`` or ``LLMWorkItem``."""
    item = _to_item(entry, index, strategy)
    check_item(item.item_id, item.prompt, item.context, where=f"prompts[{index}]")
    return item


def _to_item(entry: object, index: int, strategy: LLMCallStrategy[TOutput]) -> LLMWorkItem[TOutput]:
    if isinstance(entry, LLMWorkItem):
        _check_id(entry.item_id, index)
        return entry
    if isinstance(entry, str):
        return LLMWorkItem(item_id=f"item-{index}", strategy=strategy, prompt=entry)
    if isinstance(entry, tuple) and len(entry) in (2, 3):
        item_id, prompt = entry[0], entry[1]
        context: Any = entry[2] if len(entry) == 3 else None
        _check_id(item_id, index)
        if not isinstance(prompt, str):
            raise TypeError(f"prompts[{index}] (item_id={item_id!r}): prompt={prompt!r} must be a str")
        return LLMWorkItem(item_id=item_id, strategy=strategy, prompt=prompt, context=context)
    raise TypeError(
        f"prompts[{index}]={entry!r}: expected a str, (item_id, prompt), "
        "(item_id, prompt, context) or LLMWorkItem"
    )


def _check_id(item_id: object, index: int) -> None:
    problem = item_id_problem(item_id)
    if problem is not None:
        raise ValueError(f"prompts[{index}]: item_id={item_id!r} {problem}")


class DuplicateTracker:
    """Rejects a repeated id with ``ValueError`` naming it.

    Generated ids (``item-N`` for the N-th entry) are unique by construction,
    so only explicit ids are remembered: a stream of a million bare prompts
    keeps no per-item state here. An explicit id that spells a generated one
    is checked against the generated range.
    """

    __slots__ = ("_explicit", "_generated_below")

    def __init__(self) -> None:
        self._explicit: set[str] = set()
        self._generated_below = 0  # ids item-0 .. item-(n-1) may have been generated

    def check(self, item_id: str, *, generated: bool = False, index: int = 0) -> None:
        if generated:
            if item_id in self._explicit:
                raise ValueError(f"duplicate item_id={item_id!r}: every item needs a unique id")
            self._generated_below = max(self._generated_below, index + 1)
            return
        if item_id in self._explicit or self._spells_generated(item_id):
            raise ValueError(f"duplicate item_id={item_id!r}: every item needs a unique id")
        self._explicit.add(item_id)

    def _spells_generated(self, item_id: str) -> bool:
        if not item_id.startswith("item-"):
            return False
        digits = item_id[5:]
        return digits.isdigit() and str(int(digits)) == digits and int(digits) < self._generated_below


def items_from_sequence(
    prompts: Iterable[object], strategy: LLMCallStrategy[TOutput]
) -> list[LLMWorkItem[TOutput]]:
    """Convert and validate a whole (finite, sync) source up front."""
    tracker = DuplicateTracker()
    items = []
    for index, entry in enumerate(prompts):
        item = to_item(entry, index, strategy)
        tracker.check(item.item_id, generated=isinstance(entry, str), index=index)
        items.append(item)
    return items


class aiter_items(AsyncIterator[LLMWorkItem[TOutput]]):
    """Convert a sync or async source lazily, rejecting duplicates as they appear.

    A class, not an async generator: a consumer cancelled mid-iteration leaves
    nothing to finalize (the source itself is closed by its owner).
    """

    __slots__ = ("_async", "_index", "_iterator", "_strategy", "_tracker")

    def __init__(
        self, prompts: Iterable[object] | AsyncIterable[object], strategy: LLMCallStrategy[TOutput]
    ) -> None:
        self._tracker = DuplicateTracker()
        self._index = 0
        self._strategy = strategy
        self._async = isinstance(prompts, AsyncIterable)
        self._iterator: Iterator[object] | AsyncIterator[object] = (
            aiter(prompts) if isinstance(prompts, AsyncIterable) else iter(prompts)
        )

    def __aiter__(self) -> aiter_items[TOutput]:
        return self

    async def __anext__(self) -> LLMWorkItem[TOutput]:  # consumers checkpoint per item
        if self._async:
            entry = await self._iterator.__anext__()  # type: ignore[union-attr]
        else:
            try:
                entry = next(self._iterator)  # type: ignore[arg-type]
            except StopIteration:
                raise StopAsyncIteration from None
        item = to_item(entry, self._index, self._strategy)
        self._tracker.check(item.item_id, generated=isinstance(entry, str), index=self._index)
        self._index += 1
        return item  # noqa: ASYNC910
