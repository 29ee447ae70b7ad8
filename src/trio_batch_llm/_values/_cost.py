"""Dollar cost from token usage: :class:`ModelRates` and the dated built-in table of OpenAI rates.

The arithmetic is in :mod:`._pricing` (see there why it is apart): cached input
tokens and cache writes are priced at their own rates, reasoning tokens as output.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, final

from ._errors import ConfigurationError
from ._pricing import BUILT_IN_RATES, RATES_AS_OF, price

__all__ = ["DEFAULT_MODEL_RATES", "DEFAULT_MODEL_RATES_AS_OF", "ModelRates"]


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


DEFAULT_MODEL_RATES_AS_OF: Final = RATES_AS_OF
"""The day the built-in OpenAI rates were read off OpenAI's pricing page (the Claude and Gemini rows
were read later; each row's day and page are in the docs): verify them there before relying on a
figure, and pass your own rates for anything that has changed."""

DEFAULT_MODEL_RATES: Final[Mapping[str, ModelRates]] = MappingProxyType(
    {model: ModelRates(*figures) for model, figures in BUILT_IN_RATES.items()}
)
"""Built-in rates (as of :data:`DEFAULT_MODEL_RATES_AS_OF`), read-only. Extend or replace them by
passing a mapping of your own: ``{**DEFAULT_MODEL_RATES, "my-model": ModelRates(0.2, 0.8)}``."""
