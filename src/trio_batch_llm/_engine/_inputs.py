"""Turn what users pass as ``prompts`` into work items, rejecting bad input before work starts."""

from __future__ import annotations

from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Generic, TypeVar

import anyio
import anyio.lowlevel

from .._strategies._base import LLMCallStrategy
from .._values._errors import AdmissionClosedError
from .._values._item_checks import MAX_NESTING_DEPTH, check_item, nesting_exceeds, surrogate_problem
from .._values._prompts import LLMRequest, row_problem
from .._values._requests import LLMWorkItem, check_params, check_prompt, checked_items, item_id_problem

__all__ = [
    "CheckedItems",
    "DuplicateTracker",
    "aiter_items",
    "check_work_item",
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
    check_work_item(item, f"prompts[{index}]", source=True)
    return item


def check_work_item(item: LLMWorkItem[Any], where: str, *, source: bool = False) -> None:
    """The one check of an item at its way in (``where``: ``add_work``, ``submit``, ``prompts[i]``),
    before any call: its prompt and context (lone surrogates, nesting), its messages and params (made
    canonical, once), and its strategy able to send it. ``ValueError``/``TypeError`` naming the item;
    ``source``: its errors also say where in the source it stood.

    Whoever takes an item checked here (a processor's intake, from a source checked whole or lazily:
    :class:`CheckedItems`, :class:`aiter_items`) does not check it again.
    """
    prompt = item.prompt
    check_item(item.item_id, prompt if isinstance(prompt, str) else item.prompt_text, item.context,
               where=where if source else None)
    # Its messages and params checked (and made canonical), and its strategy able to send them.
    if not isinstance(item.prompt, str) or item.params:
        place = f"{where} (item_id={item.item_id!r})"
        item.prompt = check_prompt(item.prompt, place)
        item.params = check_params(item.params, place) or None
    problem = item.strategy.request_problem(item.request)
    if problem is not None:
        raise ValueError(f"{where} (item_id={item.item_id!r}): {problem}")


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
        context: object = entry[2] if len(entry) == 3 else None
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
        """Record ``item_id``; ``ValueError`` if it was recorded already."""
        if generated:
            if item_id in self._explicit:
                raise _duplicate(item_id)
            self._generated_below = max(self._generated_below, index + 1)
            return
        if item_id in self._explicit or self._spells_generated(item_id):
            raise _duplicate(item_id)
        self._explicit.add(item_id)

    def check_entry(self, item_id: str, entry: object, index: int) -> None:
        """:meth:`check` for the ``index``-th entry of a source (texts get generated ids); errors name it."""
        try:
            self.check(item_id, generated=isinstance(entry, str), index=index)
        except ValueError as exc:
            raise ValueError(f"prompts[{index}]: {exc}") from None

    @classmethod
    def of(cls, *, explicit: set[str] | None = None, generated: int = 0) -> DuplicateTracker:
        """A record of ids checked unique already: ``explicit`` ones, and ``item-0 .. item-(generated-1)``."""
        tracker = cls()
        tracker._explicit = explicit if explicit is not None else set()
        tracker._generated_below = generated
        return tracker

    def absorb(self, other: DuplicateTracker) -> None:
        """Record every id of ``other`` (unique among themselves); ``ValueError`` for one recorded here."""
        if not self._explicit and not self._generated_below:  # the usual case: a processor's first input
            self._explicit, self._generated_below = set(other._explicit), other._generated_below
            return
        clashes = (self._explicit & other._explicit
                   | {i for i in other._explicit if self._spells_generated(i)}
                   | {i for i in self._explicit if other._spells_generated(i)})
        if clashes:
            raise _duplicate(min(clashes))
        self._explicit |= other._explicit
        self._generated_below = max(self._generated_below, other._generated_below)

    def forget(self, item_id: str) -> None:
        """An explicit id checked but then not accepted (a full queue): it may come again."""
        self._explicit.discard(item_id)

    def _spells_generated(self, item_id: str) -> bool:
        if not item_id.startswith("item-"):
            return False
        digits = item_id[5:]
        return digits.isdigit() and str(int(digits)) == digits and int(digits) < self._generated_below


def _duplicate(item_id: str) -> ValueError:
    return ValueError(f"duplicate item_id={item_id!r}: every item needs a unique id")


@dataclass(frozen=True, slots=True)
class CheckedItems(Generic[TOutput]):
    """A finite source checked whole (each item once): its items, and the record of their ids.

    Whoever takes these items (a processor's intake) takes the verdict too and
    checks none of them again.
    """

    items: list[LLMWorkItem[TOutput]]
    ids: DuplicateTracker


def items_from_sequence(
    prompts: Iterable[object], strategy: LLMCallStrategy[TOutput]
) -> CheckedItems[TOutput]:
    """Convert and validate a whole (finite, sync) source up front: each item once, before any call.

    A list of plain texts, or of ``(id, prompt[, context])`` tuples with text prompts, is checked
    column by column at C speed (types, ids, surrogates, nesting, duplicates as sets); anything
    else, or any column that fails, is checked entry by entry, which names the first bad entry.
    """
    entries = prompts if isinstance(prompts, (list, tuple)) else list(prompts)
    fast = _texts(entries, strategy) if entries else None
    if fast is None and entries:
        fast = _tuples(entries, strategy)
    if fast is not None:
        return fast
    tracker = DuplicateTracker()
    items = []
    for index, entry in enumerate(entries):
        item = to_item(entry, index, strategy)
        tracker.check_entry(item.item_id, entry, index)
        items.append(item)
    return CheckedItems(items, tracker)


def _texts(entries: Sequence[object], strategy: LLMCallStrategy[TOutput]) -> CheckedItems[TOutput] | None:
    """A list of ``str`` (exactly), all fine: its items; else ``None`` (the entry-by-entry check says why)."""
    if set(map(type, entries)) != {str}:
        return None
    prompts: Sequence[str] = entries  # type: ignore[assignment]
    if not _all_sendable(prompts, strategy):
        return None
    ids = [f"item-{index}" for index in range(len(prompts))]
    return CheckedItems(checked_items(strategy, ids, prompts), DuplicateTracker.of(generated=len(prompts)))


def _tuples(entries: Sequence[object], strategy: LLMCallStrategy[TOutput]) -> CheckedItems[TOutput] | None:
    """A list of ``(id, text)`` / ``(id, text, context)`` tuples, all fine: its items; else ``None``."""
    if set(map(type, entries)) != {tuple}:
        return None
    rows: Sequence[tuple[Any, ...]] = entries  # type: ignore[assignment]
    lengths = set(map(len, rows))
    if not lengths <= {2, 3}:
        return None
    ids: list[Any] = list(map(itemgetter(0), rows))
    unique = set(ids) if set(map(type, ids)) == {str} else None
    # Unique, non-empty and valid Unicode: the rule of item_id_problem, for all ids at once.
    if unique is None or len(unique) != len(ids) or "" in unique or not _no_surrogates(ids):
        return None
    prompts: list[Any] = list(map(itemgetter(1), rows))
    if set(map(type, prompts)) != {str} or not _all_sendable(prompts, strategy):
        return None
    contexts = None if lengths == {2} else [row[2] if len(row) == 3 else None for row in rows]
    # The list is one level more: it nests too deep exactly when one of its contexts does.
    if contexts is not None and nesting_exceeds(contexts, MAX_NESTING_DEPTH + 1):
        return None
    return CheckedItems(checked_items(strategy, ids, prompts, contexts), DuplicateTracker.of(explicit=unique))


def _no_surrogates(texts: Sequence[str]) -> bool:
    joined = "".join(texts)
    return joined.isascii() or surrogate_problem(joined) is None


def _all_sendable(prompts: Sequence[str], strategy: LLMCallStrategy[TOutput]) -> bool:
    """Text prompts without params: free of lone surrogates, and each one the strategy can send."""
    if not isinstance(strategy, LLMCallStrategy) or not _no_surrogates(prompts):
        return False
    if type(strategy).request_problem is LLMCallStrategy.request_problem:
        return True  # the default takes every text prompt without params: nothing to ask per item
    problem = strategy.request_problem
    return all(problem(LLMRequest(prompt, {})) is None for prompt in prompts)


class aiter_items(AsyncIterator[LLMWorkItem[TOutput]]):
    """Convert a sync or async source lazily, rejecting duplicates as they appear.

    A class, not an async generator: a consumer cancelled mid-iteration leaves
    nothing to finalize (the source itself is closed by its owner).
    """

    __slots__ = ("_async", "_checked", "_index", "_iterator", "_source", "_strategy", "_tracker")

    def __init__(
        self, prompts: Iterable[object] | AsyncIterable[object] | CheckedItems[TOutput],
        strategy: LLMCallStrategy[TOutput],
    ) -> None:
        self._tracker = DuplicateTracker()
        self._index = 0
        self._checked = checked = prompts if isinstance(prompts, CheckedItems) else None
        source = checked.items if checked is not None else prompts
        self._source = source
        self._strategy = strategy
        self._async = isinstance(source, AsyncIterable)
        self._iterator: Iterator[object] | AsyncIterator[object] = (
            aiter(source) if isinstance(source, AsyncIterable) else iter(source)  # type: ignore[arg-type]
        )

    def __aiter__(self) -> aiter_items[TOutput]:
        return self

    def check_ids_with(self, tracker: DuplicateTracker) -> None:
        """Check ids against ``tracker`` (a processor's, before the first read): one record of the ids.

        A source checked whole already (:class:`CheckedItems`) records all its ids there now.
        """
        if self._checked is not None:
            tracker.absorb(self._checked.ids)
        self._tracker = tracker

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
        if self._checked is not None:  # checked whole, ids too, before the stream began
            return entry  # type: ignore[return-value]  # noqa: ASYNC910
        item = to_item(entry, self._index, self._strategy)
        self._tracker.check_entry(item.item_id, entry, self._index)
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
