"""A processor's input side: check each item (its id too), answer replays, keep the order, queue the rest."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeAlias, TypeVar

import anyio
import anyio.lowlevel
from anyio.streams.memory import MemoryObjectReceiveStream

from .._artifacts import ResumePlan
from .._values._errors import AdmissionClosedError, QueueFullError
from .._values._requests import LLMWorkItem, item_id_problem
from .._values._results import WorkItemResult
from .._values._stats import RunCounters
from ._inputs import CheckedItems, DuplicateTracker, check_work_item
from ._stops import StopPolicy

__all__ = ["Intake", "ItemQueue"]

TOutput = TypeVar("TOutput")

ItemQueue: TypeAlias = MemoryObjectReceiveStream[LLMWorkItem[TOutput]]
"""The receiving end of a processor's input: each worker reads a clone of it."""


class Intake(Generic[TOutput]):
    """The bounded input stream of one processor (``max_queue_size``; 0 is unbounded).

    ``record_order`` keeps the ids in the order they were added (batch results need
    it; a stream of millions keeps no per-item state). ``plan`` is the resume plan of
    the processor's store, once opened.
    """

    __slots__ = ("_counters", "_max", "_record", "ids", "order", "plan", "recv", "send")

    def __init__(self, max_queue_size: int, counters: RunCounters, *, record_order: bool) -> None:
        self._max = max_queue_size
        self._counters = counters
        self._record = record_order
        buffer = max_queue_size or float("inf")
        self.send, self.recv = anyio.create_memory_object_stream[LLMWorkItem[TOutput]](buffer)
        self.order: list[str] = []
        self.plan: ResumePlan | None = None
        self.ids = DuplicateTracker()
        """The ids accepted so far: a repeated one is refused, as every entry point refuses it."""

    @property
    def queued(self) -> int:
        return self.recv.statistics().current_buffer_used

    def accept(
        self, item: LLMWorkItem[TOutput], *, checked: bool = False
    ) -> WorkItemResult[TOutput] | None:
        """Check ``item`` (``TypeError``/``ValueError`` naming what is wrong) and count it accepted.

        ``checked``: its source checked it whole already, its id against :attr:`ids` too
        (``aiter_items``): one check per item, so it is not checked again here.
        Returns its replay when the store has a result to reuse; otherwise :meth:`queue` it next.
        """
        if not checked:
            if not isinstance(item, LLMWorkItem):
                raise TypeError(f"item={item!r}: must be an LLMWorkItem")
            if (problem := item_id_problem(item.item_id)) is not None:
                raise ValueError(f"item_id={item.item_id!r} {problem}")
            check_work_item(item, "add_work")
            self.ids.check(item.item_id)  # last: an item refused for another reason keeps no id
        replay = self.plan.replay(item) if self.plan is not None else None
        if self._record:
            self.order.append(item.item_id)
        self._counters.accepted += 1
        return replay

    async def add_checked(self, checked: CheckedItems[TOutput], policy: StopPolicy,
                          publish: Callable[[WorkItemResult[TOutput], None], Awaitable[None]]) -> None:
        """Accept and queue every item of ``checked``, checked whole by its source: none is checked again.

        ``process_prompts``' way in, before ``process_all()``, into an unbounded queue: nothing runs
        yet that would share the event loop, so it checkpoints once per 1,024 items, not per item.
        A replay (``plan``) is published as it is met; a stop meanwhile (which closes the input)
        refuses the rest with :class:`AdmissionClosedError`, as ``add_work`` would.
        """
        if self._max:
            raise RuntimeError("add_checked() needs an unbounded input queue (max_queue_size=0)")
        self.ids.absorb(checked.ids)
        items, start = checked.items, 0
        while True:
            await anyio.lowlevel.checkpoint()
            if start >= len(items):
                return
            streams = self.send.statistics()
            if policy.kind is not None or not streams.open_send_streams or not streams.open_receive_streams:
                raise AdmissionClosedError(
                    f"the batch stopped ({policy.kind or 'closed'}); no more work is accepted")
            start, replay = self._accept_checked(items, start, min(start + 1024, len(items)))
            if replay is not None:
                await publish(replay, None)

    def _accept_checked(self, items: Sequence[LLMWorkItem[TOutput]], start: int, stop: int
                        ) -> tuple[int, WorkItemResult[TOutput] | None]:
        """Accept and queue ``items[start:stop]`` (an open queue) up to the first with a replay:
        where it stopped, and that replay."""
        send = self.send.send_nowait
        plan = self.plan
        if plan is None:  # nothing to replay, the common case: no step per item but the send
            chunk = items[start:stop]
            for item in chunk:
                send(item)
            if self._record:
                self.order.extend([item.item_id for item in chunk])
            self._counters.accepted += len(chunk)
            return stop, None
        for index in range(start, stop):
            item = items[index]
            replay = plan.replay(item)
            if self._record:
                self.order.append(item.item_id)
            self._counters.accepted += 1
            if replay is not None:
                return index + 1, replay
            send(item)
        return stop, None

    async def queue(self, item: LLMWorkItem[TOutput], *, wait: bool, stopped: str | None) -> None:
        """Put an accepted item on the queue: waiting for room (``wait``), or refused at once when full.

        ``stopped`` names the batch's stop for the error when the input is closed.
        """
        try:
            if wait:
                await self.send.send(item)
                return
            self.send.send_nowait(item)
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            if self._record:
                self.order.pop()
            self._counters.accepted -= 1
            self.ids.forget(item.item_id)
            if isinstance(exc, anyio.WouldBlock):
                raise QueueFullError(
                    f"input queue is full (max_queue_size={self._max}); in batch mode workers start "
                    "only in process_all(): use streaming mode (start()) for backpressure"
                ) from None
            raise AdmissionClosedError(
                f"the batch stopped ({stopped or 'closed'}); no more work is accepted"
            ) from None
        await anyio.lowlevel.checkpoint()

    def close(self) -> None:
        """No more input (idempotent); what is queued stays readable."""
        self.send.close()

    async def discard(self) -> None:
        """Close both ends (a processor that was never opened)."""
        self.send.close()
        self.recv.close()
        await anyio.lowlevel.checkpoint()
