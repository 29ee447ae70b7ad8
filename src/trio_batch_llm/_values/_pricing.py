"""Pricing arithmetic and the built-in rate figures, with no import from the package.

:mod:`._results` prices a batch through this module. It cannot import
:class:`~._cost.ModelRates`: that validates with ``ConfigurationError``, and
``_errors`` refers back to ``_results``. So the arithmetic works on any object
with the three rate attributes (:class:`Rates`), and the built-in figures are
kept here as plain numbers; ``_cost`` builds the public table from them.

Cached input tokens are a part of the input tokens: ``input - cached`` is priced
at the input rate and ``cached`` at the cached rate (the input rate when a model
has none). Reasoning tokens are a part of the output tokens, which the provider
reports with them included, so they are priced as output once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, Protocol, final

__all__ = [
    "BUILT_IN_RATES",
    "RATES_AS_OF",
    "CostSum",
    "Rates",
    "cost_line",
    "price",
    "rates_for",
]

_PER_MTOK: Final = 1_000_000
_SNAPSHOT_SUFFIX: Final = re.compile(r"-\d{4}-\d{2}-\d{2}$")
"""A dated snapshot name (``gpt-4o-2024-08-06``) is priced as its model (``gpt-4o``)."""


class Rates(Protocol):
    """What pricing reads of a :class:`~trio_batch_llm.ModelRates`: dollars per million tokens."""

    @property
    def input_per_mtok(self) -> float: ...
    @property
    def output_per_mtok(self) -> float: ...
    @property
    def cached_input_per_mtok(self) -> float | None: ...


RATES_AS_OF: Final = "2025-08-07"

BUILT_IN_RATES: Final[Mapping[str, tuple[float, float, float | None]]] = {
    # OpenAI standard tier, dollars per million tokens: input, output, cached input.
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
}


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
    cached_rate = rates.cached_input_per_mtok
    if cached_rate is None:
        cached_rate = rates.input_per_mtok
    dollars = (
        (input_tokens - cached) * rates.input_per_mtok
        + cached * cached_rate
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
    shown = f"${cost:,.2f}" if cost >= 100 else f"${cost:.4f}"  # small test batches keep their cents
    return f"  cost        {shown:>10}   estimated, {basis}"


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
