"""The dialects the mock speaks, in the order the app tries their routes (a new dialect adds a line)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from ._anthropic import AnthropicDialect
from ._dialect import Dialect
from ._gemini_dialect import GeminiDialect
from ._openai import OpenAIDialect
from ._state import MockServerConfig

__all__ = ["DIALECTS"]

DIALECTS: Final[tuple[Callable[[MockServerConfig, Callable[[], float]], Dialect], ...]] = (
    OpenAIDialect,
    AnthropicDialect,
    GeminiDialect,
)
"""Each makes its dialect for one app, from the app's config and its clock."""
