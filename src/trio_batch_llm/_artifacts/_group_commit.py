"""Group commit without a background task: many appenders, one write at a time.

Each ``submit()`` puts its record on the pending list and then either *leads*
(no write in progress: take everything pending and write it in the store's
thread) or *waits* for the write in progress to end. When a write ends its
leader settles the batch and sets the ``idle`` event; every waiter wakes, the
ones whose records were written return, and the first one still pending
becomes the next leader and takes what accumulated meanwhile. Nobody else
owns a task: every pending record has a live appender waiting for it, which is
what lets leadership always pass on.

Cancellation (the invariants the tests check):

* A waiter cancelled while its record is still pending withdraws it: the
  record is never written and the append raised.
* Once a batch is handed to the thread, the write runs to completion there
  (``to_thread.run_sync`` does not abandon it); appenders whose records are in
  it may still be cancelled, and their records are durable anyway.
* A leader cancelled before its thread started (waiting for the store's worker gate)
  abandons the batch: the records whose appenders still wait go back to the
  front of the pending list; its own, and those of appenders already gone,
  are dropped (nobody would lead them, and nobody was told they were written). A claim lock decides atomically
  between "started" and "abandoned", so a queued thread job can never write a
  batch that was handed back.
* On asyncio a native ``Task.cancel()`` can unwind a leader while its thread
  is still writing. That batch becomes an *orphan*: the writer slot is
  released, and the next leader settles it after its own thread has passed
  the gate's lock, which it can only take once the orphaned write is finished.
  That lock also keeps two writes from ever overlapping in the file.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar, final

import anyio
import anyio.lowlevel

from .._backends._worker_gate import WorkerGate

__all__ = ["CommitStatistics", "GroupCommitter"]

T = TypeVar("T")


class _EntryState(enum.Enum):
    PENDING = "pending"
    TAKEN = "taken"
    DONE = "done"


class _BatchState(enum.Enum):
    NOT_STARTED = "not_started"
    STARTED = "started"
    FINISHED = "finished"
    ABANDONED = "abandoned"


class _Entry(Generic[T]):
    __slots__ = ("error", "item", "owner_gone", "state")

    def __init__(self, item: T) -> None:
        self.item = item
        self.state = _EntryState.PENDING
        self.error: BaseException | None = None
        # Its appender stopped waiting while the entry was taken; if the batch
        # is handed back, nobody would lead it, so it is dropped instead.
        self.owner_gone = False


class _Batch(Generic[T]):
    __slots__ = ("entries", "error", "state")

    def __init__(self, entries: list[_Entry[T]]) -> None:
        self.entries = entries
        # Written by the thread under the claim lock (state) or before FINISHED (error).
        self.state = _BatchState.NOT_STARTED
        self.error: BaseException | None = None


@final
@dataclass(frozen=True, slots=True)
class CommitStatistics:
    """A snapshot of the committer: how much is waiting, in flight, and written."""

    pending: int
    """Records waiting for the next batch."""
    in_flight: int
    """Records in the batch being written now."""
    writing: bool
    batches_written: int
    """Batches whose write finished (successfully or not)."""
    records_written: int
    """Records in successfully written batches."""
    failed_batches: int


@final
class GroupCommitter(Generic[T]):
    """Batch concurrent ``submit()`` calls into one ``write_batch`` call per write.

    ``write_batch(items)`` runs through the store's worker ``gate`` (a worker
    thread, under the gate's lock); it must write all items or raise. ``wrap_error`` turns the
    exception a failed batch raised into the (fresh) exception each of its
    appenders raises. Construct inside the event loop that will use it.
    """

    def __init__(
        self,
        write_batch: Callable[[Sequence[T]], None],
        *,
        gate: WorkerGate,
        wrap_error: Callable[[BaseException], BaseException],
    ) -> None:
        self._write_batch = write_batch
        self._gate = gate
        self._claim_lock = threading.Lock()
        self._wrap_error = wrap_error
        self._pending: list[_Entry[T]] = []
        self._current: _Batch[T] | None = None
        self._orphans: list[_Batch[T]] = []
        self._idle = anyio.Event()
        self._idle.set()
        self._batches_written = 0
        self._records_written = 0
        self._failed_batches = 0

    def statistics(self) -> CommitStatistics:
        return CommitStatistics(
            pending=len(self._pending),
            in_flight=len(self._current.entries) if self._current is not None else 0,
            writing=self._current is not None,
            batches_written=self._batches_written,
            records_written=self._records_written,
            failed_batches=self._failed_batches,
        )

    async def submit(self, item: T) -> None:
        """Return once ``item`` is written by some batch; raise that batch's error if it failed."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        entry = _Entry(item)
        self._pending.append(entry)
        try:
            while entry.state is not _EntryState.DONE:
                if self._current is None:
                    await self._lead()
                else:
                    await self._idle.wait()
        except BaseException:
            if entry.state is _EntryState.PENDING:
                self._pending.remove(entry)  # never handed to a thread: withdraw it
            else:
                entry.owner_gone = True
            raise
        if entry.error is not None:
            raise self._wrap_error(entry.error)

    async def _lead(self) -> None:
        batch = _Batch(self._pending)
        self._pending = []
        for entry in batch.entries:
            entry.state = _EntryState.TAKEN
        self._current = batch
        self._idle = anyio.Event()
        try:
            await self._gate.run(self._run_batch, batch)
        finally:
            self._finish(batch)

    def _run_batch(self, batch: _Batch[T]) -> None:
        """Thread side, under the gate's lock: write the batch unless the loop side abandoned it first."""
        with self._claim_lock:
            if batch.state is _BatchState.ABANDONED:
                return
            batch.state = _BatchState.STARTED
        written = False
        try:
            if batch.entries:
                self._write_batch([entry.item for entry in batch.entries])
            written = True
        except Exception as exc:  # noqa: BLE001  (delivered to every appender of the batch)
            batch.error = exc
        finally:
            if not written and batch.error is None:
                # A BaseException is escaping to the leader; the appenders still need an answer.
                batch.error = RuntimeError("the batch write was interrupted")
            batch.state = _BatchState.FINISHED

    def _finish(self, batch: _Batch[T]) -> None:
        """Loop side, synchronous: settle, hand back, or orphan the batch; free the writer slot."""
        with self._claim_lock:
            if batch.state is _BatchState.NOT_STARTED:
                batch.state = _BatchState.ABANDONED
        if batch.state is _BatchState.ABANDONED:
            handed_back = [entry for entry in batch.entries if not entry.owner_gone]
            for entry in handed_back:
                entry.state = _EntryState.PENDING
            self._pending[:0] = handed_back
        elif batch.state is _BatchState.FINISHED:
            self._settle(batch)
        else:
            self._orphans.append(batch)
        # Our thread passed the gate's lock, so every earlier orphan has finished.
        for orphan in [b for b in self._orphans if b.state is _BatchState.FINISHED]:
            self._orphans.remove(orphan)
            self._settle(orphan)
        self._current = None
        self._idle.set()

    def _settle(self, batch: _Batch[T]) -> None:
        if not batch.entries:
            return  # an empty batch only waited for an orphan; nothing to count
        self._batches_written += 1
        if batch.error is None:
            self._records_written += len(batch.entries)
        else:
            self._failed_batches += 1
        for entry in batch.entries:
            entry.error = batch.error
            entry.state = _EntryState.DONE
