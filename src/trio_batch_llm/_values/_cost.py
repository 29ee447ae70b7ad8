"""What tokens cost: the rates (:class:`ModelRates`, a dated built-in table), pricing, cost functions.

Every dollar figure of the package is priced here: a batch's estimate
(:class:`CostSum`, behind ``BatchResult.estimated_cost`` and the command line's
summaries), one call's (:func:`call_cost`, behind ``AttemptTiming.cost``) and a
budget's charge (:func:`run_cost_function`, behind ``GuardrailConfig.item_cost``).
The records delegate; none prices by itself.

Cached input tokens and cache-write tokens are parts of the input tokens (every
provider's usage is mapped to that convention): ``input - cached - written`` is
priced at the input rate, ``cached`` at the cached rate and ``written`` at the
cache-write rate (the input rate when a model has none). Reasoning tokens are a
part of the output tokens, which the provider reports with them included, so
they are priced as output once. A provider's Batch API bills a fraction of these
rates (:data:`BATCH_PRICE_FACTORS`).

The arithmetic reads any object with the rate attributes (the :class:`Rates`
protocol), so a user's own rates object prices as a :class:`ModelRates` does.
"""

from __future__ import annotations

import decimal
import math
import numbers
import re
import reprlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, Protocol, final

from ._errors import ConfigurationError

__all__ = [
    "BATCH_PRICE_FACTORS",
    "DEFAULT_MODEL_RATES",
    "DEFAULT_MODEL_RATES_AS_OF",
    "RATE_SOURCES",
    "CostSum",
    "InvalidCost",
    "ModelRates",
    "Rates",
    "call_cost",
    "estimate",
    "price",
    "rates_for",
    "run_cost_function",
]

_PER_MTOK: Final = 1_000_000
_SNAPSHOT_SUFFIX: Final = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8})$")
"""A dated snapshot name (``gpt-4o-2024-08-06``, ``claude-sonnet-4-5-20250929``) is priced as its model."""
_SHORT: Final = reprlib.Repr()
_SHORT.maxlong = _SHORT.maxstring = _SHORT.maxother = 60


# --- the rates ---------------------------------------------------------------------------

class Rates(Protocol):
    """What pricing reads of a :class:`~trio_batch_llm.ModelRates`: dollars per million tokens."""

    @property
    def input_per_mtok(self) -> float: ...
    @property
    def output_per_mtok(self) -> float: ...
    @property
    def cached_input_per_mtok(self) -> float | None: ...


