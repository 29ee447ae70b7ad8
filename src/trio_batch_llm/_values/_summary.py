"""A batch's readable summary: the text :meth:`BatchResult.summary` and the command line's summary print.

Reporting only: the figures come from the batch record (:mod:`._batch_result`)
and its prices from :mod:`._cost`; here they are laid out. The command line
builds its summary from counts as a run streams by, not from a
:class:`BatchResult`, so each line both print is a function here, and the two
cannot drift apart.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any, Final, Protocol

from ._cost import DEFAULT_MODEL_RATES_AS_OF, Rates
from ._results import BatchTermination, WorkItemResult, is_not_run

__all__ = [
    "NEW_ONLY",
    "batch_summary",
    "cached_note",
    "cost_line",
    "dollars",
    "replayed_line",
    "stopped_line",
    "termination_headline",
]

NEW_ONLY: Final = " (new items only)"
"""After the items/s of a resume: replayed results are not throughput."""


class SummarizedBatch(Protocol):
    """What :func:`batch_summary` reads of a :class:`BatchResult`: its record, its figures and prices."""

    results: list[WorkItemResult[Any]]
    termination: BatchTermination
    total_items: int
    succeeded: int
    failed: int
    wall_time: float

    @property
    def cache_hits(self) -> int: ...
    @property
    def cache_misses(self) -> int: ...
    def new_tokens(self) -> dict[str, int]: ...
    def replayed_tokens(self) -> dict[str, int]: ...
    def new_cost(self, rates: Rates | Mapping[str, Rates] | None = None) -> float | None: ...
    def replayed_cost(self, rates: Rates | Mapping[str, Rates] | None = None) -> float | None: ...
    def cache_savings(self, rates: Rates | Mapping[str, Rates] | None = None) -> float | None: ...


def batch_summary(batch: SummarizedBatch, rates: Rates | Mapping[str, Rates] | None) -> str:
    """:meth:`BatchResult.summary`'s table (its docstring says what each line counts)."""
    executed = [r for r in batch.results if not r.replayed]
    retries = sum(max(0, r.attempts - 1) for r in executed)
    tokens = batch.new_tokens()
    replayed = len(batch.results) - len(executed)
    not_run = sum(1 for r in batch.results if is_not_run(r))
    ran = [r for r in executed if not is_not_run(r)]
    rate = len(ran) / batch.wall_time if batch.wall_time > 0 else 0.0
    lines = [
        termination_headline(batch.termination),
        f"  items       {batch.total_items:>10,}   succeeded {batch.succeeded:,}"
        f"   failed {batch.failed - not_run:,}" + (f"   not run {not_run:,}" if not_run else "")
        + f"   replayed {replayed:,}" + (f"   new {len(ran):,}" if replayed else ""),
        f"  retries     {retries:>10,}",
        f"  tokens      {tokens.get('total_tokens', 0):>10,}   in {tokens.get('input_tokens', 0):,}"
        f"   out {tokens.get('output_tokens', 0):,}" + cached_note(tokens),
    ]
    cost = batch.new_cost(rates)
    if cost is not None:
        lines.append(cost_line(cost, built_in=rates is None))
    if any(r.cache_key is not None for r in batch.results):  # a response cache was used
        hits, misses = batch.cache_hits, batch.cache_misses
        saved = batch.cache_savings(rates)
        hit_rate = _percent(hits, hits + misses)
        lines.append(f"  cache hits  {hits:>10,}   misses {misses:,}   rate {hit_rate:.1f} %"
                     + (f"   saved {dollars(saved)}" if saved is not None else ""))
    if replayed:
        lines.append(replayed_line(batch.replayed_tokens(), batch.replayed_cost(rates)))
    lines += [
        f"  wall time   {batch.wall_time:>10.3f} s   {rate:,.0f} items/s" + NEW_ONLY * bool(replayed),
    ]
    categories: dict[str, int] = {}
    for r in batch.results:
        if not r.success and r.error_category is not None and not is_not_run(r):
            categories[r.error_category.value] = categories.get(r.error_category.value, 0) + 1
    if categories:
        detail = ", ".join(f"{k} {v:,}" for k, v in sorted(categories.items()))
        lines.append(f"  failures    {detail}")
    if line := stopped_line(Counter(r.stop_reason.value for r in batch.results if r.stop_reason)):
        lines.append(line)  # why the items that did not run to their own end did not
    fenced = sum(1 for r in executed if r.metadata.get("fence_recovered") is True)
    if fenced:  # structured answers that came wrapped in a markdown code fence, unwrapped
        lines.append(f"  structured  {fenced:,} answers recovered from a code fence")
    if ran:
        lines.append("                    p50        p95        p99")
        for label, attr in (("admission", "admission_wait"), ("execution", "execution")):
            values = sorted(getattr(r.timing, attr) for r in ran)
            p = [_percentile(values, q) * 1000 for q in (0.5, 0.95, 0.99)]
            lines.append(f"  {label:<11}{p[0]:>8.1f}ms {p[1]:>8.1f}ms {p[2]:>8.1f}ms")
    return "\n".join(lines)


