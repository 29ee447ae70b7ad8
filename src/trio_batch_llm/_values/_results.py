"""Per-item results, token usage and timing, and how a batch ended (the batch: :mod:`._batch_result`)."""

from __future__ import annotations

import statistics as _stats
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Final, Generic, Literal, TypedDict, TypeVar, final

from ._categories import ErrorCategory
from ._details import DETAILS_METADATA_KEY, ResponseDetails
from ._pricing import BUILT_IN_FIGURES, Rates
from ._stop_reasons import StopReason, stop_reason_of
from ._timing import ItemTiming
from ._urls import redact_urls
from ._usage import add_usage as add_usage  # the engine and the CLI import it from here
from ._usage import usage_total as usage_total  # where the engine has always imported it from

__all__ = [
    "BatchTermination",
    "ItemTiming",
    "RetryState",
    "TerminationKind",
    "TokenUsage",
    "WorkItemResult",
]

TOutput = TypeVar("TOutput")


_BUILT_IN: Final[Mapping[str, Rates]] = BUILT_IN_FIGURES
TerminationKind = Literal[
    "completed", "batch_deadline", "budget_exhausted", "aborted", "interrupted", "provider_retired"
]


class TokenUsage(TypedDict, total=False):
    """Tokens one call (or the sum of an item's attempts) used; missing keys mean unknown.
    ``input_tokens`` is every input token (Anthropic's field leaves out cache reads and writes;
    its strategy adds them back). As 0 when missing: ``cached_input_tokens`` (read from the
    prompt cache) and ``cache_write_input_tokens`` (written to it, billed above the input rate),
    parts of ``input_tokens``; ``reasoning_tokens``, part of ``output_tokens``."""

    input_tokens: int
    output_tokens: int
    total_tokens: int
    cached_input_tokens: int
    cache_write_input_tokens: int
    reasoning_tokens: int


@final
@dataclass(slots=True)
class RetryState:
    """Per-item state carried across attempts; a strategy may use ``data`` freely."""

    attempt: int = 0
    last_error: BaseException | None = None
    last_category: ErrorCategory | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: object = None) -> object:
        return self.data.get(key, default)

    def set(self, key: str, value: object) -> None:
        self.data[key] = value


@final
@dataclass(slots=True)
class WorkItemResult(Generic[TOutput]):
    """The one typed outcome of one item. ``exception`` is never serialized.

    ``item_id, success, output, error`` may be given positionally (async-batch-llm's
    order); the rest by keyword.
    """

    item_id: str
    success: bool
    output: TOutput | None = None
    error: str | None = None
    _: KW_ONLY
    exception: BaseException | None = field(default=None, repr=False, compare=False)
    error_category: ErrorCategory | None = None
    attempts: int = 0
    token_usage: dict[str, int] = field(default_factory=dict)
    timing: ItemTiming = field(default_factory=ItemTiming)
    context: object = None
    metadata: dict[str, Any] = field(default_factory=dict)
    replayed: bool = False
    details: ResponseDetails | None = None
    """Finish reason, refusal, tool calls, logprobs (``None`` when the strategy gave none)."""
    stop_reason: StopReason | None = None
    """Why the item did not run to its own end (``None``: it did, or it is not known)."""
    cached: bool = False
    """The answer came from the response cache: no provider call, no cost (``token_usage`` is empty)."""
    cache_key: str | None = None
    """The response-cache key the item was looked up under (hit or miss); ``None``: no cache was used."""
    saved_usage: dict[str, int] = field(default_factory=dict)
    """A cached result's tokens as the original call used them (what the cache saved); empty otherwise."""

    def __post_init__(self) -> None:
        # A strategy hands the details over in its metadata; they live here, not there.
        # (Built for every result, 10,000 at once when a stop reports a queue: the usual empty
        # metadata costs one truth test.)
        if self.details is None and self.metadata and isinstance(self.metadata.get(DETAILS_METADATA_KEY),
                                                                  ResponseDetails):
            self.metadata = dict(self.metadata)
            self.details = self.metadata.pop(DETAILS_METADATA_KEY)
        # The error text goes to files and logs: a key inside a URL in it (an HTTP client's
        # "... for url 'http://user:KEY@host/v1'") must not.
        if self.error is not None and "://" in self.error:
            self.error = redact_urls(self.error)

    def to_dict(self) -> dict[str, Any]:
        data = {
            "item_id": self.item_id,
            "success": self.success,
            "output": self.output,
            "error": self.error,
            "error_category": self.error_category.value if self.error_category else None,
            "attempts": self.attempts,
            "token_usage": dict(self.token_usage),
            "timing": self.timing.to_dict(),
            "context": self.context,
            "metadata": dict(self.metadata),
        }
        if self.details is not None:  # absent otherwise: records stay as they were before details
            data["details"] = self.details.to_dict()
        if self.stop_reason is not None:  # the same: a record of an item that ran to its end is unchanged
            data["stop_reason"] = self.stop_reason.value
        if self.cache_key is not None:  # the same: records made without a cache are unchanged
            data["cache_key"] = self.cache_key
            if self.cached:
                data["cached"] = True
                data["saved_usage"] = dict(self.saved_usage)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, replayed: bool = False) -> WorkItemResult[Any]:
        category = data.get("error_category")
        timing = data.get("timing") or {}
        details = data.get("details")
        return cls(
            item_id=str(data["item_id"]),
            success=bool(data["success"]),
            output=data.get("output"),
            error=data.get("error"),
            error_category=ErrorCategory(category) if category else None,
            attempts=int(data.get("attempts", 0)),
            token_usage=dict(data.get("token_usage") or {}),
            timing=ItemTiming.from_dict(timing),
            context=data.get("context"),
            metadata=dict(data.get("metadata") or {}),
            replayed=replayed,
            details=ResponseDetails.from_dict(details) if isinstance(details, Mapping) else None,
            stop_reason=stop_reason_of(data.get("stop_reason")),
            cached=bool(data.get("cached", False)),
            cache_key=data.get("cache_key"),
            saved_usage=dict(data.get("saved_usage") or {}),
        )


@final
@dataclass(frozen=True, slots=True)
class BatchTermination:
    """Why a batch stopped: ``completed`` or one of the controlled stops."""

    kind: TerminationKind = "completed"
    reason: str | None = None
    item_id: str | None = None
    """The item whose result triggered the stop (an abort, a spent budget, a retired provider)."""

    @property
    def completed(self) -> bool:
        return self.kind == "completed"

    def to_dict(self) -> dict[str, Any]:  # item_id only when an item decided the stop: old records stay
        item = {"item_id": self.item_id} if self.item_id is not None else {}
        return {"kind": self.kind, "reason": self.reason} | item

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BatchTermination:
        return cls(kind=data.get("kind", "completed"), reason=data.get("reason"), item_id=data.get("item_id"))


NOT_RUN_CATEGORIES: Final = frozenset({ErrorCategory.NOT_EXECUTED, ErrorCategory.BUDGET})
"""The verdicts of items that a stop kept from ever starting."""


def is_not_run(result: WorkItemResult[Any]) -> bool:
    """Whether ``result`` is of an item that never started: a stop came first (no attempt made)."""
    return not result.success and result.attempts == 0 and result.error_category in NOT_RUN_CATEGORIES


def mean(values: list[float]) -> float:
    return _stats.fmean(values) if values else 0.0
