"""Settling a finished provider batch: each of its items becomes a result, a retry, or unrun.

Pure (no I/O, no clock of its own): the batch driver calls :func:`settle` in a
worker thread, since decoding and encoding tens of thousands of lines would
stall the event loop, and applies the :class:`Settlement` afterwards, in one
repository transaction (``finish_submission``) and its retry bookkeeping.

An item's fate, in order:

1. the provider answered it: a successful result (one attempt used);
2. it never ran (the batch expired or was cancelled first): back to pending,
   no attempt used;
3. it failed with a retryable error and has attempts left (``max_attempts``):
   back to pending, one attempt used, ready again after the retry backoff
   (drawn per item and attempt, so independent of the order results arrive in);
4. otherwise a failed result, with the provider's error (or, for an item the
   batch has no answer for, a ``SERVER`` error saying so).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast, final

from .._strategies._batch import BatchEndpoint, BatchInfo, BatchItemOutcome
from .._values._categories import ErrorCategory
from .._values._config import RetryConfig
from .._values._errors import ProviderError
from .._values._results import WorkItemResult
from ._encode import encode_new_result
from ._ingest import decode_context
from ._schema import NewResult, PendingItem

__all__ = ["Settlement", "describe_errors", "failure_of", "settle"]


@final
@dataclass(frozen=True, slots=True)
class Settlement:
    """What a finished batch means for its items; see the module docstring."""

    results: list[NewResult]
    retry: list[str]
    """Items back to pending with one attempt used."""
    retry_at: dict[str, float]
    """When each retried item may go into a batch again."""
    unrun: list[str]
    """Items back to pending as they were (the provider never ran them)."""
    answered: bool
    """The provider answered at least one item: it is taking batches again."""


def settle(
    endpoint: BatchEndpoint, info: BatchInfo, files: Sequence[bytes], items: Sequence[PendingItem], *,
    retry: RetryConfig, now: float, location: str,
) -> Settlement:
    """Each of ``items``' fate from the batch's downloaded ``files`` (``items`` in request-file order)."""
    outcomes = endpoint.decode_results(info, files, [item.item_id for item in items])
    results: list[NewResult] = []
    retried: list[str] = []
    retry_at: dict[str, float] = {}
    unrun: list[str] = []
    answered = False
    for item in items:
        outcome = outcomes.get(item.item_id)
        if outcome is not None and outcome.success:
            results.append(_success(item, outcome, info, location))
            answered = True
            continue
        error = outcome.error if outcome is not None else None
        if error is None:
            error = ProviderError(
                f"batch {info.id} ended {info.status} without an answer for this item"
                + (f" ({describe_errors(info)})" if info.errors else ""),
                category=ErrorCategory.SERVER,
            )
        attempts = item.attempts + 1
        if outcome is not None and not outcome.executed:
            unrun.append(item.item_id)
        elif error.category.retryable and attempts < retry.max_attempts:
            retried.append(item.item_id)
            wait = retry.wait_before_retry(item.attempts, error.retry_after,
                                           _jitter(retry, item.item_id, attempts))
            retry_at[item.item_id] = now + wait
        else:
            results.append(failure_of(item, error, info, location, outcome))
    return Settlement(results=results, retry=retried, retry_at=retry_at, unrun=unrun, answered=answered)


def _jitter(retry: RetryConfig, item_id: str, attempt: int) -> random.Random | None:
    """Per item and attempt, as live retries draw it: independent of the order results arrive in."""
    seed = retry.jitter_seed
    return None if seed is None else random.Random(f"{seed}\0{item_id}\0{attempt}")


def _success(item: PendingItem, outcome: BatchItemOutcome, info: BatchInfo, location: str) -> NewResult:
    usage = cast("dict[str, int]", dict(outcome.usage or {}))
    metadata = {**outcome.metadata, "batch_id": info.id}
    result = WorkItemResult[Any](
        item_id=item.item_id, success=True, output=outcome.text, attempts=item.attempts + 1,
        token_usage=usage, context=decode_context(item.context_json), metadata=metadata,
    )
    return encode_new_result(result, location)


def failure_of(item: PendingItem, error: ProviderError, info: BatchInfo | None, location: str,
               outcome: BatchItemOutcome | None = None) -> NewResult:
    """A failed result; an attempt is counted only when the item was in a batch (``info``)."""
    metadata: dict[str, Any] = dict(outcome.metadata) if outcome is not None else {}
    if info is not None:
        metadata["batch_id"] = info.id
    result = WorkItemResult[Any](
        item_id=item.item_id, success=False, error=f"{type(error).__name__}: {error}",
        error_category=error.category, attempts=item.attempts + (1 if info is not None else 0),
        context=decode_context(item.context_json), metadata=metadata,
    )
    return encode_new_result(result, location)


def describe_errors(info: BatchInfo) -> str:
    return "; ".join(f"{code}: {message}" for code, message in info.errors) or info.status
