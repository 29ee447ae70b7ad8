"""Run sources: iterables (sync or async) and JSONL files, read from a checkpoint onwards.

A source hands out *raw entries* with their position; turning an entry into an
item (and rejecting a bad one) is :func:`to_new_item`'s job, so every source
reports errors the same way.

* :class:`IterableSource` counts entries. Continuing from a checkpoint skips
  ``position`` entries and checks that the last skipped one has the recorded
  item id. An iterable that is not its own iterator (a list, a tuple) can be
  re-read from the start; a one-shot iterator or generator cannot, so if one
  is interrupted in the middle of producing an entry (an async generator
  cancelled by a pause or a ``wait()`` deadline) the run asks for a fresh
  source (:class:`RunSourceError`).
* :class:`JsonlSource` reads a file in a worker thread by byte offset (the
  cursor), so it can always continue exactly, and fingerprints the file's head
  to refuse continuing in a different file. Each non-blank line is a string
  (the prompt; id ``item-N``) or an object ``{"id", "prompt", "context"}``, the
  command line's JSONL format, read by the command line's reader
  (:func:`~.._values._jsonl_row.read_row`; no ``"sample"`` key yet).
"""

from __future__ import annotations

import abc
import hashlib
import os
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, final

import anyio
import anyio.lowlevel

from .._artifacts._fingerprint import canonical_json, item_fingerprint
from .._engine._inputs import to_item
from .._strategies._base import LLMCallStrategy
from .._values._jsonl_row import RowProblem, decode_row, read_row
from .._values._prompts import request_of_text
from .._values._requests import LLMWorkItem, request_text
from ._schema import NewItem, RunSourceError, SourceCheckpoint

__all__ = ["IterableSource", "JsonlSource", "RawEntry", "RunSource", "make_source", "to_new_item"]

_HEAD_BYTES: Final = 64 * 1024
_JSONL_SUFFIXES: Final = (".jsonl", ".ndjson")


@final
@dataclass(frozen=True, slots=True)
class RawEntry:
    """One entry as read: its 0-based position, the value, and the cursor just after it."""

    position: int
    value: object
    cursor: int | None = None
    start: int | None = None
    """JSONL: the byte offset where the line starts (``value`` is then the raw line)."""


class RunSource(abc.ABC):
    """Reads raw entries; :meth:`seek` must be called before the first :meth:`read`."""

    fingerprint: str | None = None

    @property
    def spent(self) -> bool:
        """Whether reading on is impossible (it raised, or was cancelled mid-entry): seek first."""
        return False

    @abc.abstractmethod
    async def seek(self, checkpoint: SourceCheckpoint) -> None:
        """Continue just after ``checkpoint`` (the next read returns entry ``checkpoint.position``)."""

    @abc.abstractmethod
    async def read(self, limit: int) -> list[RawEntry] | None:
        """Up to ``limit`` (>= 1) entries, at least one; ``None`` at the end of the source."""

    def describe(self) -> str:
        return type(self).__name__


def to_new_item(entry: RawEntry, strategy: LLMCallStrategy[Any], where: str) -> NewItem:
    """Validate ``entry`` and encode what a run stores of it; raises ValueError/TypeError naming it."""
    value = entry.value
    if entry.start is not None:
        value = _parse_jsonl(value, entry, where)
    item = to_item(value, entry.position, strategy)
    if isinstance(value, LLMWorkItem) and value.strategy is not strategy:
        raise TypeError(
            f"{where}: entry {entry.position} (item_id={item.item_id!r}) is an LLMWorkItem with "
            "another strategy; a run calls one strategy for all its items"
        )
    if item.context is None:
        context_json = None
    else:
        try:
            context_json = canonical_json(item.context)
        except (TypeError, ValueError, RecursionError) as exc:
            raise TypeError(
                f"{where}: entry {entry.position} (item_id={item.item_id!r}): its context must be "
                f"JSON-encodable to be stored with the run ({exc})"
            ) from None
    return NewItem(item.item_id, request_text(item.prompt, item.params), context_json, item_fingerprint(item))


