"""Dollar cost from token usage: :class:`ModelRates` and the dated built-in table of OpenAI rates.

Cached input tokens are a part of the input tokens: ``input - cached`` is priced
at the input rate and ``cached`` at the cached rate (the input rate when a
model has none). Reasoning tokens are a part of the output tokens, which the
provider reports with them included, so they are priced as output once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, final

from ._errors import ConfigurationError

__all__ = [
    "DEFAULT_MODEL_RATES", "DEFAULT_MODEL_RATES_AS_OF", "CostSum", "ModelRates", "cost_line", "rates_for",
]

_PER_MTOK: Final = 1_000_000
_SNAPSHOT_SUFFIX: Final = re.compile(r"-\d{4}-\d{2}-\d{2}$")
"""A dated snapshot name (``gpt-4o-2024-08-06``) is priced as its model (``gpt-4o``)."""


def _rate(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0:
        raise ConfigurationError(name, value, "must be a finite number >= 0 (dollars per million tokens)")


@final
@dataclass(frozen=True, slots=True)
class ModelRates:
    """A model's prices in dollars per million tokens; ``cached_input_per_mtok=None`` prices cached
    input tokens at the input rate."""

    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float | None = None

    def __post_init__(self) -> None:
        _rate("input_per_mtok", self.input_per_mtok)
        _rate("output_per_mtok", self.output_per_mtok)
        if self.cached_input_per_mtok is not None:
            _rate("cached_input_per_mtok", self.cached_input_per_mtok)

    def cost(self, usage: Mapping[str, Any] | None) -> float | None:
        """Dollars for ``usage`` (a result's ``token_usage``); ``None`` when it has neither input nor
        output counts (unknown, which is not free)."""
        if not usage:
            return None
        input_tokens, output_tokens = usage.get("input_tokens"), usage.get("output_tokens")
        if input_tokens is None and output_tokens is None:
            return None
        input_tokens, output_tokens = int(input_tokens or 0), int(output_tokens or 0)
        cached = min(max(int(usage.get("cached_input_tokens") or 0), 0), input_tokens)
        cached_rate = self.cached_input_per_mtok
        if cached_rate is None:
            cached_rate = self.input_per_mtok
        dollars = (
            (input_tokens - cached) * self.input_per_mtok
            + cached * cached_rate
            + output_tokens * self.output_per_mtok
        )
        return dollars / _PER_MTOK


DEFAULT_MODEL_RATES_AS_OF: Final = "2025-08-07"
"""The day the built-in rates were read off OpenAI's pricing page: verify them there before relying
on a figure, and pass your own rates for anything that has changed."""

DEFAULT_MODEL_RATES: Final[Mapping[str, ModelRates]] = MappingProxyType({
    # OpenAI standard tier, dollars per million tokens: input, output, cached input.
    "gpt-4o": ModelRates(2.50, 10.00, 1.25),
    "gpt-4o-mini": ModelRates(0.15, 0.60, 0.075),
    "gpt-4.1": ModelRates(2.00, 8.00, 0.50),
    "gpt-4.1-mini": ModelRates(0.40, 1.60, 0.10),
    "gpt-4.1-nano": ModelRates(0.10, 0.40, 0.025),
    "o1": ModelRates(15.00, 60.00, 7.50),
    "o1-mini": ModelRates(1.10, 4.40, 0.55),
    "o3": ModelRates(2.00, 8.00, 0.50),
    "o3-mini": ModelRates(1.10, 4.40, 0.55),
    "o4-mini": ModelRates(1.10, 4.40, 0.275),
    "gpt-5": ModelRates(1.25, 10.00, 0.125),
    "gpt-5-mini": ModelRates(0.25, 2.00, 0.025),
    "gpt-5-nano": ModelRates(0.05, 0.40, 0.005),
})
"""Built-in rates (as of :data:`DEFAULT_MODEL_RATES_AS_OF`), read-only. Extend or replace them by
passing a mapping of your own: ``{**DEFAULT_MODEL_RATES, "my-model": ModelRates(0.2, 0.8)}``."""


def rates_for(model: object, table: Mapping[str, ModelRates]) -> ModelRates | None:
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
    basis = f"built-in rates of {DEFAULT_MODEL_RATES_AS_OF}" if built_in else "given rates"
    shown = f"${cost:,.2f}" if cost >= 100 else f"${cost:.4f}"  # small test batches keep their cents
    return f"  cost        {shown:>10}   estimated, {basis}"


@final
class CostSum:
    """A running estimate over results added one at a time: ``None`` once a result with token counts
    cannot be priced, as :meth:`BatchResult.estimated_cost` decides.

    ``default_model`` prices results that do not name their model (the command line knows its one).
    """

    __slots__ = ("_default_model", "_priced", "_table", "_total", "_unknown")

    def __init__(self, rates: ModelRates | Mapping[str, ModelRates] | None = None, *,
                 default_model: str | None = None) -> None:
        if rates is not None and not isinstance(rates, (ModelRates, Mapping)):
            raise TypeError(f"rates={rates!r}: must be a ModelRates or a mapping of model name to ModelRates")
        self._table = DEFAULT_MODEL_RATES if rates is None else rates
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
        if isinstance(table, ModelRates):
            found: ModelRates | None = table
        else:
            found = rates_for(model if model is not None else self._default_model, table)
        cost = found.cost(usage) if found is not None else None
        if cost is None:
            self._unknown = True
            return
        self._total += cost
        self._priced = True

    @property
    def total(self) -> float | None:
        return self._total if self._priced and not self._unknown else None
