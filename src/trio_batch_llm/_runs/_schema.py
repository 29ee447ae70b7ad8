"""The records of a durable run, and the narrow repository protocol that stores them.

A *run* is a named, resumable job: its status, its items (ingested from a
source, each ``pending`` until its one terminal result is recorded), a
per-run result sequence, and the source checkpoint. The engine side
(:mod:`._run`) talks to storage only through :class:`RunRepository`, a
synchronous protocol called from one worker thread at a time (never on the
event loop). Each method is one transaction, which is what a future
PostgreSQL repository has to provide too:

* ``ingest`` commits a slice of new items *and* the source checkpoint that
  follows them, together;
* ``record`` marks items done and appends their results with the next
  sequence numbers, together; an item that is not pending is skipped, so a
  result is never recorded twice;
* ``transition`` is a compare-and-set on the status; ``complete`` succeeds only
  when the source is exhausted and nothing is pending;
* ``try_claim``/``release`` give one process at a time the right to drive a
  run; the claim must die with its process (SQLite: ``flock`` on a lock file;
  PostgreSQL: a session advisory lock).

Sequences must become visible to readers in order (a reader that saw ``n``
never later sees a new result numbered below ``n``); SQLite's single writer
gives that for free.

Provider Batch API mode adds *submissions*: a group of a run's items sent to
the provider as one batch. While a submission is live (``reserved``,
``creating``, ``unknown`` or ``submitted``) its items are ``batched`` (neither
pending nor done) and its estimated tokens count against its *scope*'s
enqueued-token capacity, which every run in the same store shares:

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
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, final, runtime_checkable

from .._values._config import ArtifactIdentity
from .._values._errors import RunSourceError, RunStateError
from .._values._results import WorkItemResult
from .._values._urls import redact_urls

__all__ = [
    "LIVE_SUBMISSION_STATES",
    "TERMINAL_STATUSES",
    "UNRESOLVED_SUBMISSION_STATES",
    "NewItem",
    "NewSubmission",
    "NewResult",
    "PendingItem",
    "RunMode",
    "RunRepository",
    "RunResult",
    "RunSnapshot",
    "RunSourceError",
    "RunSpec",
    "RunStateError",
    "RunStatus",
    "RunTermination",
    "SourceCheckpoint",
    "StoredResult",
    "SubmissionRecord",
    "SubmissionState",
]

RunStatus = Literal["running", "paused", "cancelled", "completed", "failed"]
RunMode = Literal["live", "provider-batch"]
TERMINAL_STATUSES: Final[frozenset[str]] = frozenset({"cancelled", "completed", "failed"})

SubmissionState = Literal[
    "reserved", "creating", "unknown", "submitted", "finished", "abandoned", "cancelled"
]
LIVE_SUBMISSION_STATES: Final[frozenset[str]] = frozenset({"reserved", "creating", "unknown", "submitted"})
"""States that hold their items (``batched``) and their tokens of the scope's capacity."""
UNRESOLVED_SUBMISSION_STATES: Final[frozenset[str]] = frozenset({"creating", "unknown"})
"""A create call may have been sent but no batch id is known: reconcile before anything else."""


@final
@dataclass(frozen=True, slots=True)
class RunTermination:
    """Why a run stopped: ``completed``, ``cancelled``, ``paused``, ``aborted``,
    ``budget_exhausted``, ``ingestion_failed`` or ``error``."""

    kind: str
    reason: str | None = None

    def __post_init__(self) -> None:
        if self.reason is not None and "://" in self.reason:  # stored and printed: no key in a URL
            object.__setattr__(self, "reason", redact_urls(self.reason))

    def to_dict(self) -> dict[str, str | None]:
        return {"kind": self.kind, "reason": self.reason}


