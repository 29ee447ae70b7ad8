"""The result channel between workers and consumers, ending in one durable terminal (CONTRACT C6).

Workers ``put`` results; consumers ``get`` them. The stream ends only through
a terminal decision, made once (the first decision wins):

- success is decided by the consumer that finds the queue empty after every
  producer finished, and only after the owner's ordered close (the
  *finalization*) completed;
- failure is decided by a worker crash, a finalization failure, a cancelled
  finalizer, or a shutdown before ``finish()``.

After a failure, the results that were queued when the first reader saw the
decision are still delivered (one shared limit, fixed then); results put later
are dropped from the stream — they are already in the checkpoint store — so a
busy queue never postpones the failure. Every reader then raises the
original exception instance.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar, final

import anyio
import anyio.lowlevel

from .._values._errors import StreamFinalizationError

__all__ = ["ResultChannel", "ResultChannelStatistics", "ResultIterator"]

T = TypeVar("T")


@final
@dataclass(frozen=True, slots=True)
class ResultChannelStatistics:
    queued: int
    delivered: int
    max_size: int
    producers_done: bool
    decided: str | None
    readers_waiting: int
    writers_waiting: int


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_SUCCESS = object()


@final
class _Waiters:
    """The tasks of one side parked until the other side moves: one Event, made by the first to
    park, set (and dropped) to wake them all; each re-checks what it waited for."""

    __slots__ = ("count", "event")

    def __init__(self) -> None:
        self.event: anyio.Event | None = None
        self.count = 0

    async def wait(self) -> None:
        if self.event is None:
            self.event = anyio.Event()
        event = self.event
        self.count += 1
        try:
            await event.wait()
        finally:
            self.count -= 1

    def wake(self) -> None:
        if self.event is not None:
            self.event.set()
            self.event = None


class ResultChannel(Generic[T]):
    """A bounded (``max_size`` > 0) or unbounded (0) queue with a terminal decision."""

    def __init__(self, max_size: int, finalize: Callable[[], Awaitable[None]]) -> None:
        self._queue: deque[T] = deque()
        self._max = max_size
        self._finalize = finalize
        self._decision: object | None = None
        self._limit: int | None = None
        self._delivered = 0
        self._producers_done = False
        self._finalizing = False
        self._readers = _Waiters()
        self._writers = _Waiters()
        self.failure_delivered = False
        """Whether some reader has raised the failure terminal (so nobody else must report it)."""

    # --- producer side -------------------------------------------------

    async def put(self, item: T) -> None:
        """Queue ``item``; waits while the queue is full; dropped once a terminal is decided."""
        while self._max and len(self._queue) >= self._max and self._decision is None:
            await self._writers.wait()
        if self._decision is not None:
            await anyio.lowlevel.checkpoint()
            return
        self._queue.append(item)
        self._wake_readers()
        await anyio.lowlevel.checkpoint()

    def preload(self, items: Iterable[T]) -> None:
        """Queue ``items`` before the stream runs: results published before it started (replays).

        They are published already, so the bound does not apply to them.
        """
        if self._decision is not None or self._delivered:
            raise RuntimeError("preload() after the stream started")
        self._queue.extend(items)

    def producers_finished(self) -> None:
        """Every producer is done: the next reader to find the queue empty finalizes."""
        self._producers_done = True
        self._wake_readers()

    # --- decisions -----------------------------------------------------

    def decide_failure(self, exc: BaseException) -> bool:
        """Decide a failure terminal unless one was decided already; ``True`` if this call won."""
        if self._decision is not None:
            return False
        self._decision = _Failure(exc)
        self._settle()
        return True

    def _decide_success(self) -> None:
        if self._decision is None:
            self._decision = _SUCCESS
            self._settle()

    def _settle(self) -> None:
        self._readers.wake()
        self._writers.wake()

    # --- consumer side -------------------------------------------------

    async def get(self) -> T:
        """The next result; raises ``anyio.EndOfStream`` after success, or the original failure."""
        while True:
            decision = self._decision
            if isinstance(decision, _Failure):
                if self._limit is None:
                    self._limit = self._delivered + len(self._queue)
                if self._delivered < self._limit and self._queue:
                    return await self._pop()
                await anyio.lowlevel.checkpoint()
                self.failure_delivered = True
                raise decision.exc
            if self._queue:
                return await self._pop()
            if decision is _SUCCESS:
                await anyio.lowlevel.checkpoint()
                raise anyio.EndOfStream
            if self._producers_done and not self._finalizing:
                await self._run_finalization()
                continue
            await self._readers.wait()

    async def _pop(self) -> T:
        item = self._queue.popleft()
        self._delivered += 1
        if self._writers.event is not None:  # (checked here: the common case, nobody waiting, costs no call)
            self._writers.wake()
        await anyio.lowlevel.checkpoint()
        return item

    async def _run_finalization(self) -> None:
        self._finalizing = True
        try:
            await self._finalize()
        except anyio.get_cancelled_exc_class() as exc:
            failure = StreamFinalizationError("stream finalization was cancelled")
            failure.__cause__ = exc
            self.decide_failure(failure)
            raise
        except BaseException as exc:
            self.decide_failure(exc)
            raise
        self._decide_success()

    def _wake_readers(self) -> None:
        if self._readers.event is not None:
            self._readers.wake()

    def statistics(self) -> ResultChannelStatistics:
        decision = self._decision
        decided = None if decision is None else ("success" if decision is _SUCCESS else "failure")
        return ResultChannelStatistics(
            queued=len(self._queue),
            delivered=self._delivered,
            max_size=self._max,
            producers_done=self._producers_done,
            decided=decided,
            readers_waiting=self._readers.count,
            writers_waiting=self._writers.count,
        )


@final
class ResultIterator(AsyncIterator[T]):
    """One consumer's view of a channel: its results, then the terminal (the end, or the failure)."""

    __slots__ = ("_channel",)

    def __init__(self, channel: ResultChannel[T]) -> None:
        self._channel = channel

    def __aiter__(self) -> ResultIterator[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self._channel.get()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None