def _percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


def _percent(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole > 0 else 0.0


# The stops a guardrail or the provider decided: "stopped", and what stopped it when the reason is lost.
_STOPPED: Final[Mapping[str, str]] = {
    "batch_deadline": "batch deadline reached",
    "budget_exhausted": "budget spent",
    "provider_retired": "provider retired",
}


def termination_headline(termination: BatchTermination) -> str:
    """``Batch completed``, ``Batch stopped: batch deadline (30.0 s) reached``, ``Batch interrupted
    (interrupted by SIGINT)``: the kind in plain words, then the reason."""
    kind, reason = termination.kind, termination.reason
    what = _STOPPED.get(kind)
    if what is None:  # completed, interrupted, aborted: already words
        return f"Batch {kind}" + (f" ({reason})" if reason else "")
    if not reason:
        return f"Batch stopped: {what}"
    if kind == "budget_exhausted":  # its reason names the setting (max_total_tokens=...), not the budget
        return f"Batch stopped: {what} ({reason})"
    return f"Batch stopped: {reason}"


def cached_note(tokens: Mapping[str, int]) -> str:
    """The tokens line's prompt-cache part: cached input tokens and their share, when there are any."""
    cached = tokens.get("cached_input_tokens", 0)
    if cached <= 0:
        return ""
    return f"   cached {cached:,} ({_percent(cached, tokens.get('input_tokens', 0)):.1f} %)"


def cost_line(cost: float, *, built_in: bool) -> str:
    """The summary's cost line (``BatchResult.summary`` and the command line's lay it out alike)."""
    basis = f"built-in rates of {DEFAULT_MODEL_RATES_AS_OF}" if built_in else "given rates"
    return f"  cost        {dollars(cost):>10}   estimated, {basis}"


def dollars(cost: float) -> str:
    """A cost as the summaries show it: cents above $100, else four decimals (small batches keep theirs)."""
    return f"${cost:,.2f}" if cost >= 100 else f"${cost:.4f}"


def replayed_line(tokens: Mapping[str, int], cost: float | None) -> str:
    """The summary's line for replayed results (:meth:`BatchResult.summary` and the command line's
    lay it out alike): their tokens and cost, which the run that made them spent."""
    return (f"  replayed    {tokens.get('total_tokens', 0):>10,}   tokens"
            f" (in {tokens.get('input_tokens', 0):,}   out {tokens.get('output_tokens', 0):,})"
            + (f"   {dollars(cost)}" if cost is not None else "")
            + "   from the checkpoint: spent by an earlier run, not counted above")


def stopped_line(counts: Mapping[str, int]) -> str | None:
    """The summaries' line counting results by stop reason (``None`` when no result has one)."""
    if not counts:
        return None
    return "  stopped     " + ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items()))
