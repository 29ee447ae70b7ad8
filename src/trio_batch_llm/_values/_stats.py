"""Counters a run keeps, and the frozen statistics records owners expose."""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any, final

__all__ = ["CounterSnapshot", "ProcessorStatistics", "RunCounters"]


@final
@dataclass(frozen=True, slots=True)
class CounterSnapshot:
    accepted: int
    finished: int
    succeeded: int
    failed: int
    replayed: int
    input_tokens: int
    output_tokens: int
    total_tokens: int
    cost: float
    cached: int = 0
    """Results answered by the response cache (counted in ``succeeded`` too)."""


class RunCounters:
    """Plain mutable counters, updated on the event loop only (no locking needed)."""

    __slots__ = (
        "accepted",
        "cached",
        "cost",
        "failed",
        "finished",
        "input_tokens",
        "output_tokens",
        "replayed",
        "succeeded",
        "total_tokens",
    )

    def __init__(self) -> None:
        self.accepted = 0
        self.finished = 0
        self.succeeded = 0
        self.failed = 0
        self.replayed = 0
        self.cached = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.total_tokens = 0
        self.cost = 0.0

    def add_tokens(self, usage: Mapping[str, int]) -> None:
        inp = usage.get("input_tokens", 0)
        out = usage.get("output_tokens", 0)
        self.input_tokens += inp
        self.output_tokens += out
        self.total_tokens += usage.get("total_tokens", inp + out)

    def snapshot(self) -> CounterSnapshot:
        return CounterSnapshot(
            accepted=self.accepted,
            finished=self.finished,
            succeeded=self.succeeded,
            failed=self.failed,
            replayed=self.replayed,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            total_tokens=self.total_tokens,
            cost=self.cost,
            cached=self.cached,
        )


@final
@dataclass(frozen=True, slots=True)
class ProcessorStatistics:
    """A processor's state at one instant.

    ``await processor.statistics()`` (async-batch-llm's form) gives the same record.
    """

    mode: str
    state: str
    workers: int
    queued: int
    counters: CounterSnapshot
    termination: str | None

    def __await__(self) -> Generator[Any, None, ProcessorStatistics]:
        # A generator that returns at once: awaiting the record neither suspends nor checkpoints.
        return self
        yield  # type: ignore[unreachable]
