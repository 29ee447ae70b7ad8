"""Cooperative ingestion: read a source ahead, commit it in slices with its checkpoint.

Two halves share a small look-ahead buffer (at most one slice):

* :meth:`Ingestor.read_ahead` (a task of the drive segment) reads raw entries
  from the source into the buffer. It is the only code that waits on the
  source, so a slow source never holds up processing of what was read already.
* :meth:`Ingestor.next_slice` waits for the first entry, then for more until
  the slice has ``slice_items`` entries or ``slice_seconds`` have passed since
  its first one arrived, and commits the slice's items *together with* the
  checkpoint just after them (``repository.ingest``: one transaction).

So a crash at any moment loses nothing and duplicates nothing: entries are
either committed with the checkpoint past them, or neither, and a resumed run
reads again from the checkpoint. Entries stay in the buffer until their commit
returned; a commit whose caller was cancelled after it reached the database is
recognised on the next :meth:`prepare` by the stored checkpoint.

A bad entry (a conversion error) or an exception from the source itself
ends ingestion: the entries before it are committed and handed out first,
then :meth:`next_slice` raises.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any, final

import anyio
import anyio.lowlevel

from .._strategies._base import LLMCallStrategy
from ._schema import NewItem, SourceCheckpoint
from ._source import RawEntry, RunSource, to_new_item
from .repository._client import RepositoryClient

__all__ = ["IngestedItem", "Ingestor"]

IngestedItem = tuple[str, str, Any]  # item_id, prompt, context (decoded from its stored JSON)


def decode_context(context_json: str | None) -> Any:
    return None if context_json is None else json.loads(context_json)


@final
class Ingestor:
    """Ingestion state of one run handle; it outlives drive segments (see the module docstring)."""

    def __init__(
        self,
        source: RunSource,
        strategy: LLMCallStrategy[Any],
        *,
        run_id: str,
        db: RepositoryClient,
        slice_items: int,
        slice_seconds: float,
    ) -> None:
        self._source = source
        self._strategy = strategy
        self._run_id = run_id
        self._db = db
        self._slice_items = slice_items
        self._slice_seconds = slice_seconds
        self._lookahead: deque[RawEntry] = deque()
        self._source_done = False
        self._error: BaseException | None = None
        self._bad_entry = False
        self._changed = anyio.Event()
        self._committed = SourceCheckpoint()

    @property
    def source(self) -> RunSource:
        return self._source

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def prepare(self, checkpoint: SourceCheckpoint) -> None:
        """Line the source up with the stored ``checkpoint`` before a drive segment."""
        self._committed = checkpoint
        self._error = None
        self._bad_entry = False
        target = checkpoint.position
        while self._lookahead and self._lookahead[0].position < target:
            self._lookahead.popleft()  # committed by a commit whose caller was cancelled
        if self._lookahead and self._lookahead[0].position == target and not self._source.spent:
            await anyio.lowlevel.checkpoint()  # the source continues where the buffer ends
            return
        self._lookahead.clear()
        self._source_done = False
        await self._source.seek(checkpoint)

    async def read_ahead(self) -> None:
        """Fill the look-ahead buffer until the source ends or fails (run it as a task)."""
        await anyio.lowlevel.checkpoint()
        while not self._source_done and self._error is None:
            while len(self._lookahead) >= self._slice_items:
                await self._changed.wait()
            try:
                entries = await self._source.read(self._slice_items - len(self._lookahead))
            except Exception as exc:  # noqa: BLE001 - reported by next_slice after the good entries
                self._error = exc
            else:
                if entries is None:
                    self._source_done = True
                else:
                    self._lookahead.extend(entries)
            self._notify()

    async def next_slice(self) -> list[IngestedItem] | None:
        """Commit the next slice and return its items; ``None`` once ingestion is complete."""
        while not self._lookahead and not self._source_done and self._error is None:
            await self._changed.wait()
        if self._lookahead:
            deadline = anyio.current_time() + self._slice_seconds
            while (
                not self._bad_entry
                and len(self._lookahead) < self._slice_items
                and not self._source_done
                and self._error is None
                and anyio.current_time() < deadline
            ):
                with anyio.move_on_at(deadline):
                    await self._changed.wait()
            return await self._commit_slice()
        if self._error is not None:
            raise self._error
        if not self._committed.exhausted:
            await self._commit([], [], self._committed_with(exhausted=True))
        else:
            await anyio.lowlevel.checkpoint()
        return None

    def _committed_with(self, *, exhausted: bool) -> SourceCheckpoint:
        c = self._committed
        return SourceCheckpoint(c.position, c.cursor, c.fingerprint or self._source.fingerprint,
                                c.last_item_id, exhausted)

    async def _commit_slice(self) -> list[IngestedItem]:
        entries = list(self._lookahead)[: self._slice_items]
        items: list[NewItem] = []
        bad: Exception | None = None
        for entry in entries:
            try:
                items.append(to_new_item(entry, self._strategy, self._source.describe()))
            except (TypeError, ValueError) as exc:
                bad = exc
                break
        taken = entries[: len(items)]
        if not taken:
            assert bad is not None
            raise bad
        last = taken[-1]
        exhausted = (
            bad is None and self._error is None and self._source_done and len(taken) == len(self._lookahead)
        )
        checkpoint = SourceCheckpoint(
            position=last.position + 1,
            cursor=last.cursor,
            fingerprint=self._source.fingerprint,
            last_item_id=items[-1].item_id,
            exhausted=exhausted,
        )
        await self._commit(taken, items, checkpoint)
        if bad is not None:
            self._bad_entry = True  # hand out the good entries first; the next call raises
        return [(item.item_id, item.prompt, decode_context(item.context_json)) for item in items]

    async def _commit(
        self, taken: list[RawEntry], items: list[NewItem], checkpoint: SourceCheckpoint
    ) -> None:
        await self._db.call(self._db.repository.ingest, self._run_id, items, checkpoint)
        for _ in taken:
            self._lookahead.popleft()
        self._committed = checkpoint
        self._notify()  # room in the buffer for the reader
