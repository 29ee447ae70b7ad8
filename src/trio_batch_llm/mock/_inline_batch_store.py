"""What the mock's Anthropic and Gemini batch stores share: batches, ids, outcomes, the queue limit, dispatch.

Both providers take a batch's requests inline, and both stores keep the app's batches in
creation order, make seeded ids, take the scripted ``batch_outcomes`` in turn, refuse a
create past ``batch_enqueued_token_limit`` and turn a route's action into an operation
the same way; both answer an id they do not know with a 404 and read a listing's page
query by one rule: :class:`InlineBatchStore` is that, once. Each store keeps its own wire
(its batch record, its error body, its words) and its operations.
"""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from ._batch_store import BatchReply, listing_page
from ._state import MockServerConfig

__all__ = ["InlineBatchStore"]


class _Kept(Protocol):
    id: str
    tokens: int  # input tokens, as the enqueued-token limit counts them


B = TypeVar("B", bound=_Kept)
A = TypeVar("A")


class InlineBatchStore(Generic[B, A]):
    """The batches of one mock app (``B``), their lines answered by ``answer`` (``A``, the live dialect)."""

    _over_limit: ClassVar[str]
    """How the provider begins its 429 for a create past the enqueued-token limit."""
    _unknown_id: ClassVar[str]
    """The provider's 404 message for a batch id it does not know (``{batch_id}`` in it)."""
    _listing: ClassVar[tuple[str, str, int]]
    """A listing's words: what the batches are called, the page-size parameter, its default."""

    def __init__(self, config: MockServerConfig, answer: A) -> None:
        self.config = config
        self.lines_answered = 0
        self.enqueued_tokens = 0
        self._answer = answer
        self._batches: dict[str, B] = {}  # creation order
        self._ids = 0
        self._outcomes = iter(config.batch_outcomes)

    def _id_digest(self, kind: str) -> str:
        """The next batch's id, as a digest of the seed: the same ids on every run of a seed."""
        self._ids += 1
        return hashlib.sha256(f"{self.config.seed}\x00{kind}\x00{self._ids}".encode()).hexdigest()

    def _next_outcome(self) -> str:
        return next(self._outcomes, "completed")

    def _limit_refusal(self, tokens: int) -> str | None:
        """The 429's message when ``tokens`` more would pass the enqueued-token limit, else ``None``."""
        limit = self.config.batch_enqueued_token_limit
        if limit is not None and self.enqueued_tokens + tokens > limit:
            return (f"{self._over_limit} the limit of {limit} (mock; "
                    f"already enqueued: {self.enqueued_tokens}, this batch: {tokens}).")
        return None

    def _keep(self, batch: B) -> None:
        self._batches[batch.id] = batch
        self.enqueued_tokens += batch.tokens

    def _find(self, batch_id: str) -> B | BatchReply:
        """The batch with this id, or the provider's 404 for an id it does not know."""
        batch = self._batches.get(batch_id)
        return self._unknown(batch_id) if batch is None else batch

    def _unknown(self, batch_id: str) -> BatchReply:
        return self._error(404, self._unknown_id.format(batch_id=batch_id))

    def _page_query(self, query: str) -> tuple[dict[str, list[str]], int] | BatchReply:
        """A listing's query and page size, or the provider's refusal of it."""
        what, size, default = self._listing
        return listing_page(self.config, query, self._error, what=what, size=size, default=default, most=1000)

    def get(self, batch_id: str) -> BatchReply:
        batch = self._find(batch_id)
        return batch if isinstance(batch, BatchReply) else BatchReply(payload=self._wire(batch))

    def dispatch(self, action: str, target: str, raw: bytes, query: str, now: float) -> BatchReply:
        """Perform one request (after ``advance``); ``raw`` is the request body."""
        if action in ("create", "list"):  # target: the model a Gemini create names, else the batch
            return self._create_at(target, raw, now) if action == "create" else self.list(query)
        if action in ("cancel", "results"):
            return (self.cancel if action == "cancel" else self.results)(target, now)
        return (self.get if action == "get" else self.delete)(target)

    # -- the wire and the operations, each store's own --------------------------------------------

    def _error(self, status: int, message: str) -> BatchReply:
        """An error answer, shaped as the provider shapes its errors."""
        raise NotImplementedError

    def _wire(self, batch: B) -> dict[str, Any]:
        """A batch as the provider writes it in an answer."""
        raise NotImplementedError

    def _create_at(self, target: str, raw: bytes, now: float) -> BatchReply:
        raise NotImplementedError

    def list(self, query: str) -> BatchReply:
        raise NotImplementedError

    def cancel(self, batch_id: str, now: float) -> BatchReply:
        raise NotImplementedError

    def results(self, batch_id: str, now: float) -> BatchReply:
        """The results of an ended batch, where they are a file of their own (Gemini's are inline)."""
        raise NotImplementedError

    def delete(self, batch_id: str) -> BatchReply:
        raise NotImplementedError
