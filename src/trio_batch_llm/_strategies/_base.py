"""The strategy protocol: how one item's prompt becomes one provider call."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import anyio.lowlevel

from .._values._categories import ErrorCategory
from .._values._results import RetryState, TokenUsage
from ._batch import BatchEndpoint

__all__ = ["LLMCallStrategy"]

TOutput = TypeVar("TOutput", covariant=True)
"""Covariant: a strategy of ``str`` outputs is a strategy of ``object`` outputs."""


class LLMCallStrategy(Generic[TOutput]):
    """Subclass and override :meth:`execute`.

    The engine calls :meth:`prepare` once per owner before the first call,
    :meth:`execute` once per attempt inside the attempt's cancel scope, and
    :meth:`cleanup` once when the last owner holding the strategy closes.
    ``cleanup`` must be idempotent: a forced or failed close may run it again.
    """

    async def prepare(self) -> None:
        """Open what calls need (clients, sessions). Runs once per lease."""
        await anyio.lowlevel.checkpoint()

    async def execute(
        self, prompt: str, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[TOutput, TokenUsage | None, Any]:
        """Make one call; return ``(output, token_usage, metadata)``.

        ``timeout`` is informational (for SDK timeouts): the engine enforces
        the attempt's time with a cancel scope. Raise :class:`ProviderError`
        to say how a failure should be treated.
        """
        raise NotImplementedError

    async def on_error(self, exception: Exception, attempt: int, state: RetryState | None) -> None:
        """Called before each retry, e.g. to escalate the model or repair the prompt."""
        await anyio.lowlevel.checkpoint()

    async def cleanup(self) -> None:
        """Close what :meth:`prepare` opened. Must be idempotent."""
        await anyio.lowlevel.checkpoint()

    def configure_concurrency(self, concurrency: int) -> None:
        """A hint, given before the first :meth:`prepare` of an owner: calls that may run at once.

        Strategies holding connection pools size them from it. The default ignores it.
        """

    def quota_scope(self) -> object:
        """Strategies returning equal scopes share concurrency, RPM/TPM quotas and cooldowns."""
        return self

    def lease_identity(self) -> object:
        """Strategies with the same identity share one preparation per event loop."""
        return self

    def classify_error(self, exception: Exception) -> tuple[ErrorCategory, float | None] | None:
        """Classify ``exception`` as ``(category, retry_after)``; ``None`` defers to the default."""
        return None

    @property
    def model_name(self) -> str | None:
        """The model this strategy calls, when it has one (for artifacts and summaries)."""
        return None

    def batch_endpoint(self) -> BatchEndpoint | None:
        """The provider's Batch API for this strategy's calls, if it offers one; ``None`` by default.

        ``open_run(..., mode="provider-batch")`` needs it: the run sends its
        items through it instead of :meth:`execute`.
        """
        return None
