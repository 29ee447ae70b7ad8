"""Pricing arithmetic and the built-in rate figures, with no import from the package.

:mod:`._results` prices a batch through this module. It cannot import
:class:`~._cost.ModelRates`: that validates with ``ConfigurationError``, and
``_errors`` refers back to ``_results``. So the arithmetic works on any object
with the three rate attributes (:class:`Rates`), and the built-in figures are
kept here as plain numbers; ``_cost`` builds the public table from them.

Cached input tokens and cache-write tokens are parts of the input tokens (every
provider's usage is mapped to that convention): ``input - cached - written`` is
priced at the input rate, ``cached`` at the cached rate and ``written`` at the
cache-write rate (the input rate when a model has none). Reasoning tokens are a
part of the output tokens, which the provider reports with them included, so
they are priced as output once. A provider's Batch API bills a fraction of these
rates (:data:`BATCH_PRICE_FACTORS`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol, final

__all__ = [
    "BATCH_PRICE_FACTORS",
    "BUILT_IN_FIGURES",
    "BUILT_IN_RATES",
    "RATE_SOURCES",
    "RATES_AS_OF",
    "CostSum",
    "Rates",
    "cost_line",
    "dollars",
    "price",
    "rates_for",
]

_PER_MTOK: Final = 1_000_000
_SNAPSHOT_SUFFIX: Final = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8})$")
"""A dated snapshot name (``gpt-4o-2024-08-06``, ``claude-sonnet-4-5-20250929``) is priced as its model."""


class Rates(Protocol):
    """What pricing reads of a :class:`~trio_batch_llm.ModelRates`: dollars per million tokens."""

    @property
    def input_per_mtok(self) -> float: ...
    @property
    def output_per_mtok(self) -> float: ...
    @property
    def cached_input_per_mtok(self) -> float | None: ...


RATES_AS_OF: Final = "2025-08-07"
"""When the OpenAI rows were read (``DEFAULT_MODEL_RATES_AS_OF``); the others: :data:`RATE_SOURCES`."""

_OPENAI: Final = ("2025-08-07", "https://openai.com/api/pricing/")
_CLAUDE: Final = ("2026-12-05", "https://platform.claude.com/docs/en/docs/about-claude/pricing")
_CLAUDE_NEW: Final = ("2026-12-05", "https://platform.claude.com/docs/en/about-claude/pricing")
_SONNET_5: Final = ("2026-12-05", "https://platform.claude.com/docs/en/models/sonnet-5/overview")
_GEMINI: Final = ("2026-12-05", "https://ai.google.dev/gemini-api/docs/pricing")

BUILT_IN_RATES: Final[Mapping[str, tuple[float, float, float | None] | tuple[float, float, float | None,
                                                                             float | None]]] = {
    # Dollars per million tokens: input, output, cached input[, cache write].
    # OpenAI standard tier.
    "gpt-4o": (2.50, 10.00, 1.25),
    "gpt-4o-mini": (0.15, 0.60, 0.075),
    "gpt-4.1": (2.00, 8.00, 0.50),
    "gpt-4.1-mini": (0.40, 1.60, 0.10),
    "gpt-4.1-nano": (0.10, 0.40, 0.025),
    "o1": (15.00, 60.00, 7.50),
    "o1-mini": (1.10, 4.40, 0.55),
    "o3": (2.00, 8.00, 0.50),
    "o3-mini": (1.10, 4.40, 0.55),
    "o4-mini": (1.10, 4.40, 0.275),
    "gpt-5": (1.25, 10.00, 0.125),
    "gpt-5-mini": (0.25, 2.00, 0.025),
    "gpt-5-nano": (0.05, 0.40, 0.005),
    # Anthropic: base input, output, cache hits, 5-minute cache writes (1-hour writes cost twice the
    # input rate: pass your own ModelRates if you write 1-hour caches).
    "claude-opus-5": (5.00, 25.00, 0.50, 6.25),
    "claude-opus-4-8": (5.00, 25.00, 0.50, 6.25),
    "claude-opus-4-7": (5.00, 25.00, 0.50, 6.25),
    "claude-opus-4-6": (5.00, 25.00, 0.50, 6.25),
    "claude-opus-4-5": (5.00, 25.00, 0.50, 6.25),
    "claude-opus-4-1": (15.00, 75.00, 1.50, 18.75),
    "claude-opus-4-0": (15.00, 75.00, 1.50, 18.75),
    "claude-opus-4": (15.00, 75.00, 1.50, 18.75),  # claude-opus-4-20250514 without its date
    "claude-sonnet-5": (2.00, 10.00, 0.20, 2.50),
    "claude-sonnet-4-6": (3.00, 15.00, 0.30, 3.75),
    "claude-sonnet-4-5": (3.00, 15.00, 0.30, 3.75),
    "claude-sonnet-4-0": (3.00, 15.00, 0.30, 3.75),
    "claude-sonnet-4": (3.00, 15.00, 0.30, 3.75),  # claude-sonnet-4-20250514 without its date
    "claude-haiku-4-5": (1.00, 5.00, 0.10, 1.25),
    # Gemini paid tier, prompts up to 200k tokens (longer prompts cost more: not modelled). The
    # context-caching price was not confirmed, so cached input is priced as input (an upper bound).
    "gemini-2.5-pro": (1.25, 10.00, None),
    "gemini-2.5-flash": (0.30, 2.50, None),
    "gemini-2.5-flash-lite": (0.10, 0.40, None),
}



@final
@dataclass(frozen=True, slots=True)
class _Figures:
    """A built-in rate as plain numbers, as ``DEFAULT_MODEL_RATES`` holds it (for ``_results``, which
    cannot reach ``ModelRates``)."""

    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float | None = None
    cache_write_per_mtok: float | None = None


BUILT_IN_FIGURES: Final[Mapping[str, Rates]] = {model: _Figures(*f) for model, f in BUILT_IN_RATES.items()}

RATE_SOURCES: Final[Mapping[str, tuple[str, str]]] = {
    **{model: _OPENAI for model in BUILT_IN_RATES if model.startswith(("gpt-", "o1", "o3", "o4"))},
    **{model: _CLAUDE for model in ("claude-opus-4-6", "claude-opus-4-5", "claude-opus-4-1",
                                    "claude-opus-4-0", "claude-opus-4", "claude-sonnet-4-6",
                                    "claude-sonnet-4-5", "claude-sonnet-4-0", "claude-sonnet-4",
                                    "claude-haiku-4-5")},
    **{model: _CLAUDE_NEW for model in ("claude-opus-5", "claude-opus-4-8", "claude-opus-4-7")},
    "claude-sonnet-5": _SONNET_5,
    **{model: _GEMINI for model in ("gemini-2.5-pro", "gemini-2.5-flash", "gemini-2.5-flash-lite")},
}
"""Each built-in row's ``(day read, page)``: check the page before relying on a figure."""