def _parse_jsonl(raw: object, entry: RawEntry, where: str) -> object:
    """A line read by the one JSONL row reader (the command line's too), as :func:`to_item` takes it."""
    assert isinstance(raw, bytes)
    place = f"{where}, entry {entry.position} (the line at byte {entry.start})"
    text = decode_row(raw)
    if entry.start == 0 and isinstance(text, str) and text.startswith("\ufeff"):
        text = text[1:]
    row = read_row(text, sample=False, surrogates=False) if isinstance(text, str) else text
    if row is None:  # pragma: no cover - the source hands out non-blank lines only
        raise ValueError(f"{place}: a blank line")
    if isinstance(row, RowProblem):
        field = "" if row.field is None else f", field {row.field!r}"
        raise ValueError(f"{place}{field}: {row.problem}")  # noqa: TRY004 - a refused row, whatever its kind
    item_id, text, context, _ = row
    if item_id is None:
        return text  # a bare prompt: its id is item-N, from its position
    prompt, params = request_of_text(text)
    if params is None and isinstance(prompt, str):
        return (item_id, prompt, context)
    key = "prompt" if isinstance(prompt, str) else "messages"
    return {"id": item_id, key: prompt, "params": params, "context": context}


# --- iterables ---------------------------------------------------------------------


@final
class IterableSource(RunSource):
    """A sync or async iterable of prompts (``str``, ``(id, prompt[, context])`` or LLMWorkItem)."""

    def __init__(self, iterable: Iterable[Any] | AsyncIterable[Any], strategy: LLMCallStrategy[Any]) -> None:
        self._iterable = iterable
        self._strategy = strategy
        self._is_async = isinstance(iterable, AsyncIterable)
        self._iterator: Iterator[Any] | AsyncIterator[Any] | None = None
        self._next_position = 0
        self._broken = False
        self._deferred: Exception | None = None

    @property
    def reopenable(self) -> bool:
        """Whether iterating again starts from the beginning (it is not its own iterator)."""
        if self._is_async:
            return aiter(self._iterable) is not self._iterable  # type: ignore[arg-type]
        return iter(self._iterable) is not self._iterable  # type: ignore[arg-type]

    @property
    def spent(self) -> bool:
        return self._broken

    def describe(self) -> str:
        return f"the source {type(self._iterable).__name__}"

    async def seek(self, checkpoint: SourceCheckpoint) -> None:
        await anyio.lowlevel.checkpoint()
        target = checkpoint.position
        if self._iterator is None or self._broken or self._next_position > target:
            if self._iterator is not None and not self.reopenable:
                raise RunSourceError(
                    f"{self.describe()} was interrupted while producing an entry (or is behind the "
                    f"checkpoint) and cannot be read again; reopen the run with a fresh source, which "
                    f"is fast-forwarded to entry {target}"
                )
            self._iterator = (
                aiter(self._iterable) if self._is_async else iter(self._iterable)  # type: ignore[arg-type]
            )
            self._next_position = 0
            self._broken = False
            self._deferred = None
        last: RawEntry | None = None
        while self._next_position < target:
            batch = await self.read(min(1024, target - self._next_position))
            if batch is None:
                raise RunSourceError(
                    f"{self.describe()} ended after {self._next_position} entries, but the run's "
                    f"checkpoint is at entry {target}: it is not the source the run was started with"
                )
            last = batch[-1]
        if last is not None and checkpoint.last_item_id is not None:
            item_id = to_new_item(last, self._strategy, self.describe()).item_id
            if item_id != checkpoint.last_item_id:
                raise RunSourceError(
                    f"{self.describe()}: entry {last.position} has item_id={item_id!r}, but the run recorded "
                    f"{checkpoint.last_item_id!r} there: it is not the source the run was started with"
                )

    async def read(self, limit: int) -> list[RawEntry] | None:
        iterator = self._iterator
        assert iterator is not None
        if self._is_async:
            # One entry per read: the slicer's time bound is checked between entries.
            self._broken = True  # until the entry arrives: a cancellation here spends the iterator
            try:
                value = await iterator.__anext__()  # type: ignore[union-attr]
            except StopAsyncIteration:
                self._broken = False
                await anyio.lowlevel.checkpoint()
                return None
            # Any other exception leaves it broken: an iterator that raised is spent.
            self._broken = False
            return [self._entry(value)]
        if self._deferred is not None:
            error, self._deferred = self._deferred, None
            self._broken = True
            raise error
        entries: list[RawEntry] = []
        for _ in range(limit):
            try:
                value = next(iterator)  # type: ignore[arg-type]
            except StopIteration:
                break
            except Exception as exc:
                if not entries:
                    self._broken = True
                    raise
                self._deferred = exc  # hand out the entries read before it first
                break
            entries.append(self._entry(value))
        await anyio.lowlevel.checkpoint()
        return entries or None

    def _entry(self, value: object) -> RawEntry:
        entry = RawEntry(self._next_position, value)
        self._next_position += 1
        return entry