def _rate(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0:
        raise ConfigurationError(name, value, "must be a finite number >= 0 (dollars per million tokens)")


@final
@dataclass(frozen=True, slots=True)
class ModelRates:
    """A model's prices in dollars per million tokens; ``cached_input_per_mtok=None`` prices cached
    input tokens at the input rate, ``cache_write_per_mtok=None`` prices cache writes (Anthropic's
    ``cache_creation_input_tokens``) at the input rate."""

    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float | None = None
    cache_write_per_mtok: float | None = None

    def __post_init__(self) -> None:
        _rate("input_per_mtok", self.input_per_mtok)
        _rate("output_per_mtok", self.output_per_mtok)
        for name in ("cached_input_per_mtok", "cache_write_per_mtok"):
            if getattr(self, name) is not None:
                _rate(name, getattr(self, name))

    def cost(self, usage: Mapping[str, Any] | None) -> float | None:
        """Dollars for ``usage`` (a result's ``token_usage``); ``None`` when it has neither input nor
        output counts (unknown, which is not free). Cached input tokens and cache writes, parts of
        the input, are priced at their rates; reasoning tokens, a part of the output, as output."""
        return price(self, usage)


_RATES_AS_OF: Final = "2025-08-07"
"""When the OpenAI rows were read (``DEFAULT_MODEL_RATES_AS_OF``); the others: :data:`RATE_SOURCES`."""

_OPENAI: Final = ("2025-08-07", "https://openai.com/api/pricing/")
_CLAUDE: Final = ("2026-12-05", "https://platform.claude.com/docs/en/docs/about-claude/pricing")
_CLAUDE_NEW: Final = ("2026-12-05", "https://platform.claude.com/docs/en/about-claude/pricing")
_SONNET_5: Final = ("2026-12-05", "https://platform.claude.com/docs/en/models/sonnet-5/overview")
_GEMINI: Final = ("2026-12-05", "https://ai.google.dev/gemini-api/docs/pricing")

_BUILT_IN_RATES: Final[Mapping[str, tuple[float, float, float | None] | tuple[float, float, float | None,
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

RATE_SOURCES: Final[Mapping[str, tuple[str, str]]] = {
    **{model: _OPENAI for model in _BUILT_IN_RATES if model.startswith(("gpt-", "o1", "o3", "o4"))},
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

DEFAULT_MODEL_RATES_AS_OF: Final = _RATES_AS_OF
"""The day the built-in OpenAI rates were read off OpenAI's pricing page (the Claude and Gemini rows
were read later; each row's day and page are in the docs): verify them there before relying on a
figure, and pass your own rates for anything that has changed."""

DEFAULT_MODEL_RATES: Final[Mapping[str, ModelRates]] = MappingProxyType(
    {model: ModelRates(*figures) for model, figures in _BUILT_IN_RATES.items()}
)
"""Built-in rates (as of :data:`DEFAULT_MODEL_RATES_AS_OF`), read-only. Extend or replace them by
passing a mapping of your own: ``{**DEFAULT_MODEL_RATES, "my-model": ModelRates(0.2, 0.8)}``."""


# --- the arithmetic ----------------------------------------------------------------------

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


def estimate(
    rates: Rates | Mapping[str, Rates] | None, usages: Iterable[tuple[Mapping[str, Any] | None, object]]
) -> float | None:
    """:class:`CostSum` over ``(usage, model)`` pairs, the built-in table when ``rates`` is ``None``."""
    costs = CostSum(rates, table=DEFAULT_MODEL_RATES)
    for usage, model in usages:
        costs.add(usage, model)
    return costs.total


def call_cost(usage: Mapping[str, int], model: str | None,
              cost_function: Callable[[Any], float] | None) -> float | None:
    """One call's dollars (``AttemptTiming.cost``): ``cost_function(usage)`` when given, else ``model``'s
    built-in rates; ``None`` when unknown (no usage, a model not in the table, a failing function)."""
    if not usage:
        return None
    if cost_function is not None:
        try:
            return float(cost_function(usage))
        except Exception:  # noqa: BLE001 - an unknown cost; a budget's own charge reports the failure
            return None
    rates = rates_for(model, DEFAULT_MODEL_RATES)
    return price(rates, usage) if rates is not None else None


class InvalidCost(ValueError):
    """``cost_function`` raised, or returned something that is not a finite number >= 0."""


def run_cost_function(cost_function: Callable[[Any], object], usage: Mapping[str, Any]) -> float:
    """``cost_function(usage)`` as a float; :class:`InvalidCost` when it is not a valid cost
    (its ``__cause__`` is the exception ``cost_function`` raised, if it raised).

    A budget fails closed on it: whatever is not a finite real number >= 0 (NaN, an
    infinity, a bool, a string, an int beyond a float) is an unknown spend, never a zero."""
    try:
        value: object = cost_function(usage)
    except Exception as exc:  # the user's function failed: the cost is unknown
        raise InvalidCost(f"cost_function raised {type(exc).__name__}: {exc}") from exc
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, decimal.Decimal)):
        raise InvalidCost(f"cost_function returned {_SHORT.repr(value)}, which is not a number")
    try:
        cost = float(value)
    except (OverflowError, ValueError):  # an int beyond a float, a Decimal signalling NaN
        raise InvalidCost(f"cost_function returned {_SHORT.repr(value)}, too large for a float") from None
    if not math.isfinite(cost) or cost < 0:
        raise InvalidCost(f"cost_function returned {_SHORT.repr(value)}, not a finite number >= 0")
    return cost
