"""The batch result: every item's result, how the batch ended, totals and a readable summary."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Generic, TypeVar, final

from ._export_json import export_dict, json_default
from ._headline import termination_headline
from ._models import is_pydantic_model_class
from ._pricing import BUILT_IN_FIGURES, CostSum, Rates, cost_line, dollars
from ._results import BatchTermination, WorkItemResult, add_usage, is_not_run
from ._stop_reasons import stopped_line

__all__ = ["NEW_ONLY", "BatchResult", "replayed_line"]

TOutput = TypeVar("TOutput")

_BUILT_IN: Final[Mapping[str, Rates]] = BUILT_IN_FIGURES


def _percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


def _percent(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole > 0 else 0.0


def _cached_note(tokens: Mapping[str, int]) -> str:
    """The tokens line's prompt-cache part: cached input tokens and their share, when there are any."""
    cached = tokens.get("cached_input_tokens", 0)
    if cached <= 0:
        return ""
    return f"   cached {cached:,} ({_percent(cached, tokens.get('input_tokens', 0)):.1f} %)"


NEW_ONLY: Final = " (new items only)"
"""After the items/s of a resume: replayed results are not throughput."""


def replayed_line(tokens: Mapping[str, int], cost: float | None) -> str:
    """The summary's line for replayed results (:meth:`BatchResult.summary` and the command line's
    lay it out alike): their tokens and cost, which the run that made them spent."""
    return (f"  replayed    {tokens.get('total_tokens', 0):>10,}   tokens"
            f" (in {tokens.get('input_tokens', 0):,}   out {tokens.get('output_tokens', 0):,})"
            + (f"   {dollars(cost)}" if cost is not None else "")
            + "   from the checkpoint: spent by an earlier run, not counted above")


def _cost(results: list[WorkItemResult[Any]], rates: Rates | Mapping[str, Rates] | None, *,
          made_calls: bool = True) -> float | None:
    if not made_calls:
        return 0.0
    costs = CostSum(rates, table=_BUILT_IN)
    for r in results:
        costs.add(r.token_usage, r.metadata.get("model") if isinstance(r.metadata, Mapping) else None)
    return costs.total


