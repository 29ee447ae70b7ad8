"""The summary ``run`` prints, built as results arrive: a run of millions keeps no result.

:class:`RunSummary` takes each result once (:meth:`RunSummary.add`) and keeps
counts, token sums, the first failure of each kind, and the admission and
execution times as a :class:`LatencySketch`: exact values up to
:data:`EXACT_VALUES` of them, then a log-scale histogram whose percentiles are
within 1 % of the true value, in constant memory. Its text has the layout of
:meth:`BatchResult.summary` (a test holds the two together), plus the items
of the input that were never read because a stop came first: they are
*not run*, like the ones the stop left in the queue. With a response cache
(``--cache``) a ``cache`` line counts the hits (results answered from the
cache), the misses (results looked up and called) and what the hits saved:
the cost of their ``saved_usage`` by the rates of the cost line. After a
``--resume`` the tokens and cost lines are this run's calls only, and a
``replayed`` line shows the replayed results' tokens and cost apart (an
earlier run spent them), so adding up runs counts no call twice; items/s is
over the new items only.
"""

from __future__ import annotations

import math
from array import array
from typing import Any, Final, final

from .._engine._item_run import THROTTLED_BY_429S
from .._values._categories import ErrorCategory
from .._values._cost import DEFAULT_MODEL_RATES, CostSum
from .._values._results import BatchTermination, WorkItemResult, add_usage, is_not_run
from .._values._summary import (  # BatchResult.summary's lines
    NEW_ONLY,
    cached_note,
    cost_line,
    dollars,
    replayed_line,
    stopped_line,
    termination_headline,
)

__all__ = ["EXACT_VALUES", "LatencySketch", "RunSummary", "cache_line"]

EXACT_VALUES: Final = 50_000
_GROWTH: Final = 1.01  # bucket i holds (GROWTH**(i-1), GROWTH**i]: 1 % wide
_LOG_GROWTH: Final = math.log(_GROWTH)
_FLOOR: Final = 1e-6  # seconds; anything smaller (a replay, a cached answer) counts as zero


@final
class LatencySketch:
    """Percentiles of a stream of durations in bounded memory (see the module docstring)."""

    __slots__ = ("_buckets", "_count", "_exact", "_zeros")

    def __init__(self) -> None:
        self._exact: array[float] | None = array("d")
        self._buckets: dict[int, int] = {}
        self._zeros = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, value: float) -> None:
        self._count += 1
        exact = self._exact
        if exact is not None:
            exact.append(value)
            if len(exact) > EXACT_VALUES:
                self._exact = None
                for kept in exact:
                    self._bucket(kept)
            return
        self._bucket(value)

    def _bucket(self, value: float) -> None:
        if value < _FLOOR:
            self._zeros += 1
            return
        index = math.ceil(math.log(value) / _LOG_GROWTH)
        self._buckets[index] = self._buckets.get(index, 0) + 1

    def percentile(self, fraction: float) -> float:
        """The value at ``fraction`` (nearest rank, as :meth:`BatchResult.summary` takes it)."""
        if not self._count:
            return 0.0
        rank = min(self._count - 1, max(0, round(fraction * (self._count - 1))))
        if self._exact is not None:
            return sorted(self._exact)[rank]
        if rank < self._zeros:
            return 0.0
        seen = self._zeros
        for index in sorted(self._buckets):
            seen += self._buckets[index]
            if rank < seen:
                return float(_GROWTH ** (index - 0.5))  # the bucket's geometric middle
        return 0.0  # pragma: no cover - rank < count


