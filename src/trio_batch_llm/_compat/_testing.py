"""``FakeRateLimitError``: a simulated HTTP 429, for tests of the shared cooldown."""

from __future__ import annotations

from typing import final

from .._values._categories import ErrorCategory
from .._values._errors import ProviderError

__all__ = ["FakeRateLimitError"]


@final
class FakeRateLimitError(ProviderError):
    """Raise it from a test strategy: the engine treats it as the provider's 429."""

    def __init__(self, message: str = "429 rate limit", *, retry_after: float | None = None) -> None:
        super().__init__(message, category=ErrorCategory.RATE_LIMIT, retry_after=retry_after, status_code=429)
