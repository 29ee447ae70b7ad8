"""The mock's Anthropic Message Batches API: a synchronous store of message batches the app drives.

Written from Anthropic's documented wire format (``/v1/messages/batches``):
``POST`` creates a batch of ``{custom_id, params}`` requests, ``GET`` retrieves
or lists (newest first; ``limit``, ``before_id``, ``after_id``), ``POST
…/cancel`` cancels, ``GET …/results`` streams the JSONL results once the
batch has ended, ``DELETE`` deletes an ended batch.

Like the OpenAI store (:mod:`._batch_store`) nothing here does I/O or reads a
clock: the app passes ``now``, and :meth:`AnthropicBatchStore.advance` ends
every batch whose time has come (``batch_latency`` after its creation). Each
request of an ending batch is answered by the injected ``answer`` function,
the app's live ``/v1/messages`` dialect: a 2xx is a ``succeeded`` line, any
other answer an ``errored`` line carrying the live error body. The knobs
``batch_outcomes`` (``"expired"``: the first half answered, the rest
``expired``; ``"failed"``: every line ``errored`` with ``api_error``),
``batch_list`` and ``batch_enqueued_token_limit`` (a create over it is a 429
``rate_limit_error``, as Anthropic refuses a batch over its queue limit) apply.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, final

from ._batch_routes import match_table, route_table
from ._batch_store import EPOCH, BatchReply
from ._inline_batch_store import InlineBatchStore
from ._state import MockServerConfig, mock_token_count

__all__ = ["AnthropicBatchStore", "LineAnswer", "anthropic_error", "match_anthropic_batch_route", "rfc3339"]

LineAnswer = Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]
"""``params -> (status, body)``: one request's ``params``, answered as the live Messages API answers it."""

_CUSTOM_ID: Final = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_MAX_REQUESTS: Final = 100_000
_WINDOW: Final = 24 * 3600
_RESULTS_KEPT: Final = 29 * 24 * 3600
_ROUTES: Final = route_table({
    "/v1/messages/batches": {"POST": "create", "GET": "list"},
    "/v1/messages/batches/{message_batch_id}": {"GET": "get", "DELETE": "delete"},
    "/v1/messages/batches/{message_batch_id}/cancel": {"POST": "cancel"},
    "/v1/messages/batches/{message_batch_id}/results": {"GET": "results"},
})


