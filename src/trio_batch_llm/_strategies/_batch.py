"""The Batch API contract between a durable run and a provider (``mode="provider-batch"``).

A strategy that can send its calls through a provider's batch interface
offers a :class:`BatchEndpoint` from :meth:`LLMCallStrategy.batch_endpoint`;
a run reaches the provider only through it. The contract speaks in the run's
terms (an item is an id and a prompt; a submission is a request file of
items; the answer is one :class:`BatchItemOutcome` per item), and the
provider's side owns its wire format both ways: it encodes each item's
request line and decodes its result files back to per-item outcomes.

Two halves:

* :class:`BatchEndpoint` is pure and cheap to make: encode a request, decode
  a finished batch's files, judge a failed create, name the default capacity
  scope. The run calls :meth:`~BatchEndpoint.encode_request` and
  :meth:`~BatchEndpoint.decode_results` from worker threads (a request file
  may hold 50,000 lines), so both must be thread-safe.
* :meth:`BatchEndpoint.connect` returns a :class:`BatchConnection` for one
  drive segment: the requests (upload a request file, create a batch with
  metadata, retrieve it, find it by its metadata, download its files, cancel
  it). Each request is bounded by ``request_timeout`` (no answer in time:
  :class:`ProviderError` with ``status_code=None``), and none starts at or
  after ``start_before`` (the run's ``wait()`` deadline; the caller's cancel
  scope fires then, so a request that would start parks until it does). The
  segment closes it with :meth:`~BatchConnection.aclose`.

Every failure is a :class:`ProviderError`. The contract lives beside the
strategy protocol, not in ``_runs``: ``_strategies._base`` names it, and a
strategy knows nothing of runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, final

from .._values._errors import ProviderError
from .._values._results import TokenUsage

__all__ = ["BatchConnection", "BatchEndpoint", "BatchInfo", "BatchItemOutcome", "BatchRequest", "SendMark"]


@final
@dataclass(frozen=True, slots=True)
class BatchRequest:
    """One item's request, encoded by the provider's side."""

    line: bytes
    """Its line of the request file, newline-terminated; a file is its items' lines in order."""
    text: str
    """All the text the request carries (system prompt and prompt), for the enqueued-token estimate."""


@final
@dataclass(frozen=True, slots=True)
class BatchInfo:
    """What a run uses of a provider batch."""

    id: str
    status: str
    """The provider's word for its state, for messages."""
    terminal: bool = False
    """Finished one way or another (completed, failed, expired, cancelled): its files are final."""
    capacity_refused: bool = False
    """Refused for the provider's enqueued-token limit: nothing of it ran."""
    result_files: tuple[str, ...] = ()
    """The ids of the files that hold its answers (output and errors), to download once terminal."""
    errors: tuple[tuple[str, str], ...] = ()
    """``(code, message)`` of batch-level errors (a failed validation, a refusal)."""
    error_lines: Mapping[int, str] = field(default_factory=dict)
    """Request-file lines (1-based) the provider rejected when it validated the file: ``{line: text}``."""
    metadata: Mapping[str, str] = field(default_factory=dict)


@final
@dataclass(frozen=True, slots=True)
class BatchItemOutcome:
    """What a finished batch says about one item."""

    text: str | None = None
    usage: TokenUsage | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    error: ProviderError | None = None
    executed: bool = True
    """False for a request the batch never ran (it expired or was cancelled first): no attempt used."""

    @property
    def success(self) -> bool:
        return self.error is None


@final
@dataclass(slots=True)
class SendMark:
    """Whether a create got past the gate: before that, its outcome is known (it was never sent)."""

    sent: bool = False


class BatchConnection(Protocol):
    """The requests of one drive segment; see the module docstring."""

    async def upload(self, filename: str, content: bytes) -> str:
        """Upload a request file; its file id."""
        ...

    async def create(
        self, input_file_id: str, *, completion_window: str, metadata: Mapping[str, str],
        sending: SendMark | None = None,
    ) -> BatchInfo:
        """Create a batch of the uploaded file carrying ``metadata``; ``sending.sent`` turns true
        as soon as the request may have left (a failure after that has an outcome to judge:
        :meth:`BatchEndpoint.create_outcome_unknown`)."""
        ...

    async def retrieve(self, batch_id: str) -> BatchInfo | None:
        """The batch as it is now; ``None`` if the provider has no such batch."""
        ...

    async def find(self, key: str, value: str) -> BatchInfo | None:
        """The newest batch whose metadata has ``key == value``; ``None`` if none is found."""
        ...

    async def download(self, file_id: str) -> bytes: ...

    async def cancel(self, batch_id: str) -> None:
        """Ask the provider to cancel the batch (what already ran stays in its files)."""
        ...

    async def aclose(self) -> None:
        """Close what the connection opened; idempotent, bounded, closes even when cancelled."""
        ...


class BatchEndpoint(Protocol):
    """One provider's Batch API for one strategy's endpoint, key, model and request settings."""

    @property
    def capacity_scope(self) -> str:
        """The default name of the enqueued-token limit these batches count against (shared by
        every run on a store): one model behind one endpoint and key. Never the key itself."""
        ...

    def encode_request(self, item_id: str, prompt: str) -> BatchRequest:
        """The request of one item (thread-safe: called from worker threads).

        ``prompt`` is the item's request as one text (``request_text``): a text prompt as
        is, an item with messages or params as marked JSON (``request_of_text`` unpacks it).
        """
        ...

    def decode_results(
        self, batch: BatchInfo, files: Sequence[bytes], item_ids: Sequence[str]
    ) -> dict[str, BatchItemOutcome]:
        """Each item's outcome from a terminal batch's downloaded files, by item id; ``item_ids``
        are the batch's items in request-file order. An item without an outcome got no readable
        answer (it is tried again). Thread-safe: called from worker threads."""
        ...

    # An endpoint may also have ``max_file_bytes: int``: the largest request file its batches take,
    # when under ProviderBatchConfig.max_file_bytes (Gemini's inline requests); runs chunk by the smaller.

    def create_outcome_unknown(self, error: ProviderError) -> bool:
        """Whether a create that failed with ``error`` after it was sent may still have made the batch."""
        ...

    def connect(self, *, request_timeout: float, start_before: float) -> BatchConnection:
        """The requests of one drive segment (opens nothing until the first request)."""
        ...
