"""The drive segment every driver shares: its control surface, its driver base, and how it ends.

A *drive segment* is one stretch of driving a ``running`` run, inside the
caller's ``wait()`` (which owns every task of it), while this process may
drive: it holds the run's claim, or (a live run with many drivers) a lease.
The live driver (:mod:`._live_drive`: calls through the engine) and the
provider-batch driver (:mod:`._batch_drive`: the provider's Batch API) differ in
what the segment's body does; what they share is here:

* :class:`Segment`, the control surface: a pause, a cancel or a detach (from
  this process, or seen by the status watcher) and a failure of one of its
  tasks arrive here and are applied to the segment's task group;
* :class:`DriverBase`: lining the source up with the stored checkpoint,
  ingesting it slice by slice, watching the stored status, storing a failure;
* how a segment ends (:meth:`DriverBase._body_raised`,
  :meth:`DriverBase._tasks_ended`): a lost claim ends it quietly (another
  process drives now); a lost database is raised with nothing stored (the run
  stays ``running``: it is not this driver's to fail, and ``wait()`` may be
  called again); any other failure is stored (``failed``), then raised.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any, Literal, ParamSpec, TypeVar, final

import anyio
import anyio.lowlevel

from .._backends import leaves_the_loop
from .._core._deliveries import unwrap_group
from .._engine._processor import ParallelBatchProcessor
from .._values._config import ProcessorConfig
from .._values._errors import ArtifactStoreError
from .._values._stop_reasons import StopReason
from ._ingest import IngestedItem, Ingestor
from ._schema import ClaimLostError, RunSnapshot, RunSourceError, RunTermination
from .repository._client import RepositoryClient, RunBound

__all__ = ["DriverBase", "Segment", "StopKind", "deadline_after", "only_of"]

StopKind = Literal["paused", "cancelled", "detached"]
OnSlice = Callable[[list[IngestedItem]], Awaitable[None] | None]
"""What a driver does with each committed slice: feed its items (awaited), or wake a waiting task."""
P = ParamSpec("P")
R = TypeVar("R")


@final
class Segment:
    """The control surface of one drive: stop requests arrive here, from this process or the watcher."""

    def __init__(self) -> None:
        self.ended = anyio.Event()
        self.stop: StopKind | None = None
        self.stop_reason = ""
        self.failure: BaseException | None = None
        self.failure_kind = "error"
        self.progress = 0
        self.leased = 0  # items this segment leased (many drivers per run)
        self._listeners: list[Callable[[], None]] = []
        self._proc: ParallelBatchProcessor[Any] | None = None
        self._scope: anyio.CancelScope | None = None
        self.feeder_scope = anyio.CancelScope()
        self._interrupt: BaseException | None = None  # see guarded()

    def request(self, kind: StopKind, reason: str) -> None:
        # A cancel or detach overrides a pause (it is stronger); nothing overrides them.
        if self.stop is not None and (self.stop != "paused" or kind == "paused"):
            return
        self.stop, self.stop_reason = kind, reason
        self._apply()
        self._tell()

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every stop request or failure (a driver waiting idle wakes)."""
        self._listeners.append(listener)

    def _tell(self) -> None:
        for listener in self._listeners:
            listener()

    def bind(self, proc: ParallelBatchProcessor[Any] | None, scope: anyio.CancelScope) -> None:
        self._proc, self._scope = proc, scope
        self._apply()

    def _apply(self) -> None:
        if self.stop is None:
            return
        if self._proc is not None:
            why = StopReason.PAUSE if self.stop == "paused" else StopReason.SHUTDOWN
            self._proc.request_stop(self.stop_reason, stop_reason=why)
        # The feeder stops reading and calls finish() at once, so the stream ends as finished.
        self.feeder_scope.cancel(self.stop_reason)
        if self.stop != "paused" and self._scope is not None:
            self._scope.cancel(self.stop_reason)

    async def guarded(  # noqa: ASYNC910 - fn() ran on every path (a held interrupt ends it)
        self, fn: Callable[..., Awaitable[object]], *args: object
    ) -> None:
        """Run ``fn(*args)`` as a task of this segment (every task of a segment runs so).

        A Ctrl+C or ``sys.exit()`` raised in it (the run's source, a hook) would, on asyncio,
        leave the event loop itself instead of this task (:func:`leaves_the_loop`): it is held
        here and the segment cancelled, as Trio's task group does with it; the driver
        re-raises it, with its type, after the ordered close (:meth:`raise_interrupt`).
        """
        try:
            await fn(*args)
        except (KeyboardInterrupt, SystemExit) as exc:
            if not leaves_the_loop(exc):
                raise
            if self._interrupt is None:
                self._interrupt = exc
            assert self._scope is not None  # bound before any task starts
            self._scope.cancel("interrupted")

    def raise_interrupt(self) -> None:
        """Re-raise what :meth:`guarded` held (asyncio), once the segment's task group is left."""
        interrupt, self._interrupt = self._interrupt, None
        if interrupt is not None:
            raise interrupt

    def fail(self, exc: BaseException, kind: str) -> None:
        """Ingestion failed: what was fed still runs; the driver raises ``exc`` once it has."""
        if self.failure is None:
            self.failure, self.failure_kind = exc, kind
        self._tell()

    def observe(self, snapshot: RunSnapshot) -> None:
        """React to the stored status (changed by another handle or process)."""
        if snapshot.status == "paused":
            self.request("paused", "paused from another handle")
        elif snapshot.status == "cancelled":
            self.request("cancelled", "cancelled from another handle")


