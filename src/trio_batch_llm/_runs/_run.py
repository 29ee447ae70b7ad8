"""The :class:`Run` handle of a durable run (``open_run`` makes one: :mod:`._open`).

A run is driven by ``await run.wait()``: while a ``wait()`` is running and its
process holds the run's claim, the run makes progress (one *drive segment*
at a time, see :mod:`._segment`); the handle owns no task outside those calls.
So any number of processes may open the same run: the one that claims it
drives, the others poll its stored status, and when the driving process dies
its claim dies with it and a waiting process takes over.

``wait(timeout)``'s deadline is a cancel scope around all of that: it caps
every idle sleep and status poll, and at the deadline the segment is
cancelled (calls in flight are abandoned; their items stay pending) and no new
call starts. ``pause()`` drains instead: no new call starts, calls in flight
finish and are recorded.
"""

from __future__ import annotations

import os
import secrets
import socket
from types import TracebackType
from typing import Any, Self, final

import anyio
import anyio.lowlevel

from .._core._deliveries import unwrap_group
from .._values._errors import ConfigurationError, DatabaseUnavailableError
from ._batch_drive import BatchSegmentDriver
from ._live_drive import LiveSegmentDriver
from ._reader import export_results_jsonl, load_results
from ._schema import ClaimLostError, RunResult, RunSnapshot, RunStateError, RunTermination
from ._segment import Segment, deadline_after
from .repository._client import RepositoryClient

__all__ = ["Run"]


