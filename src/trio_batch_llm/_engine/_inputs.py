"""Turn what users pass as ``prompts`` into work items, rejecting bad input before work starts."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import anyio
import anyio.lowlevel

from .._strategies._base import LLMCallStrategy
from .._values._errors import AdmissionClosedError
from .._values._item_checks import check_item
from .._values._prompts import row_problem
from .._values._requests import LLMWorkItem, check_params, check_prompt, item_id_problem

__all__ = [
    "aiter_items",
    "check_request",
    "feed_items",
    "is_sized_source",
    "item_of_mapping",
    "items_from_sequence",
    "validate_source",
]

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
    """One entry, checked: ``str``, ``(id, prompt[, context])``, a mapping or ``LLMWorkItem``."""
    item = _to_item(entry, index, strategy)
    where = f"prompts[{index}]"
    check_item(item.item_id, item.prompt_text if not isinstance(item.prompt, str) else item.prompt,
               item.context, where=where)
    check_request(item, where)
    return item


def check_request(item: LLMWorkItem[Any], where: str) -> None:
    """An item's messages and params checked, and its strategy able to send them: before any call."""
    place = f"{where} (item_id={item.item_id!r})"
    if not isinstance(item.prompt, str) or item.params:
        item.prompt = check_prompt(item.prompt, place)
        item.params = check_params(item.params, place) or None
    problem = item.strategy.request_problem(item.request)
    if problem is not None:
        raise ValueError(f"{place}: {problem}")


def item_of_mapping(entry: Mapping[Any, Any], index: int, strategy: LLMCallStrategy[TOutput],
                    where: str) -> LLMWorkItem[TOutput]:
    """``{"id", "prompt"|"messages", "params", "context"}`` as an item (``item_id`` is taken for ``id``)."""
    found = row_problem(entry)  # the rule every reader shares (the command line's, a run's source)
    if found is not None:
        raise ValueError(f"{where}, field {found[0]!r}: {found[1]}")
    item_id = entry.get("id", entry.get("item_id", f"item-{index}"))
    problem = item_id_problem(item_id)
    if problem is not None:
        raise ValueError(f"{where}: id={item_id!r} {problem}")
    prompt = entry["prompt"] if "prompt" in entry else entry["messages"]
    if "prompt" in entry and not isinstance(prompt, str):
        raise TypeError(f'{where} (item_id={item_id!r}): "prompt"={prompt!r:.80} must be a str '
                        '(chat messages go in "messages")')
    if "messages" in entry and isinstance(prompt, str):
        raise TypeError(f'{where} (item_id={item_id!r}): "messages" must be a list of chat messages '
                        '(a text prompt goes in "prompt")')
    return LLMWorkItem(item_id=item_id, strategy=strategy, prompt=prompt, context=entry.get("context"),
                       params=entry.get("params"))


def _to_item(entry: object, index: int, strategy: LLMCallStrategy[TOutput]) -> LLMWorkItem[TOutput]:
    if isinstance(entry, LLMWorkItem):
        _check_id(entry.item_id, index)
        return entry
    if isinstance(entry, str):
        return LLMWorkItem(item_id=f"item-{index}", strategy=strategy, prompt=entry)
    if isinstance(entry, Mapping):
        return item_of_mapping(entry, index, strategy, f"prompts[{index}]")
    if isinstance(entry, tuple) and len(entry) in (2, 3):
        item_id, prompt = entry[0], entry[1]
        context: Any = entry[2] if len(entry) == 3 else None
        _check_id(item_id, index)
        if not isinstance(prompt, (str, list)):
            raise TypeError(f"prompts[{index}] (item_id={item_id!r}): prompt={prompt!r} must be a str "
                            "or a list of chat messages")
        return LLMWorkItem(item_id=item_id, strategy=strategy, prompt=prompt, context=context)
    raise TypeError(
        f"prompts[{index}]={entry!r}: expected a str, (item_id, prompt), "
        "(item_id, prompt, context), a mapping {\"id\", \"prompt\"|\"messages\", \"params\", \"context\"} "
        "or LLMWorkItem"
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

    __slots__ = ("_async", "_index", "_iterator", "_source", "_strategy", "_tracker")

    def __init__(
        self, prompts: Iterable[object] | AsyncIterable[object], strategy: LLMCallStrategy[TOutput]
    ) -> None:
        self._tracker = DuplicateTracker()
        self._index = 0
        self._source = prompts
        self._strategy = strategy
        self._async = isinstance(prompts, AsyncIterable)
        self._iterator: Iterator[object] | AsyncIterator[object] = (
            aiter(prompts) if isinstance(prompts, AsyncIterable) else iter(prompts)
        )

    def __aiter__(self) -> aiter_items[TOutput]:
        return self

    async def aclose(self) -> None:
        """Close the source, if it can be closed (an async generator, for one)."""
        closer = getattr(self._source, "aclose", None)
        if closer is not None:
            await closer()
        else:
            await anyio.lowlevel.checkpoint()

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


async def feed_items(  # noqa: ASYNC910 - add() checkpoints on every path; a source that fails at once ends it
    items: Iterable[LLMWorkItem[TOutput]] | AsyncIterable[LLMWorkItem[TOutput]],
    *,
    add: Callable[[LLMWorkItem[TOutput]], Awaitable[None]],
    finish: Callable[[], Awaitable[None]],
    fail: Callable[[Exception], None],
) -> None:
    """``add`` every item, then ``finish()``; the body of ``ParallelBatchProcessor.feed``'s task.

    A controlled stop (``add`` raises :class:`AdmissionClosedError`) ends the feeding
    quietly; anything else that fails (the source, a bad entry) goes to ``fail``
    (CONTRACT C6.2). ``items`` is closed afterwards, if it can be, within 5 s.
    """
    try:
        try:
            if isinstance(items, AsyncIterable):
                async for item in items:
                    await add(item)
            else:
                for item in items:
                    await add(item)
        except AdmissionClosedError:
            pass  # a controlled stop; queued items are reported as not executed
        await finish()  # a no-op after a controlled stop
    except Exception as exc:  # noqa: BLE001 - ends the stream with this error
        fail(exc)
    finally:
        closer = getattr(items, "aclose", None)
        if closer is not None:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await closer()