@final
class RunSummary:
    """Counts and times of a run's results, one result at a time; ``total`` is the input's size."""

    def __init__(self, total: int, *, model: str | None = None) -> None:
        self.total = total
        self.cost = CostSum(None, table=DEFAULT_MODEL_RATES, default_model=model)
        """This run's estimated dollars, by the built-in rates (results that name no model: ``model``'s);
        replayed results' are in :attr:`replayed_cost`."""
        self.replayed_cost = CostSum(None, table=DEFAULT_MODEL_RATES, default_model=model)
        self.results = 0
        self.succeeded = 0
        self.failed = 0
        self.not_run = 0
        self.replayed = 0
        self.retries = 0
        self.tokens: dict[str, int] = {}
        """This run's own tokens: replayed results' are in :attr:`replayed_tokens`."""
        self.replayed_tokens: dict[str, int] = {}
        self.categories: dict[str, int] = {}
        self.stopped: dict[str, int] = {}
        """Results that did not run to their own end, by stop reason."""
        self.first_failures: dict[ErrorCategory, tuple[str, str | None]] = {}
        self.throttled = 0
        """Results a deadline or a stop cut short while 429s throttled them (their error says so)."""
        self.admission = LatencySketch()
        self.execution = LatencySketch()
        self.cache_hits = 0
        self.cache_misses = 0
        self.saved = CostSum(None, table=DEFAULT_MODEL_RATES, default_model=model)
        """What the cache hits would have cost: their ``saved_usage``, priced as :attr:`cost` prices."""

    def add(self, result: WorkItemResult[Any]) -> None:
        self.results += 1
        if result.success:
            self.succeeded += 1
        elif is_not_run(result):
            self.not_run += 1
        else:
            self.failed += 1
            self.throttled += result.error is not None and THROTTLED_BY_429S in result.error
            category = result.error_category
            if category is not None:
                self.categories[category.value] = self.categories.get(category.value, 0) + 1
                self.first_failures.setdefault(category, (result.item_id, result.error))
        if result.stop_reason is not None:
            self.stopped[result.stop_reason.value] = self.stopped.get(result.stop_reason.value, 0) + 1
        model = result.metadata.get("model") if isinstance(result.metadata, dict) else None
        if result.replayed:  # an earlier run's spend: shown apart, never added to this run's
            add_usage(self.replayed_tokens, result.token_usage)
            self.replayed_cost.add(result.token_usage, model)
        else:
            add_usage(self.tokens, result.token_usage)
            self.cost.add(result.token_usage, model)
        if result.cached:
            self.cache_hits += 1
            self.saved.add(result.saved_usage, model)
        elif result.cache_key is not None:
            self.cache_misses += 1
        if result.replayed:
            self.replayed += 1
            return
        self.retries += max(0, result.attempts - 1)
        if not is_not_run(result):
            self.admission.add(result.timing.admission_wait)
            self.execution.add(result.timing.execution)

    @property
    def never_read(self) -> int:
        """Items of the input that never got a result: a stop came before they were read."""
        return max(0, self.total - self.results)

    @property
    def unfinished(self) -> int:
        """Items that did not succeed: failed, not run, or never read."""
        return self.total - self.succeeded

    def text(self, termination: BatchTermination, wall_time: float) -> str:
        """The table, laid out as :meth:`BatchResult.summary` lays it out."""
        not_run = self.not_run + self.never_read
        ran = len(self.execution)
        rate = ran / wall_time if wall_time > 0 else 0.0
        tokens = self.tokens
        new = self.results - self.replayed - self.not_run
        lines = [
            termination_headline(termination),
            f"  items       {self.total:>10,}   succeeded {self.succeeded:,}   failed {self.failed:,}"
            + (f"   not run {not_run:,}" if not_run else "") + f"   replayed {self.replayed:,}"
            + (f"   new {new:,}" if self.replayed else ""),
            f"  retries     {self.retries:>10,}",
            f"  tokens      {tokens.get('total_tokens', 0):>10,}   in {tokens.get('input_tokens', 0):,}"
            f"   out {tokens.get('output_tokens', 0):,}" + cached_note(tokens),
        ]
        # As BatchResult.new_cost: a run that made no call spent nothing.
        cost = self.cost.total if new else 0.0
        if cost is not None:
            lines.append(cost_line(cost, built_in=True))
        if self.cache_hits or self.cache_misses:
            lines.append(cache_line(self.cache_hits, self.cache_misses, self.saved.total))
        if self.replayed:
            lines.append(replayed_line(self.replayed_tokens, self.replayed_cost.total))
        lines.append(f"  wall time   {wall_time:>10.3f} s   {rate:,.0f} items/s"
                     + NEW_ONLY * bool(self.replayed))
        if self.categories:
            detail = ", ".join(f"{k} {v:,}" for k, v in sorted(self.categories.items()))
            lines.append(f"  failures    {detail}")
        if (line := stopped_line(self.stopped)) is not None:
            lines.append(line)
        if self.throttled:
            lines.append(f"  throttled   {self.throttled:>10,}   cut short while 429s held them back")
        if ran:
            lines.append("                    p50        p95        p99")
            for label, sketch in (("admission", self.admission), ("execution", self.execution)):
                p = [sketch.percentile(q) * 1000 for q in (0.5, 0.95, 0.99)]
                lines.append(f"  {label:<11}{p[0]:>8.1f}ms {p[1]:>8.1f}ms {p[2]:>8.1f}ms")
        return "\n".join(lines)

    def first_failure_lines(self) -> list[str]:
        """One line per failure category, with its first item's error: the reason, where it says
        how to fix it."""
        return [f"first {category.value} failure: item {item_id!r}: {error}"
                for category, (item_id, error) in self.first_failures.items()]



def cache_line(hits: int, misses: int, saved: float | None) -> str:
    """The summary's cache line, laid out as :meth:`BatchResult.summary` lays it out (a test holds
    the two together): hits, misses, the hit rate in percent, and what the hits saved when priced."""
    rate = 100.0 * hits / (hits + misses) if hits + misses else 0.0
    return (f"  cache hits  {hits:>10,}   misses {misses:,}   rate {rate:.1f} %"
            + (f"   saved {dollars(saved)}" if saved is not None else ""))