# --- JSONL files -------------------------------------------------------------------


def _file_fingerprint(path: Path, length: int | None) -> str:
    with path.open("rb") as f:
        head = f.read(_HEAD_BYTES if length is None else length)
    return f"sha256:{len(head)}:{hashlib.sha256(head).hexdigest()}"


def _read_lines(path: Path, offset: int, limit: int) -> tuple[list[tuple[bytes, int, int]], bool]:
    """Up to ``limit`` non-blank lines from ``offset``: ``([(raw, start, end)], at end of file)``."""
    lines: list[tuple[bytes, int, int]] = []
    with path.open("rb") as f:
        f.seek(offset)
        while len(lines) < limit:
            raw = f.readline()
            if not raw:
                return lines, True
            start, offset = offset, offset + len(raw)
            if raw.strip() and raw.strip() != b"\xef\xbb\xbf":
                lines.append((raw, start, offset))
    return lines, False


@final
class JsonlSource(RunSource):
    """A JSONL file of prompts, read by byte offset in a worker thread."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = Path(path)
        self._offset = 0
        self._position = 0
        self._at_end = False
        self._seeked = False

    def describe(self) -> str:
        return str(self._path)

    async def seek(self, checkpoint: SourceCheckpoint) -> None:
        if not await anyio.Path(self._path).is_file():
            raise RunSourceError(f"{self._path}: no such input file")
        stored = checkpoint.fingerprint
        length = int(stored.split(":")[1]) if stored else None
        current = await anyio.to_thread.run_sync(_file_fingerprint, self._path, length)
        if stored is not None and current != stored:
            raise RunSourceError(
                f"{self._path}: the file's first {length} bytes changed since the run's checkpoint; "
                "a run continues only in the input it started with"
            )
        self.fingerprint = stored or current
        self._offset = checkpoint.cursor or 0
        self._position = checkpoint.position
        self._at_end = False
        self._seeked = True

    async def read(self, limit: int) -> list[RawEntry] | None:
        assert self._seeked
        if self._at_end:
            await anyio.lowlevel.checkpoint()
            return None
        try:
            lines, at_end = await anyio.to_thread.run_sync(_read_lines, self._path, self._offset, limit)
        except OSError as exc:
            raise RunSourceError(f"{self._path}: cannot read it: {exc}") from exc
        entries = []
        for raw, start, end in lines:
            entries.append(RawEntry(self._position, raw, cursor=end, start=start))
            self._position += 1
            self._offset = end
        if at_end:
            self._at_end = True
        return entries or None


def make_source(source: object, strategy: LLMCallStrategy[Any]) -> RunSource | None:
    """Wrap what the user passed: ``None``, a JSONL path, or an iterable of prompts."""
    if source is None or isinstance(source, RunSource):
        return source
    if isinstance(source, os.PathLike) or (
        isinstance(source, str) and source.lower().endswith(_JSONL_SUFFIXES)
    ):
        return JsonlSource(os.fspath(source))
    if isinstance(source, (str, bytes, bytearray)):
        raise TypeError(
            f"source={source[:40]!r}: pass an iterable of prompts, or a JSONL file as a pathlib.Path"
        )
    if not isinstance(source, (Iterable, AsyncIterable)):
        raise TypeError(f"source={source!r}: must be an iterable of prompts, a JSONL path, or None")
    return IterableSource(source, strategy)