@final
@dataclass(frozen=True, slots=True)
class SourceCheckpoint:
    """Where ingestion stands: everything before it is committed as items."""

    position: int = 0
    """Entries consumed from the source (blank JSONL lines are not entries)."""
    cursor: int | None = None
    """Source-defined: for a JSONL file, the byte offset after the last consumed line."""
    fingerprint: str | None = None
    """For a JSONL file: a digest of its head, checked before continuing from ``cursor``."""
    last_item_id: str | None = None
    """The id of the last consumed entry, checked when an iterable is fast-forwarded."""
    exhausted: bool = False
    """The source has no more entries: ingestion is complete."""


@final
@dataclass(frozen=True, slots=True)
class RunSnapshot:
    """A frozen record of one run as stored; readable from any process."""

    run_id: str
    status: RunStatus
    mode: RunMode
    identity: ArtifactIdentity
    config: dict[str, Any] = field(repr=False)
    """A JSON summary of the ProcessorConfig the run was created with."""
    termination: RunTermination | None
    checkpoint: SourceCheckpoint
    items: int
    """Items ingested so far."""
    done: int
    """Items with their terminal result recorded."""
    succeeded: int
    failed: int
    input_tokens: int
    output_tokens: int
    total_tokens: int
    last_sequence: int
    """The sequence number of the newest result (0: none yet)."""
    created_at: str
    updated_at: str
    batched: int = 0
    """Items inside live submissions (provider-batch mode); counted in ``pending`` too."""
    open_submissions: int = 0
    """This run's submissions in a live state (``LIVE_SUBMISSION_STATES``)."""
    unresolved_submission: str | None = None
    """The id of this run's oldest submission in state ``creating`` or ``unknown``."""

    @property
    def pending(self) -> int:
        """Items without a result yet (including ``batched`` ones)."""
        return self.items - self.done

    @property
    def ingestion_complete(self) -> bool:
        return self.checkpoint.exhausted

    @property
    def terminal(self) -> bool:
        """``completed``, ``cancelled`` or ``failed`` (``failed`` may still be resumed explicitly)."""
        return self.status in TERMINAL_STATUSES


@final
@dataclass(frozen=True, slots=True)
class RunResult:
    """One terminal result and its place in the run's result sequence."""

    sequence: int
    result: WorkItemResult[Any]

    @property
    def item_id(self) -> str:
        return self.result.item_id


# --- what crosses the repository boundary -------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class RunSpec:
    run_id: str
    mode: RunMode
    identity: ArtifactIdentity
    config: dict[str, Any]


@final
@dataclass(frozen=True, slots=True)
class NewItem:
    item_id: str
    prompt: str
    context_json: str | None
    """Canonical JSON of the context (``None`` for no context)."""
    fingerprint: str


@final
@dataclass(frozen=True, slots=True)
class PendingItem:
    ingest_seq: int
    item_id: str
    prompt: str
    context_json: str | None
    attempts: int = 0
    """Provider batches this item came back from without a result (``finish_submission``)."""


@final
@dataclass(frozen=True, slots=True)
class NewResult:
    item_id: str
    success: bool
    error_category: str | None
    result_json: str
    input_tokens: int
    output_tokens: int
    total_tokens: int


@final
@dataclass(frozen=True, slots=True)
class StoredResult:
    sequence: int
    item_id: str
    result_json: str


@final
@dataclass(frozen=True, slots=True)
class NewSubmission:
    submission_id: str
    """A uuid hex; also sent to the provider as batch metadata, to find the batch again."""
    scope: str
    """The capacity scope key (e.g. ``"batch|https://api…|keyfp|model"``)."""
    item_ids: tuple[str, ...]
    """Pending items of the run, in the order they go into the input file."""
    tokens: int
    """Estimated enqueued tokens (>= 0)."""


@final
@dataclass(frozen=True, slots=True)
class SubmissionRecord:
    """A submission as stored."""

    submission_id: str
    run_id: str
    scope: str
    state: SubmissionState
    items: int
    tokens: int
    input_file_id: str | None
    batch_id: str | None
    detail: str | None
    created_at: str
    updated_at: str


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

    def record(self, run_id: str, results: Sequence[NewResult]) -> RunSnapshot:
        """Mark the items done and append their results in order, in one transaction;
        results for items that are not pending are skipped."""

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