BATCH_PRICE_FACTORS: Final[Mapping[str, float]] = {
    "openai": 0.5,  # Batch API: 50 % off input and output
    "anthropic": 0.5,  # Message Batches: 50 % off input and output
    "gemini": 0.5,  # Batch mode: 50 % of the interactive price
}
"""The fraction of the standard rates a provider's Batch API bills, by ``provider_name``; a provider
not listed has no known discount, and a provider-batch run of it shows no cost."""


def price(rates: Rates, usage: Mapping[str, Any] | None) -> float | None:
    """Dollars for ``usage`` at ``rates``; ``None`` when it has neither input nor output counts
    (unknown, which is not free)."""
    if not usage:
        return None
    input_tokens, output_tokens = usage.get("input_tokens"), usage.get("output_tokens")
    if input_tokens is None and output_tokens is None:
        return None
    input_tokens, output_tokens = int(input_tokens or 0), int(output_tokens or 0)
    cached = min(max(int(usage.get("cached_input_tokens") or 0), 0), input_tokens)
    written = min(max(int(usage.get("cache_write_input_tokens") or 0), 0), input_tokens - cached)
    cached_rate = rates.cached_input_per_mtok
    if cached_rate is None:
        cached_rate = rates.input_per_mtok
    # Duck-typed rates objects from before cache writes were priced have no such attribute.
    write_rate = getattr(rates, "cache_write_per_mtok", None)
    if write_rate is None:
        write_rate = rates.input_per_mtok
    dollars = (
        (input_tokens - cached - written) * rates.input_per_mtok
        + cached * cached_rate
        + written * write_rate
        + output_tokens * rates.output_per_mtok
    )
    return dollars / _PER_MTOK


def rates_for(model: object, table: Mapping[str, Rates]) -> Rates | None:
    """``model``'s rates in ``table``: by its name, else by the name without a snapshot date."""
    if not isinstance(model, str) or not model:
        return None
    found = table.get(model)
    if found is None:
        base = _SNAPSHOT_SUFFIX.sub("", model)
        found = table.get(base) if base != model else None
    return found


def cost_line(cost: float, *, built_in: bool) -> str:
    """The summary's cost line (``BatchResult.summary`` and the command line's lay it out alike)."""
    basis = f"built-in rates of {RATES_AS_OF}" if built_in else "given rates"
    return f"  cost        {dollars(cost):>10}   estimated, {basis}"


def dollars(cost: float) -> str:
    """A cost as the summaries show it: cents above $100, else four decimals (small batches keep theirs)."""
    return f"${cost:,.2f}" if cost >= 100 else f"${cost:.4f}"


_RATE_FIELDS: Final = ("input_per_mtok", "output_per_mtok", "cached_input_per_mtok")


def _is_rates(value: object) -> bool:
    return all(hasattr(value, name) for name in _RATE_FIELDS)


@final
class CostSum:
    """A running estimate over results added one at a time: ``None`` once a result with token counts
    cannot be priced, as :meth:`BatchResult.estimated_cost` decides.

    ``table`` is the default table when ``rates`` is ``None``; ``default_model`` prices results that do
    not name their model (the command line knows its one).
    """

    __slots__ = ("_default_model", "_priced", "_table", "_total", "_unknown")

    def __init__(
        self,
        rates: Rates | Mapping[str, Rates] | None,
        *,
        table: Mapping[str, Rates],
        default_model: str | None = None,
    ) -> None:
        if rates is not None and not isinstance(rates, Mapping) and not _is_rates(rates):
            raise TypeError(f"rates={rates!r}: must be a ModelRates or a mapping of model name to ModelRates")
        self._table: Rates | Mapping[str, Rates] = table if rates is None else rates
        self._default_model = default_model
        self._total = 0.0
        self._priced = False
        self._unknown = False

    def add(self, usage: Mapping[str, Any] | None, model: object) -> None:
        if self._unknown or not usage:
            return
        if usage.get("input_tokens") is None and usage.get("output_tokens") is None:
            return
        table = self._table
        if isinstance(table, Mapping):
            found = rates_for(model if model is not None else self._default_model, table)
        else:
            found = table
        cost = price(found, usage) if found is not None else None
        if cost is None:
            self._unknown = True
            return
        self._total += cost
        self._priced = True

    @property
    def total(self) -> float | None:
        return self._total if self._priced and not self._unknown else None