@final
@dataclass(slots=True)
class BatchResult(Generic[TOutput]):
    """Every item's result plus how the batch ended.

    ``BatchResult(results=[...])`` derives the counts from ``results`` (as async-batch-llm
    does); counts given explicitly must agree with them.
    """

    results: list[WorkItemResult[TOutput]]
    total_items: int = -1
    succeeded: int = -1
    failed: int = -1
    termination: BatchTermination = field(default_factory=BatchTermination)
    wall_time: float = 0.0
    input_order: list[str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        succeeded = sum(1 for r in self.results if r.success)
        derived = {"total_items": len(self.results), "succeeded": succeeded,
                   "failed": len(self.results) - succeeded}
        for name, value in derived.items():
            given = getattr(self, name)
            if given == -1:
                setattr(self, name, value)
            elif given != value:
                raise ValueError(f"{name}={given!r}: the results say {value}")

    @classmethod
    def from_results(
        cls,
        results: list[WorkItemResult[TOutput]],
        *,
        termination: BatchTermination | None = None,
        wall_time: float = 0.0,
        input_order: list[str] | None = None,
    ) -> BatchResult[TOutput]:
        succeeded = sum(1 for r in results if r.success)
        return cls(
            results=results,
            total_items=len(results),
            succeeded=succeeded,
            failed=len(results) - succeeded,
            termination=termination or BatchTermination(),
            wall_time=wall_time,
            input_order=input_order,
        )

    def __iter__(self) -> Iterator[WorkItemResult[TOutput]]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def successes(self) -> list[WorkItemResult[TOutput]]:
        return [r for r in self.results if r.success]

    def failures(self) -> list[WorkItemResult[TOutput]]:
        return [r for r in self.results if not r.success]

    def by_id(self) -> dict[str, WorkItemResult[TOutput]]:
        return {r.item_id: r for r in self.results}

    def outputs(self) -> list[TOutput | None]:
        """Outputs of the successful items, in result order."""
        return [r.output for r in self.results if r.success]

    def in_input_order(self) -> list[WorkItemResult[TOutput]]:
        """Results in the order the items were given (completion order if unknown)."""
        if self.input_order is None:
            return list(self.results)
        by_id = self.by_id()
        return [by_id[item_id] for item_id in self.input_order if item_id in by_id]

    def total_tokens(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for r in self.results:
            add_usage(total, r.token_usage)
        return total

    # --- token totals and cache figures (async-batch-llm's names; every result counts, as in
    # total_tokens(): replayed ones and failed attempts included) ---------------------------------

    @property
    def total_input_tokens(self) -> int:
        """Input tokens of every result (prompt-cache reads included: they are part of the input)."""
        return sum(r.token_usage.get("input_tokens", 0) for r in self.results)

    @property
    def total_output_tokens(self) -> int:
        return sum(r.token_usage.get("output_tokens", 0) for r in self.results)

    @property
    def total_cached_tokens(self) -> int:
        """Input tokens read from the provider's prompt cache (``cached_input_tokens``), of every result."""
        return sum(r.token_usage.get("cached_input_tokens", 0) for r in self.results)

    @property
    def prompt_cache_hit_rate(self) -> float:
        """Percent (0-100) of the input tokens the provider read from its prompt cache; 0.0 with no input."""
        return _percent(self.total_cached_tokens, self.total_input_tokens)

    @property
    def cache_hit_rate(self) -> float:
        """async-batch-llm's name of :attr:`prompt_cache_hit_rate` (a percent of input tokens, a property).

        The response cache's rate is :attr:`response_cache_hit_rate`."""
        return self.prompt_cache_hit_rate

    @property
    def cache_hits(self) -> int:
        """Results answered from the response cache (``cached``): no provider call, no cost."""
        return sum(1 for r in self.results if r.cached)

    @property
    def cache_misses(self) -> int:
        """Results looked up in the response cache and not found there (a ``cache_key``, not ``cached``)."""
        return sum(1 for r in self.results if r.cache_key is not None and not r.cached)

    @property
    def response_cache_hit_rate(self) -> float:
        """Percent (0-100) of response-cache lookups that hit: hits / (hits + misses); 0.0 with none."""
        hits = self.cache_hits
        return _percent(hits, hits + self.cache_misses)

    def cache_savings(self, rates: Rates | Mapping[str, Rates] | None = None) -> float | None:
        """Dollars the response cache saved: the cached results' original usage (``saved_usage``),
        priced as :meth:`estimated_cost` prices ``token_usage`` (``rates`` alike). ``None`` when no
        cached result has token counts, or one that has them cannot be priced."""
        costs = CostSum(rates, table=_BUILT_IN)
        for r in self.results:
            if r.cached:
                costs.add(r.saved_usage, r.metadata.get("model") if isinstance(r.metadata, Mapping) else None)
        return costs.total

    def estimated_cost(self, rates: Rates | Mapping[str, Rates] | None = None) -> float | None:
        """Estimated dollars for the tokens of every result (replayed ones and failed attempts included,
        as in :meth:`total_tokens`).

        ``rates``: ``None`` prices each result by its model (``metadata["model"]``) in the built-in
        :data:`DEFAULT_MODEL_RATES`; a mapping model → :class:`ModelRates` does the same in that
        table (a dated snapshot such as ``gpt-4o-2024-08-06`` falls back to ``gpt-4o``); one
        :class:`ModelRates` prices every result. ``None`` is returned when no result has token
        counts, or when one that has them cannot be priced (no model, or a model not in the table):
        a partial sum would understate the cost.
        """
        costs = CostSum(rates, table=_BUILT_IN)
        for r in self.results:
            costs.add(r.token_usage, r.metadata.get("model") if isinstance(r.metadata, Mapping) else None)
        return costs.total

    # --- this run's own results apart from the replayed ones (a resume): adding up runs counts
    # each call once only when it adds up the new figures ------------------------------------------

    @property
    def replayed(self) -> int:
        """Results answered from the checkpoint (``resume=``): an earlier run made their calls."""
        return sum(1 for r in self.results if r.replayed)

    @property
    def not_run(self) -> int:
        """Items a stop kept from ever starting (``not_executed``, or ``budget`` once a budget was
        spent); :attr:`failed` counts them too."""
        return sum(1 for r in self.results if is_not_run(r))

    @property
    def new_items(self) -> int:
        """Items this run ran itself: neither replayed nor not run, so that
        ``replayed + new_items + not_run == total_items``."""
        return sum(1 for r in self.results if not r.replayed and not is_not_run(r))

    def new_tokens(self) -> dict[str, int]:
        """:meth:`total_tokens` of this run's own results (replayed ones left out): what its calls used."""
        total: dict[str, int] = {}
        for r in self.results:
            if not r.replayed:
                add_usage(total, r.token_usage)
        return total

    def replayed_tokens(self) -> dict[str, int]:
        """:meth:`total_tokens` of the replayed results: used by the earlier run that made them."""
        total: dict[str, int] = {}
        for r in self.results:
            if r.replayed:
                add_usage(total, r.token_usage)
        return total

    def new_cost(self, rates: Rates | Mapping[str, Rates] | None = None) -> float | None:
        """:meth:`estimated_cost` of this run's own results: what its calls cost. ``0.0`` when it made
        no call (everything replayed or not run); ``None`` as :meth:`estimated_cost` says otherwise."""
        return _cost([r for r in self.results if not r.replayed], rates, made_calls=self.new_items > 0)

    def replayed_cost(self, rates: Rates | Mapping[str, Rates] | None = None) -> float | None:
        """:meth:`estimated_cost` of the replayed results: spent by the earlier run that made them,
        not by this one. ``None`` as :meth:`estimated_cost` says (nothing replayed: ``None``)."""
        return _cost([r for r in self.results if r.replayed], rates)

    def summary(self, *, rates: Rates | Mapping[str, Rates] | None = None) -> str:
        """A readable table: items, retries, tokens, cost when known, wall time, latency percentiles.

        The cost line shows :meth:`estimated_cost` of ``rates`` (default: the built-in table), and
        only when every result with tokens could be priced.

        Items that a stop kept from ever starting (``not_executed``, or
        ``budget`` once a budget was spent) are counted as *not run*, apart
        from the items that ran and failed; ``failed`` counts both. The
        ``stopped`` line counts the results that did not run to their own end
        by :class:`StopReason`.

        After a resume the figures are this run's own: ``new`` items, the tokens and cost of its
        calls, items/s over new items only; a ``replayed`` line shows the replayed results' tokens
        and cost apart (spent by the run that made them), so adding up runs counts no call twice.
        """
        executed = [r for r in self.results if not r.replayed]
        retries = sum(max(0, r.attempts - 1) for r in executed)
        tokens = self.new_tokens()
        replayed = len(self.results) - len(executed)
        not_run = sum(1 for r in self.results if is_not_run(r))
        ran = [r for r in executed if not is_not_run(r)]
        rate = len(ran) / self.wall_time if self.wall_time > 0 else 0.0
        lines = [
            termination_headline(self.termination),
            f"  items       {self.total_items:>10,}   succeeded {self.succeeded:,}"
            f"   failed {self.failed - not_run:,}" + (f"   not run {not_run:,}" if not_run else "")
            + f"   replayed {replayed:,}" + (f"   new {len(ran):,}" if replayed else ""),
            f"  retries     {retries:>10,}",
            f"  tokens      {tokens.get('total_tokens', 0):>10,}   in {tokens.get('input_tokens', 0):,}"
            f"   out {tokens.get('output_tokens', 0):,}" + _cached_note(tokens),
        ]
        cost = self.new_cost(rates)
        if cost is not None:
            lines.append(cost_line(cost, built_in=rates is None))
        if any(r.cache_key is not None for r in self.results):  # a response cache was used
            hits, misses = self.cache_hits, self.cache_misses
            saved = self.cache_savings(rates)
            hit_rate = _percent(hits, hits + misses)
            lines.append(f"  cache hits  {hits:>10,}   misses {misses:,}   rate {hit_rate:.1f} %"
                         + (f"   saved {dollars(saved)}" if saved is not None else ""))
        if replayed:
            lines.append(replayed_line(self.replayed_tokens(), self.replayed_cost(rates)))
        lines += [
            f"  wall time   {self.wall_time:>10.3f} s   {rate:,.0f} items/s" + NEW_ONLY * bool(replayed),
        ]
        categories: dict[str, int] = {}
        for r in self.results:
            if not r.success and r.error_category is not None and not is_not_run(r):
                categories[r.error_category.value] = categories.get(r.error_category.value, 0) + 1
        if categories:
            detail = ", ".join(f"{k} {v:,}" for k, v in sorted(categories.items()))
            lines.append(f"  failures    {detail}")
        if line := stopped_line(Counter(r.stop_reason.value for r in self.results if r.stop_reason)):
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

    def to_json(self) -> str:
        """Strict JSON (no ``NaN``/``Infinity``); ValueError naming the item if an output holds one."""
        return json.dumps(
            {
                "termination": self.termination.to_dict(),
                "wall_time": self.wall_time,
                "input_order": self.input_order,
                "results": [export_dict(r) for r in self.results],
            },
            default=json_default,
            allow_nan=False,
        )

    @classmethod
    def from_json(
        cls, text: str, *, response_model: type | Mapping[str, Any] | None = None
    ) -> BatchResult[Any]:
        """The batch :meth:`to_json` wrote; with ``response_model`` (the pydantic class the strategy
        had) successful outputs come back as model instances, as a resume gives them."""
        data = json.loads(text)
        term = data.get("termination") or {}
        results = [WorkItemResult.from_dict(r) for r in data.get("results", [])]
        if response_model is not None and is_pydantic_model_class(response_model):
            validate = response_model.model_validate  # type: ignore[union-attr]  # a model class, checked
            for result in results:
                if result.success and result.output is not None:
                    result.output = validate(result.output)
        return BatchResult.from_results(
            results,
            termination=BatchTermination.from_dict(term),
            wall_time=float(data.get("wall_time", 0.0)),
            input_order=data.get("input_order"),
        )

    def to_jsonl(self, path: str | Path) -> None:
        """Write one strict JSON record per result to ``path`` (blocking: call it off the event loop).

        Every line is encoded before the file is opened, so an output that
        strict JSON cannot hold (ValueError naming the item) leaves no file behind.
        """
        lines = [json.dumps(export_dict(r), default=json_default, allow_nan=False) + "\n"
                 for r in self.results]
        with Path(path).open("w", encoding="utf-8") as f:
            f.writelines(lines)