def match_anthropic_batch_route(method: str, path: str) -> tuple[str, str, str] | str | None:
    """``(template, action, batch id)`` of a Message Batches request; ``"wrong method"`` when only the
    path matches; ``None`` when the path is not a Message Batches path."""
    found = match_table(_ROUTES, method, path)
    return (found[0], found[1], found[2] or "") if isinstance(found, tuple) else found


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error body for ``status`` (its documented error types)."""
    kinds = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
             404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
             529: "overloaded_error"}
    kind = kinds.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def rfc3339(stamp: int) -> str:
    """A wire time: RFC 3339 in UTC, as Anthropic writes its timestamps."""
    return datetime.datetime.fromtimestamp(stamp, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _stamp(now: float) -> int:
    return EPOCH + math.floor(now)


def _error(status: int, message: str) -> BatchReply:
    return BatchReply(status, payload=anthropic_error(status, message), message=message)


@dataclass(slots=True)
class _MessageBatch:
    id: str
    requests: list[tuple[str, dict[str, Any]]]
    tokens: int
    due: float
    outcome: str
    created_at: int
    status: str = "in_progress"
    results: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    stamps: dict[str, int | None] = field(default_factory=dict)

    def wire(self, origin: str) -> dict[str, Any]:
        def at(name: str) -> str | None:
            value = self.stamps.get(name)
            return None if value is None else rfc3339(value)

        counts = {name: self.counts.get(name, 0)
                  for name in ("processing", "succeeded", "errored", "canceled", "expired")}
        if self.status != "ended":
            counts["processing"] = len(self.requests)
        return {
            "id": self.id, "type": "message_batch", "processing_status": self.status,
            "request_counts": counts, "created_at": rfc3339(self.created_at), "ended_at": at("ended_at"),
            "expires_at": rfc3339(self.created_at + _WINDOW),
            "cancel_initiated_at": at("cancel_initiated_at"),
            "archived_at": None,
            "results_url": (f"{origin}/v1/messages/batches/{self.id}/results" if self.status == "ended"
                            else None),
        }


@final
class AnthropicBatchStore(InlineBatchStore[_MessageBatch, LineAnswer]):
    """Message batches of one mock app; every method is synchronous and takes the time it happens at."""

    _over_limit = "Number of enqueued batch tokens would exceed"
    _unknown_id = "No message batch found with id {batch_id!r}."
    _listing = ("message batches", "limit", 20)

    def __init__(self, config: MockServerConfig, answer: LineAnswer) -> None:
        super().__init__(config, answer)
        self.origin = ""
        """Scheme and host the results URLs start with (the app sets it from the request)."""

    @property
    def batches(self) -> list[dict[str, Any]]:
        return [batch.wire(self.origin) for batch in self._batches.values()]

    def _new_id(self) -> str:
        return "msgbatch_" + self._id_digest("msgbatch")[:24]

    def advance(self, now: float) -> None:
        """End every batch that is due at ``now`` (in creation order) and every canceling one."""
        for batch in self._batches.values():
            if batch.status == "canceling":
                self._end(batch, "canceled", now)
            elif batch.status == "in_progress" and batch.due <= now:
                self._end(batch, batch.outcome, batch.due)
        self.enqueued_tokens = sum(b.tokens for b in self._batches.values() if b.status != "ended")

    def _end(self, batch: _MessageBatch, how: str, when: float) -> None:
        run = {"completed": len(batch.requests), "failed": len(batch.requests),
               "expired": len(batch.requests) // 2, "canceled": 0}[how]
        counts = dict.fromkeys(("succeeded", "errored", "canceled", "expired"), 0)
        for index, (custom_id, params) in enumerate(batch.requests):
            result: dict[str, Any]
            if index >= run:
                result = {"type": "expired" if how == "expired" else "canceled"}
            elif how == "failed":
                body = anthropic_error(500, "Internal server error (mock: the batch failed).")
                result = {"type": "errored", "error": body}
            else:
                status, body = self._answer(params)
                self.lines_answered += 1
                ok = 200 <= status < 300
                result = {"type": "succeeded", "message": body} if ok else {"type": "errored", "error": body}
            counts[result["type"]] += 1
            batch.results.append({"custom_id": custom_id, "result": result})
        batch.counts = counts
        batch.status = "ended"
        batch.stamps["ended_at"] = _stamp(when)

    # -- requests -------------------------------------------------------------------------------

    def create(self, raw: bytes, now: float) -> BatchReply:
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "The request body is not valid JSON.")
        requests = body.get("requests") if isinstance(body, dict) else None
        problem = _requests_problem(requests)
        if problem is not None:
            return _error(400, problem)
        assert isinstance(requests, list)  # checked by _requests_problem
        pairs = [(entry["custom_id"], entry["params"]) for entry in requests]
        tokens = sum(mock_token_count(json.dumps([p.get("system"), p.get("messages")])) for _, p in pairs)
        refusal = self._limit_refusal(tokens)
        if refusal is not None:
            return _error(429, refusal)
        batch = _MessageBatch(self._new_id(), pairs, tokens, now + self.config.batch_latency,
                              self._next_outcome(), _stamp(now))
        self._keep(batch)
        return BatchReply(payload=batch.wire(self.origin), created=True)

    def list(self, query: str) -> BatchReply:
        listed = self._page_query(query)
        if isinstance(listed, BatchReply):
            return listed
        params, limit = listed
        newest_first = list(reversed(self._batches.values()))
        ids = [batch.id for batch in newest_first]
        after, before = params.get("after_id", [None])[-1], params.get("before_id", [None])[-1]
        for name, cursor in (("after_id", after), ("before_id", before)):
            if cursor is not None and cursor not in ids:
                return _error(400, f"{name}: {cursor!r} is not the id of a message batch")
        if after is not None:
            page = newest_first[ids.index(after) + 1:][:limit]
            more = len(newest_first) > ids.index(after) + 1 + limit
        elif before is not None:
            page = newest_first[:ids.index(before)][-limit:]
            more = ids.index(before) > limit
        else:
            page, more = newest_first[:limit], len(newest_first) > limit
        return BatchReply(payload={
            "data": [batch.wire(self.origin) for batch in page], "has_more": more,
            "first_id": page[0].id if page else None, "last_id": page[-1].id if page else None,
        })

    def cancel(self, batch_id: str, now: float) -> BatchReply:
        batch = self._find(batch_id)
        if isinstance(batch, BatchReply):
            return batch
        if batch.status == "in_progress":
            batch.status = "canceling"
            batch.stamps["cancel_initiated_at"] = _stamp(now)
        return BatchReply(payload=batch.wire(self.origin))

    def results(self, batch_id: str, now: float) -> BatchReply:
        batch = self._find(batch_id)
        if isinstance(batch, BatchReply):
            return batch
        if batch.status != "ended":
            return _error(400, f"Batch {batch_id} has not ended yet: its results are not available.")
        ended = batch.stamps.get("ended_at") or 0
        if _stamp(now) > ended + _RESULTS_KEPT:
            return _error(404, f"The results of batch {batch_id} are no longer available.")
        return BatchReply(content=b"".join(json.dumps(line).encode() + b"\n" for line in batch.results))

    def delete(self, batch_id: str) -> BatchReply:
        batch = self._find(batch_id)
        if isinstance(batch, BatchReply):
            return batch
        if batch.status != "ended":
            return _error(400, f"Batch {batch_id} is still processing: cancel it before deleting it.")
        del self._batches[batch_id]
        return BatchReply(payload={"id": batch_id, "type": "message_batch_deleted"})

    def _error(self, status: int, message: str) -> BatchReply:
        return _error(status, message)

    def _wire(self, batch: _MessageBatch) -> dict[str, Any]:
        return batch.wire(self.origin)

    def _create_at(self, target: str, raw: bytes, now: float) -> BatchReply:
        return self.create(raw, now)


def _requests_problem(requests: Any) -> str | None:
    if not isinstance(requests, list) or not requests:
        return "requests: Field required (a non-empty list of {custom_id, params})"
    if len(requests) > _MAX_REQUESTS:
        return f"requests: at most {_MAX_REQUESTS} requests per batch, got {len(requests)}"
    seen: set[str] = set()
    for index, entry in enumerate(requests):
        if not isinstance(entry, dict) or not isinstance(entry.get("params"), dict):
            return f"requests.{index}.params: Field required (an object)"
        custom_id = entry.get("custom_id")
        if not isinstance(custom_id, str) or not _CUSTOM_ID.fullmatch(custom_id):
            return f"requests.{index}.custom_id: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
        if custom_id in seen:
            return f"requests.{index}.custom_id: {custom_id!r} is used by more than one request"
        seen.add(custom_id)
    return None
