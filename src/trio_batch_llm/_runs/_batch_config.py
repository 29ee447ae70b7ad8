"""``ProviderBatchConfig``: how a ``mode="provider-batch"`` run uses the provider's Batch API."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, final

from .._values._errors import ConfigurationError

__all__ = ["ProviderBatchConfig", "estimate_input_tokens"]

OPENAI_MAX_REQUESTS: Final = 50_000
OPENAI_MAX_FILE_BYTES: Final = 200 * 1024 * 1024
COMPLETION_WINDOWS: Final = frozenset({"24h"})


def estimate_input_tokens(text: str) -> int:
    """The default enqueued-token estimate of a request: about four characters a token, at least one.

    Providers count a batch's *input* tokens against the enqueued limit. Pass
    ``ProviderBatchConfig(token_estimator=...)`` (for example a tiktoken count)
    for text where four characters a token is optimistic (code, CJK).
    """
    return max(1, (len(text) + 3) // 4)


def _whole(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(name, value, f"must be a whole number >= {minimum}")


def _seconds(name: str, value: object) -> None:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
            or value == math.inf):
        raise ConfigurationError(name, value, "must be a positive number of seconds")


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderBatchConfig:
    """Settings of provider Batch API mode (OpenAI's, Anthropic's or Gemini's batches).

    Requests are chunked into files of at most ``max_requests_per_batch``
    lines and ``max_file_bytes`` bytes (OpenAI's limits are the defaults; a
    provider that takes less, such as Gemini's inline requests, caps it lower).
    ``enqueued_token_limit`` is the provider's limit on input tokens waiting
    in unfinished batches, for one model and key: every run on the same store
    reserves its batches' estimated tokens against it atomically, so concurrent
    runs (in any process) never exceed it together. ``None`` checks nothing
    (the provider then refuses an over-limit batch, and the run retries it
    later). ``capacity_scope`` names the shared limit (default: endpoint, key
    fingerprint and model).

    ``poll_interval`` is the time between looks at each open batch (always
    capped by ``run.wait(timeout=...)``'s deadline); ``request_timeout``
    bounds every Batch API request (a *create* that gets no answer in time
    has an unknown outcome; see ``Run.resolve_submission``). At most
    ``max_open_batches`` of a run's batches are open at once. Failed items are
    retried in later batches with the run config's ``RetryConfig`` backoff and
    ``max_attempts`` budget.
    """

    max_requests_per_batch: int = OPENAI_MAX_REQUESTS
    max_file_bytes: int = OPENAI_MAX_FILE_BYTES
    completion_window: str = "24h"
    enqueued_token_limit: int | None = None
    capacity_scope: str | None = None
    token_estimator: Callable[[str], int] | None = None
    """Input tokens of one request's text (system prompt and prompt), called from a worker thread;
    default: four characters a token."""
    poll_interval: float = 30.0
    request_timeout: float = 120.0
    max_open_batches: int = 16

    def __post_init__(self) -> None:
        _whole("max_requests_per_batch", self.max_requests_per_batch, 1)
        if self.max_requests_per_batch > OPENAI_MAX_REQUESTS:
            raise ConfigurationError("max_requests_per_batch", self.max_requests_per_batch,
                                     f"must be at most {OPENAI_MAX_REQUESTS} (the Batch API's limit)")
        _whole("max_file_bytes", self.max_file_bytes, 1024)
        if self.completion_window not in COMPLETION_WINDOWS:
            raise ConfigurationError("completion_window", self.completion_window,
                                     f"must be one of {sorted(COMPLETION_WINDOWS)}")
        if self.enqueued_token_limit is not None:
            _whole("enqueued_token_limit", self.enqueued_token_limit, 1)
        if self.capacity_scope is not None and (not isinstance(self.capacity_scope, str)
                                                or not self.capacity_scope):
            raise ConfigurationError("capacity_scope", self.capacity_scope,
                                     "must be a non-empty string or None")
        if self.token_estimator is not None and not callable(self.token_estimator):
            raise ConfigurationError("token_estimator", self.token_estimator, "must be callable")
        _seconds("poll_interval", self.poll_interval)
        _seconds("request_timeout", self.request_timeout)
        _whole("max_open_batches", self.max_open_batches, 1)