class DriverBase(RunBound):
    """What the live and the provider-batch drivers share: the run, its ingestion, its status."""

    def __init__(
        self,
        *,
        db: RepositoryClient,
        run_id: str,
        config: ProcessorConfig,
        ingestor: Ingestor | None,
        poll_interval: float,
    ) -> None:
        super().__init__(db=db, run_id=run_id)
        self._config = config
        self._ingestor = ingestor
        self._poll_interval = poll_interval

    async def _prepare_ingestion(self, snap: RunSnapshot) -> None:
        """Line the source up with the stored checkpoint, if ingestion is not complete."""
        if snap.checkpoint.exhausted:
            await anyio.lowlevel.checkpoint()
            return
        if self._ingestor is None:
            raise RunSourceError(
                f"run {self._run_id!r}: its ingestion is incomplete (at entry "
                f"{snap.checkpoint.position}) and this handle was opened without a source"
            )
        await self._ingestor.prepare(snap.checkpoint)

    async def _fail(self, termination: RunTermination) -> None:
        await self._db.call(
            self._repo.transition, self._run_id, from_statuses=frozenset({"running"}), to="failed",
            termination=termination,
        )

    async def _watch(self, seg: Segment, *, leased: bool = False) -> None:
        """Poll the stored status, so a pause or cancel from another process reaches this segment."""
        while True:
            await anyio.sleep(self._poll_interval)
            seg.observe(await (self._leased_call if leased else self._db.call)(self._repo.snapshot,
                                                                                self._run_id))

    async def _leased_call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """A repository call of a driver under a lease. A :class:`ClaimLostError` is raised before
        anything ran, and a lease's work does not need the claim (only ingesting does, and the
        repository keeps refusing that): the call is made again."""
        try:
            return await self._db.call(fn, *args, **kwargs)
        except ClaimLostError:
            return await self._db.call(fn, *args, **kwargs)

    async def _ingest_slices(self, seg: Segment, ingestor: Ingestor, on_slice: OnSlice) -> None:
        """Commit the source slice by slice, handing each committed slice to ``on_slice``.

        The reader is a task of its own (the only code that waits on the source), so a slow
        source never holds up what was read already; it is cancelled once ingestion ends, for
        whatever reason. What ``next_slice`` raises (a bad entry, the source's own error, a lost
        claim or database) comes out of here as itself, for the caller to judge."""
        with unwrap_group():
            async with anyio.create_task_group() as tg:
                tg.start_soon(seg.guarded, ingestor.read_ahead, name="run source reader")
                try:
                    while (items := await ingestor.next_slice()) is not None:
                        seg.progress += len(items)
                        fed = on_slice(items)
                        if fed is not None:
                            await fed
                finally:
                    tg.cancel_scope.cancel("ingestion stopped")

    # --- how a segment ends ------------------------------------------------------

    async def _body_raised(self, exc: Exception, lost: type[ArtifactStoreError]) -> None:
        """The segment's task group raised ``exc``: return if it is a lost claim, raise otherwise.

        A lost claim (:class:`ClaimLostError`: another process took the claim while this one's
        connection was down) ends the segment quietly: the run goes on there. A lost database
        (``lost``: :class:`DatabaseUnavailableError`, or with leases any database error) is raised
        with nothing stored, since the store cannot be written; the run stays ``running``, other
        drivers go on, and ``wait()`` may be called again. Anything else fails the run: stored
        first, so every other handle sees why, then raised."""
        if only_of(exc, ClaimLostError) is not None:
            await anyio.lowlevel.checkpoint()
            return
        gone = only_of(exc, lost)
        if gone is not None:
            raise gone from None if gone is not exc else exc.__cause__
        await self._fail(RunTermination("error", f"{type(exc).__name__}: {exc}"))
        raise exc

    async def _tasks_ended(self, seg: Segment, lost: type[ArtifactStoreError]) -> bool:
        """After the segment's tasks: ``True`` if a stop or a task's failure ended it.

        By the rules of :meth:`_body_raised`, for a failure a task stored in ``seg`` (the
        ingestion task, a refused record); a paused or cancelled segment ends with nothing
        stored here, since whoever asked for the stop stored the status first. ``False``:
        the segment ran to its end, and the driver judges how (``complete``, or a termination)."""
        failure = seg.failure
        if isinstance(failure, ClaimLostError):
            await anyio.lowlevel.checkpoint()
            return True
        if isinstance(failure, lost):
            raise failure
        if seg.stop is not None:
            await anyio.lowlevel.checkpoint()
            return True
        if failure is not None:
            await self._fail(RunTermination(seg.failure_kind, f"{type(failure).__name__}: {failure}"))
            raise failure
        return False  # noqa: ASYNC910 - the caller awaits next (the segment's conclusion)


def only_of(exc: Exception, kind: type[ArtifactStoreError]) -> ArtifactStoreError | None:
    """``exc`` if it (or every exception of its group) is a ``kind``: the first one."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, ExceptionGroup):
        matched, rest = exc.split(kind)
        if matched is not None and rest is None:
            first = matched.exceptions[0]
            return only_of(first, kind) if isinstance(first, Exception) else None
    return None


def deadline_after(timeout: float | None) -> float:
    """``wait(timeout)``'s deadline on the event loop's clock (``inf`` for none); a bad timeout is refused."""
    if timeout is None:
        return math.inf
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise ValueError(f"timeout={timeout!r}: must be a number >= 0, or None")
    return anyio.current_time() + timeout
