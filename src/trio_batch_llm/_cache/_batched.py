"""Calls made at once on one blocking resource, run together in one worker-thread call (a shared hop).

A worker-thread hop costs far more than a read or a small write by key (on a
loaded two-core machine, about 0.6 ms against 0.05 ms), and a resource used
through a :class:`WorkerGate` takes one hop at a time. So :class:`Batched` queues
the operations submitted while a call is running; the first submitter leads: it
takes the whole queue into one call of ``execute(batch)`` (in the worker thread,
which sets each operation's result or error), wakes the others with theirs, and
hands the lead to the first operation queued meanwhile, which does the same.

Cancellation: a queued operation whose caller is cancelled leaves the queue (and
hands on the lead if it had just been given it); a leader cancelled before its
call started puts the others' operations back at the head of the queue. A call
that has started finishes (the gate never abandons one), so every operation in
it is answered. No task is started: callers do all the work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, final

import anyio

from .._backends._worker_gate import WorkerGate

__all__ = ["Batched", "Operation"]


@final
class Operation:
    """One queued call: ``kind`` and ``args`` for ``execute``; ``result`` or ``error`` set in the thread."""

    __slots__ = ("answered", "args", "done", "error", "kind", "lead", "result")

    def __init__(self, kind: str, args: tuple[Any, ...]) -> None:
        self.kind = kind
        self.args = args
        self.done = anyio.Event()
        self.result: Any = None
        self.error: Exception | None = None
        self.answered = False  # set by ``execute`` (result or error), in the worker thread
        self.lead = False  # woken to lead the next call, not with an answer

    def outcome(self) -> Any:
        if self.error is not None:
            # Each caller raises its own exception object (one may be raised in several tasks).
            raise type(self.error)(str(self.error)) from self.error
        return self.result


@final
class Batched:
    """Submit operations; those made at once run in one ``execute(batch)`` through ``gate``."""

    __slots__ = ("_busy", "_execute", "_gate", "_queue")

    def __init__(self, gate: WorkerGate, execute: Callable[[list[Operation]], None]) -> None:
        self._gate = gate
        self._execute = execute
        self._queue: list[Operation] = []
        self._busy = False  # a leader's call runs, or the lead is being handed on

    async def submit(self, kind: str, *args: Any) -> Any:
        """Run ``kind(*args)`` with whatever else is submitted meanwhile; its result, or its error raised."""
        op = Operation(kind, args)
        self._queue.append(op)
        if self._busy:
            try:
                await op.done.wait()
            except BaseException:
                self._withdraw(op)
                raise
            if not op.lead:
                return op.outcome()
        self._busy = True
        batch, self._queue = self._queue, []
        try:
            await self._gate.run(self._execute, batch)  # started, it finishes: every op gets its answer
        finally:
            self._queue = [other for other in batch if other is not op and not other.answered] + self._queue
            for other in batch:
                if other is not op and other.answered:
                    other.done.set()
            self._pass_lead()
        return op.outcome()

    def _withdraw(self, op: Operation) -> None:
        if any(queued is op for queued in self._queue):
            self._queue = [queued for queued in self._queue if queued is not op]
        if op.lead:
            self._pass_lead()

    def _pass_lead(self) -> None:
        if self._queue:
            following = self._queue[0]
            following.lead = True
            following.done.set()
        else:
            self._busy = False
