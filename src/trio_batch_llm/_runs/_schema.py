"""The records of a durable run: what a handle reports, and what crosses the repository boundary.

A *run* is a named, resumable job: its status, its items (ingested from a
source, each ``pending`` until its one terminal result is recorded), a
per-run result sequence, and the source checkpoint. :class:`RunSnapshot`,
:class:`RunResult`, :class:`RunTermination` and :class:`SourceCheckpoint` are
public; the rest are what the run side and a :class:`RunRepository`
(``repository/_protocol.py``, which says what each call must do) exchange.

Provider Batch API mode adds *submissions*: a group of a run's items sent to
the provider as one batch. While a submission is live (``reserved``,
``creating``, ``unknown`` or ``submitted``) its items are ``batched`` (neither
pending nor done) and its estimated tokens count against its *scope*'s
enqueued-token capacity, which every run in the same store shares.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal, final

from .._values._config import ArtifactIdentity
from .._values._errors import ArtifactStoreError, RunSourceError, RunStateError
from .._values._results import WorkItemResult
from .._values._urls import redact_urls

__all__ = [
    "LIVE_SUBMISSION_STATES",
    "ClaimLostError",
    "LeaseLostError",
    "TERMINAL_STATUSES",
    "UNRESOLVED_SUBMISSION_STATES",
    "NewItem",
    "NewSubmission",
    "NewResult",
    "PendingItem",
    "RunMode",
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


class LeaseLostError(RunStateError):
    """A driver's lease on a run's items has expired or ended: its results are refused."""


class ClaimLostError(ArtifactStoreError):
    """The run's claim went with a lost connection and another process took it meanwhile.

    Nothing was executed by the call that raises it. A driver ends its segment
    (not the run): the claim's new holder drives, or ingests, from there.
    """


@final
@dataclass(frozen=True, slots=True)
class RunTermination:
    """Why a run stopped: ``completed``, ``cancelled``, ``paused``, ``aborted``,
    ``budget_exhausted``, ``ingestion_failed`` or ``error``."""

    kind: str
    reason: str | None = None
    item_id: str | None = None
    """The item whose result decided the stop (an abort, a spent budget), as ``BatchTermination`` names it."""

    def __post_init__(self) -> None:
        if self.reason is not None and "://" in self.reason:  # stored and printed: no key in a URL
            object.__setattr__(self, "reason", redact_urls(self.reason))

    def to_dict(self) -> dict[str, str | None]:
        data = {"kind": self.kind, "reason": self.reason}
        if self.item_id is not None:  # absent otherwise: stored terminations stay as they were
            data["item_id"] = self.item_id
        return data


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