@final
class Run:
    """A handle on one durable run; see :func:`open_run` and the module docstring."""

    def __init__(
        self,
        *,
        db: RepositoryClient,
        run_id: str,
        driver: LiveSegmentDriver | BatchSegmentDriver,
        poll_interval: float,
    ) -> None:
        self._db = db
        self._repo = db.repository
        self._run_id = run_id
        self._driver = driver
        self._poll_interval = poll_interval
        self._segment: Segment | None = None
        self._changed = anyio.Event()
        self._closed = False
        # Many drivers per run (a live run opened with lease_seconds): this handle's lease, while a
        # wait() drives; the driver id names this process in `runs status`.
        self._lease: int | None = None
        self.driver_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"

    def __repr__(self) -> str:
        return f"Run({self._run_id!r}, store={self._repo.location!r})"

    @property
    def run_id(self) -> str:
        return self._run_id

    async def __aenter__(self) -> Self:
        await anyio.lowlevel.checkpoint()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the handle (idempotent; closes even when cancelled).

        A segment this handle is driving is abandoned first, as at a
        ``wait()`` deadline: its calls are cancelled, their items stay
        pending, and the run's status is unchanged.
        """
        self._closed = True
        self._notify()  # idle wait() calls on this handle wake and raise RunStateError
        segment = self._segment
        if segment is not None:
            segment.request("detached", "run handle closed")
            with anyio.CancelScope(shield=True):
                await segment.ended.wait()
        await self._close_lease()
        await self._db.aclose()

    def _check_open(self) -> None:
        if self._closed:
            raise RunStateError(f"run {self._run_id!r}: this handle is closed")

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    # --- reading ---------------------------------------------------------------------

    async def snapshot(self) -> RunSnapshot:
        """The run as stored now (counts, tokens, status, termination)."""
        self._check_open()
        return await self._db.call(self._repo.snapshot, self._run_id)

    async def read_results(self, after_sequence: int = 0, limit: int | None = None) -> list[RunResult]:
        """Terminal results with a sequence above ``after_sequence``, in sequence order.

        Sequences are stable and gapless (1, 2, 3, …), so a consumer that
        stores the last sequence it handled can resume from it after a failure
        without skipping or counting anything twice. Outputs come back as the
        items produced them: a live run passes each through the strategy's
        ``decode_output`` (its ``response_model=`` rebuilds the model).
        """
        self._check_open()
        if isinstance(after_sequence, bool) or not isinstance(after_sequence, int) or after_sequence < 0:
            raise ValueError(f"after_sequence={after_sequence!r}: must be a whole number >= 0")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValueError(f"limit={limit!r}: must be a whole number >= 1, or None")
        driver = self._driver
        output = driver.decode_output if isinstance(driver, LiveSegmentDriver) else None
        return await self._db.call(load_results, self._repo, self._run_id, after_sequence, limit, output)

    async def export_jsonl(self, path: str | os.PathLike[str], *, after_sequence: int = 0) -> int:
        """Write results after ``after_sequence`` to ``path`` (replacing it), one
        ``{"sequence": n, "result": {...}}`` per line; returns how many were written."""
        self._check_open()
        return await export_results_jsonl(self._db, self._run_id, os.fspath(path), after_sequence)

    async def drivers(self) -> list[str]:
        """The ids of the drivers working on the run now, oldest first (this handle's is its
        ``driver_id``, host:pid:tag): each ``wait()`` of a handle opened with ``lease_seconds`` holds a lease
        while it drives. A lease counts until it is given back or expires (``lease_seconds`` after
        its driver's last heartbeat). Empty for a run driven one process at a time."""
        self._check_open()
        report = await self._db.call(self._repo.lease_report, self._run_id)
        return list(report.working)

    # --- control ---------------------------------------------------------------------

    async def pause(self, reason: str = "paused") -> RunSnapshot:
        """Stop admitting work, let calls in flight finish and be recorded; the run stays resumable.

        When this handle drives the run, returns once it has drained. When
        another process drives it, that process drains within its poll interval.
        """
        self._check_open()
        changed, snap = await self._transition({"running"}, "paused", RunTermination("paused", reason))
        if not changed and snap.status != "paused":
            raise RunStateError(f"run {self._run_id!r} is {snap.status}; only a running run can be paused")
        await self._stop_segment("paused", reason)
        return await self.snapshot()

    async def resume(self) -> RunSnapshot:
        """Make a paused (or failed) run ``running`` again; ``wait()`` drives it."""
        self._check_open()
        changed, snap = await self._transition({"paused", "failed"}, "running", None)
        if not changed and snap.status != "running":
            raise RunStateError(f"run {self._run_id!r} is {snap.status}; it cannot be resumed")
        self._notify()
        return snap

    async def cancel(self, reason: str = "cancelled") -> RunSnapshot:
        """End the run for good: calls in flight are cancelled, pending items are never run."""
        self._check_open()
        changed, snap = await self._transition(
            {"running", "paused", "failed"}, "cancelled", RunTermination("cancelled", reason)
        )
        if not changed and snap.status != "cancelled":
            raise RunStateError(f"run {self._run_id!r} is {snap.status}; it cannot be cancelled")
        driving = self._segment is not None
        await self._stop_segment("cancelled", reason)
        if not driving and isinstance(self._driver, BatchSegmentDriver):
            await self._cancel_batches(self._driver)
        return await self.snapshot()

    async def _cancel_batches(self, driver: BatchSegmentDriver) -> None:
        """Cancel the run's open provider batches, unless another process drives it (that one does)."""
        if not await self._db.call(self._repo.try_claim, self._run_id):
            return
        try:
            await driver.cancel_open()
        finally:
            with anyio.CancelScope(shield=True):  # bounded: closes one file descriptor
                await self._release()

    async def resolve_submission(self, *, created: bool, batch_id: str | None = None) -> RunSnapshot:
        """Settle the run's batch create whose outcome is unknown (provider-batch mode).

        When a create call got no answer (a timeout, a lost connection, a crash)
        the run stops submitting until that create is settled. The driver settles
        it by itself when the provider lists the batch with the submission's
        metadata; otherwise say what happened: ``created=True, batch_id="batch_…"``
        (the batch is collected like any other), or ``created=False`` (its items
        go back to pending and are submitted again).
        """
        self._check_open()
        if not isinstance(created, bool):
            raise ConfigurationError("created", created, "must be True or False")
        if created and (not isinstance(batch_id, str) or not batch_id):
            raise ConfigurationError("batch_id", batch_id,
                                     "is required (the provider's batch id) when created=True")
        if not created and batch_id is not None:
            raise ConfigurationError("batch_id", batch_id, "must be None when created=False")
        driver = self._driver
        if not isinstance(driver, BatchSegmentDriver):
            await anyio.lowlevel.checkpoint()
            raise RunStateError(f"run {self._run_id!r} runs in live mode: it has no batch submissions")
        unresolved = await self._db.call(
            self._repo.submissions, self._run_id, states=frozenset({"creating", "unknown"})
        )
        if not unresolved:
            raise RunStateError(f"run {self._run_id!r} has no batch submission with an unknown outcome")
        sub = unresolved[0]
        if sub.state == "creating":
            # Its create may be in flight in whichever process drives the run: settle it only
            # when nobody drives (a process that died mid-create left it so).
            if self._segment is not None or not await self._db.call(self._repo.try_claim, self._run_id):
                raise RunStateError(
                    f"run {self._run_id!r}: submission {sub.submission_id} is being created right now; "
                    "wait for its outcome"
                )
            try:
                return await self._settle(driver, sub.submission_id, frozenset({"creating", "unknown"}),
                                          created, batch_id)
            finally:
                with anyio.CancelScope(shield=True):  # bounded: closes one file descriptor
                    await self._release()
        return await self._settle(driver, sub.submission_id, frozenset({"unknown"}), created, batch_id)

    async def _settle(self, driver: BatchSegmentDriver, submission_id: str, from_states: frozenset[str],
                      created: bool, batch_id: str | None) -> RunSnapshot:
        sub_id = submission_id
        if created:
            changed = await self._db.call(
                self._repo.update_submission, self._run_id, sub_id, from_states=from_states,
                to="submitted", batch_id=batch_id,
                detail=f"created: batch {batch_id} (resolved by an operator)",
            )
        else:
            changed = bool(await self._db.call(
                self._repo.abandon_submission, self._run_id, sub_id, to="abandoned",
                detail="not created (resolved by an operator)",
            ))
        if not changed:
            raise RunStateError(
                f"run {self._run_id!r}: submission {sub_id} was settled meanwhile; see snapshot()"
            )
        driver.poke()
        self._notify()
        return await self.snapshot()

    async def _transition(
        self, from_statuses: set[str], to: Any, termination: RunTermination | None
    ) -> tuple[bool, RunSnapshot]:
        return await self._db.call(
            self._repo.transition, self._run_id, from_statuses=frozenset(from_statuses), to=to,
            termination=termination,
        )

    async def _stop_segment(self, kind: Any, reason: str) -> None:
        segment = self._segment
        if segment is not None:
            segment.request(kind, reason)
            await segment.ended.wait()
        else:
            await anyio.lowlevel.checkpoint()
        self._notify()

    # --- waiting and driving ---------------------------------------------------------

    async def wait(self, timeout: float | None = None) -> RunSnapshot:
        """Drive (or watch) the run until it is terminal; returns its final snapshot.

        Raises ``TimeoutError`` at the deadline (``timeout`` seconds from now);
        see the module docstring for what happens to work in flight then. If
        the run fails while this call drives it, the failure is stored and the
        original exception raised. A database outage longer than ``open_run``'s
        ``unreachable_timeout`` raises :class:`DatabaseUnavailableError` and
        stores nothing: the run stays ``running``, and ``wait()`` may be called
        again (shorter outages are ridden out).
        """
        self._check_open()
        deadline = deadline_after(timeout)
        try:
            with unwrap_group(), anyio.CancelScope(deadline=deadline):
                return await self._wait_terminal(deadline)
        finally:
            await self._close_lease()
        raise TimeoutError(f"run {self._run_id!r} was not terminal after {timeout} s")

    async def _close_lease(self) -> None:
        """Give back this handle's lease (its unrecorded items go back to pending).

        Tried once: with the database unreachable the lease is left to expire (its items go
        back to the others then), so a close never waits out an outage nor hides the error
        that ended the drive."""
        lease, self._lease = self._lease, None
        if lease is None or self._db.closed:
            await anyio.lowlevel.checkpoint()
            return
        with anyio.CancelScope(shield=True):  # bounded: one repository call, tried once
            try:
                await self._db.call_once(self._repo.close_lease, self._run_id, lease)
            except DatabaseUnavailableError:
                await anyio.lowlevel.checkpoint()  # it expires after lease_seconds, as a dead driver's does

    async def _release(self) -> None:
        """Release the run's claim; tried once (an unreachable database ended its session, and the
        claim, a session lock, went with it)."""
        if self._db.closed:  # (closing the repository released it already)
            await anyio.lowlevel.checkpoint()
            return
        try:
            await self._db.call_once(self._repo.release, self._run_id)
        except DatabaseUnavailableError:
            await anyio.lowlevel.checkpoint()

    async def _wait_terminal(self, deadline: float) -> RunSnapshot:
        while True:
            self._check_open()
            snap = await self._db.call(self._repo.snapshot, self._run_id)
            if snap.terminal:
                return snap
            if snap.status == "running" and self._segment is None:
                try:
                    if await self._drive_once(deadline):
                        continue
                except ClaimLostError:
                    continue  # lost with the connection before its segment began: claim (or not) again
            changed = self._changed
            with anyio.move_on_after(self._poll_interval):
                await changed.wait()

    async def _drive_once(self, deadline: float) -> bool:
        """Claim and drive one segment; ``False`` if another driver holds the claim."""
        driver = self._driver
        if isinstance(driver, LiveSegmentDriver) and driver.lease_seconds is not None:
            return await self._drive_shared(driver, driver.lease_seconds, deadline)
        segment = self._segment = Segment()
        claimed = False
        try:
            claimed = await self._db.call(self._repo.try_claim, self._run_id)
            if not claimed:
                return False
            try:
                snap = await self._db.call(self._repo.snapshot, self._run_id)  # fresh, under the claim
                if snap.status == "running":
                    await self._driver.drive(segment, snap, deadline)
            finally:
                with anyio.CancelScope(shield=True):  # bounded: closes one file descriptor
                    await self._release()
            return True
        finally:
            self._segment = None
            segment.ended.set()
            if claimed:
                self._notify()  # other wait() calls on this handle look again

    async def _drive_shared(self, driver: LiveSegmentDriver, lease_seconds: float, deadline: float) -> bool:
        """Drive one segment beside other drivers, under this handle's lease; ``False`` if it
        made no progress (nothing to lease now: the caller waits a poll interval)."""
        segment = self._segment = Segment()
        try:
            # An idle segment keeps its lease for the next; no heartbeat runs between segments, so it
            # is renewed here, and opened anew if it expired meanwhile (its items went back then).
            lease = self._lease
            if lease is None or not await self._db.call(self._repo.renew_lease, self._run_id, lease):
                self._lease = await self._db.call(
                    self._repo.open_lease, self._run_id, self.driver_id, lease_seconds=lease_seconds
                )
            # The claim, held by one process at a time, is now the right to ingest the source.
            ingest = await self._db.call(self._repo.try_claim, self._run_id)
            try:
                snap = await self._db.call(self._repo.snapshot, self._run_id)
                if snap.status == "running":
                    await driver.drive(segment, snap, deadline, lease=self._lease, ingest=ingest)
            finally:
                with anyio.CancelScope(shield=True):  # bounded: closes one file descriptor or lock
                    if ingest:
                        await self._release()
                if segment.leased:
                    # What it leased and did not record goes back now; the next segment opens a new
                    # lease (idle segments lease nothing and keep theirs). Those whose call had
                    # started count as repeated calls when their call starts again (._starts).
                    await self._close_lease()
            return segment.progress > 0
        finally:
            self._segment = None
            segment.ended.set()
            if segment.progress:
                self._notify()
