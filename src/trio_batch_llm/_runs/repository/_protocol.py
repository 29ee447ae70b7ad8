"""The run repository protocol: what any storage of durable runs must provide (SQLite, PostgreSQL).

The run side (:mod:`.._run` and its drivers) talks to storage only through
:class:`RunRepository`, a synchronous protocol called from one worker thread
at a time, never on the event loop (:class:`RepositoryClient`). Each method is
one transaction, which any implementation has to provide (both of ours are
:class:`SqlRunRepository`, ``_sql.py``, plus a dialect: ``_sqlite.py``, ``_postgres.py``):

* ``ingest`` commits a slice of new items *and* the source checkpoint that
  follows them, together;
* ``record`` marks items done and appends their results with the next
  sequence numbers, together; an item that is not pending is skipped, so a
  result is never recorded twice;
* ``transition`` is a compare-and-set on the status; ``complete`` succeeds only
  when the source is exhausted and nothing is pending;
* ``try_claim``/``release`` give one process at a time the right to drive a
  run exclusively (provider-batch mode) or to ingest its source (live mode
  with leases); the claim must die with its process (SQLite: ``flock`` on a
  lock file, :mod:`._file_claims`; PostgreSQL: a session advisory lock);
* ``open_lease``/``lease_items``/``renew_lease``/``close_lease`` and
  ``record(..., lease=)`` let many drivers share a live run (:mod:`._leases`).

Sequences must become visible to readers in order (a reader that saw ``n``
never later sees a new result numbered below ``n``); SQLite's single writer
gives that for free, PostgreSQL the run's row lock taken before the sequence is read.

Provider-batch *submissions* (see :mod:`.._schema`):

* ``reserve_submission`` checks the scope's capacity, takes the items and
  inserts the submission, together; the check and the insert are one write
  transaction, so two repositories on one store (threads or processes) never
  reserve past the limit between them;
* ``update_submission`` is a compare-and-set on the submission's state (the
  ``creating`` state is the durable *intent* to create the batch, written
  before the create call is sent, so a crash leaves evidence to reconcile);
* ``abandon_submission`` and ``finish_submission`` end a live submission and
  release its capacity together with what happens to its items: back to
  pending, or done with their results sequenced exactly as ``record`` does.
  Both act only on a live (resp. ``submitted``) submission, so repeating
  them after a crash changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, runtime_checkable

from .._schema import (
    NewItem,
    NewResult,
    NewSubmission,
    PendingItem,
    RunSnapshot,
    RunSpec,
    RunStatus,
    RunTermination,
    SourceCheckpoint,
    StoredResult,
    SubmissionRecord,
    SubmissionState,
)
from ._leases import LeaseReport

__all__ = ["RunRepository"]


@runtime_checkable
class RunRepository(Protocol):
    """Synchronous run storage; see the module docstring. One call at a time, off the event loop."""

    @property
    def location(self) -> str:
        """Where the runs live (a path or a URL without credentials), for messages."""

    def open(self) -> None: ...

    def close(self) -> None:
        """Release every claim and close; idempotent."""

    def attach(self, spec: RunSpec) -> RunSnapshot:
        """Create the run (status ``running``), or return it; a different identity or mode
        raises ArtifactMismatchError / RunStateError."""

    def snapshot(self, run_id: str) -> RunSnapshot: ...

    def run_ids(self) -> list[str]:
        """Every run's id, oldest first."""

    def transition(
        self,
        run_id: str,
        *,
        from_statuses: frozenset[str],
        to: RunStatus,
        termination: RunTermination | None,
    ) -> tuple[bool, RunSnapshot]:
        """Set ``to`` if the status is one of ``from_statuses``; ``(changed, snapshot after)``."""

    def complete(self, run_id: str) -> tuple[bool, RunSnapshot]:
        """``running`` -> ``completed`` only if the source is exhausted and nothing is pending."""

    def ingest(self, run_id: str, items: Sequence[NewItem], checkpoint: SourceCheckpoint) -> RunSnapshot:
        """Add ``items`` (pending) and move the checkpoint, in one transaction.
        A repeated item id raises ValueError and commits nothing."""

    def pending(self, run_id: str, *, after_ingest_seq: int, limit: int) -> list[PendingItem]:
        """Pending items in ingestion order, after ``after_ingest_seq``."""

    def record(self, run_id: str, results: Sequence[NewResult], *, lease: int | None = None) -> RunSnapshot:
        """Mark the items done and append their results in order, in one transaction;
        results for items that are not pending are skipped. With ``lease`` (a token of
        :meth:`open_lease`): only items leased under it, and only while it is alive
        (else LeaseLostError, nothing written), checked in the same transaction."""

    # -- leases: many drivers per run (see ._leases) ---------------------------------

    def open_lease(self, run_id: str, driver_id: str, *, lease_seconds: float) -> int:
        """A new lease (alive for ``lease_seconds`` from now); its fencing token, never reused."""

    def lease_items(self, run_id: str, lease: int, *, limit: int) -> list[PendingItem]:
        """Expire the run's dead leases (their items back to pending), then lease up to
        ``limit`` pending items under ``lease``; LeaseLostError if ``lease`` is dead."""

    def renew_lease(self, run_id: str, lease: int) -> bool:
        """The heartbeat: extend a live lease; False if it is dead (it never comes back)."""

    def close_lease(self, run_id: str, lease: int) -> int:
        """End the lease; its items without a result go back to pending. How many."""

    def start_calls(self, run_id: str, lease: int, item_ids: Sequence[str]) -> list[str]:
        """Record that calls of ``item_ids`` start now under ``lease``; the ids it holds (only those
        may be called). A start of an item called before without a recorded result is counted as
        a repeated call. LeaseLostError if ``lease`` is dead."""

    def unstart_calls(self, run_id: str, lease: int, item_ids: Sequence[str]) -> None:
        """Forget the starts of ``item_ids`` under ``lease``: a stop ended them before their call went
        out, so a later start of theirs is not a repeated call."""

    def lease_report(self, run_id: str) -> LeaseReport:
        """The run's drivers (newest 100 leases), how many are alive, its count of repeated calls."""

    def results(self, run_id: str, *, after_sequence: int, limit: int | None) -> list[StoredResult]: ...

    def try_claim(self, run_id: str) -> bool:
        """Take the exclusive right to drive ``run_id`` (False if held, here or elsewhere)."""

    def release(self, run_id: str) -> None: ...

    # -- provider-batch submissions (each method one transaction) -------------

    def reserve_submission(
        self, run_id: str, submission: NewSubmission, *, capacity_limit: int | None
    ) -> bool:
        """Take capacity and items for a new submission (state ``reserved``), atomically.

        False, writing nothing, if ``capacity_limit`` is set and the scope's
        ``held_tokens`` plus ``submission.tokens`` would exceed it (a submission
        bigger than the limit on its own is refused too). Otherwise every listed
        item must be ``pending`` in this run (ValueError naming the first that is
        not, and its state; nothing written); they become ``batched`` in this
        submission. The capacity check and the insert are one write transaction,
        so concurrent reservations on one store (any number of repository
        objects, threads or processes) never hold more than the limit."""

    def update_submission(
        self,
        run_id: str,
        submission_id: str,
        *,
        from_states: frozenset[str],
        to: SubmissionState,
        input_file_id: str | None = None,
        batch_id: str | None = None,
        detail: str | None = None,
    ) -> bool:
        """Compare-and-set: move to ``to`` (a live state) only if the state is in
        ``from_states``, setting the given non-None fields too; False (nothing
        changed) otherwise, or if there is no such submission. Ending a
        submission goes through ``abandon_submission`` or ``finish_submission``."""

    def abandon_submission(
        self, run_id: str, submission_id: str, *, to: Literal["abandoned", "cancelled"], detail: str | None
    ) -> int:
        """End a live submission without results: its ``batched`` items go back to
        pending (attempts unchanged) and its capacity is released, together.
        Returns the items returned; 0 and no change if it was not live."""

    def finish_submission(
        self,
        run_id: str,
        submission_id: str,
        results: Sequence[NewResult],
        retry_item_ids: Sequence[str],
        *,
        detail: str | None = None,
        unrun_item_ids: Sequence[str] = (),
    ) -> RunSnapshot:
        """End a ``submitted`` submission with its results, in one transaction.

        Results for items still ``batched`` in this submission become done with
        the next sequences exactly as ``record`` does; results for any other item
        are skipped. Items in ``unrun_item_ids`` (the provider never ran them:
        the batch expired or was cancelled first) go back to pending as they
        were. Then the ``retry_item_ids`` and every other item still
        ``batched`` in it go back to pending with ``attempts + 1``, and the
        submission becomes ``finished`` (capacity released). Exactly once: if the
        submission is not ``submitted`` nothing changes (a repeat after a crash
        is a no-op). Returns the snapshot after."""

    def submissions(self, run_id: str, *, states: frozenset[str] | None = None) -> list[SubmissionRecord]:
        """The run's submissions (those in ``states``, if given), in creation order."""

    def submission_items(self, run_id: str, submission_id: str) -> list[PendingItem]:
        """The items still ``batched`` in the submission, in ingestion order, with attempts."""

    def held_tokens(self, scope: str) -> int:
        """Tokens held by the scope's live submissions, across every run in the store."""
