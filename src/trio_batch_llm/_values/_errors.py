"""The exception tree of trio-batch-llm.

Every exception this library defines derives from :class:`BatchLLMError`, so
``except BatchLLMError`` catches all of them. Each also keeps a fitting
built-in base, so code that catches ``RuntimeError``, ``TimeoutError`` or
``ValueError`` keeps working::

    Exception
    └── BatchLLMError                      (alias: AsyncBatchLLMError)
        ├── ConfigurationError             (also ValueError)
        ├── ProviderError                  a strategy's own word on a failure
        ├── LLMCallError                   (also RuntimeError) call()/submit() failed [1]
        ├── ItemDeadlineExceeded           (also TimeoutError) item total deadline
        ├── QueueFullError                 (also RuntimeError) pool past max_pending
        ├── AdmissionClosedError           (also RuntimeError) owner no longer admits
        ├── QuotaBackendError              (also RuntimeError) shared quota store unreachable
        ├── BatchInterruptedError          (also RuntimeError) workers cancelled early
        ├── CleanupInterruptedError        (also RuntimeError) a close was interrupted
        ├── StreamFinalizationError        (also RuntimeError) stream finalizer cancelled
        ├── ArtifactStoreError             (also RuntimeError) checkpoint I/O failed
        │   ├── ArtifactMismatchError      stored identity or records do not match
        │   ├── ArtifactEncodeError        one result cannot be stored faithfully
        │   └── DatabaseUnavailableError   a run's database unreachable (past its bound)
        ├── RunStateError                  (also RuntimeError) a durable run's status forbids it
        └── RunSourceError                 (also ValueError) a run's source cannot continue it

[1] Defined in :mod:`._results`, beside the :class:`WorkItemResult` it carries:
this module is the ground of ``_values`` (every record raises from it), so it
refers to no record; the one error that holds a record sits above records.

Provider SDK exceptions and exceptions raised by user strategies are never
wrapped: they reach the caller (or ``WorkItemResult.exception``) as themselves.
Cancellation, ``KeyboardInterrupt`` and ``SystemExit`` are never converted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._categories import ErrorCategory
from ._usage import check_token_usage

__all__ = [
    "AdmissionClosedError",
    "ArtifactEncodeError",
    "ArtifactMismatchError",
    "ArtifactStoreError",
    "AsyncBatchLLMError",
    "AttemptTimedOut",
    "BatchInterruptedError",
    "BatchLLMError",
    "CleanupInterruptedError",
    "ConfigurationError",
    "DatabaseUnavailableError",
    "ItemDeadlineExceeded",
    "ProviderError",
    "QueueFullError",
    "QuotaBackendError",
    "RunSourceError",
    "RunStateError",
    "StreamFinalizationError",
]


class BatchLLMError(Exception):
    """Base of every exception trio-batch-llm defines."""


AsyncBatchLLMError = BatchLLMError
"""Alias kept for code moving over from async-batch-llm."""


class ConfigurationError(BatchLLMError, ValueError):
    """A configuration value is invalid; the message names the field and the value."""

    def __init__(self, field: str, value: object, problem: str) -> None:
        super().__init__(f"{field}={value!r}: {problem}")
        self.field = field
        self.value = value
        self.problem = problem


class ProviderError(BatchLLMError):
    """Raised by a strategy to say how a failure should be treated.

    The classifier takes it at its word: ``category`` decides retrying, and
    ``retry_after`` (seconds) a minimum wait before the next attempt.
    ``token_usage`` reports what a failed but billed attempt consumed (for
    example a response that failed to parse); the engine counts it. It is
    checked here: a key that is not a ``TokenUsage`` key, or a count that is
    not a whole number >= 0, raises ``ValueError``/``TypeError`` naming it.
    ``metadata`` is what the answer said besides, as a success's metadata
    would: under ``"rate_limit"``, its rate-limit headers (name -> value),
    which the engine's quota scope learns the provider's limits from.
    ``stops_batch`` says why no later call to this provider can succeed either
    (a per-day quota spent, a spend limit reached): the item is not retried and
    the batch stops at once, its termination naming this reason.
    """

    def __init__(
        self,
        message: str,
        *,
        category: ErrorCategory,
        retry_after: float | None = None,
        status_code: int | None = None,
        token_usage: Mapping[str, int] | None = None,
        metadata: Mapping[str, Any] | None = None,
        stops_batch: str | None = None,
    ) -> None:
        super().__init__(message)
        check_token_usage(token_usage, "ProviderError(token_usage=...)")
        if stops_batch is not None and (not isinstance(stops_batch, str) or not stops_batch.strip()):
            raise ValueError(f"ProviderError(stops_batch=...): expected a non-empty reason, "
                             f"not {stops_batch!r}")
        self.stops_batch = stops_batch
        self.category = ErrorCategory(category)
        self.retry_after = retry_after
        self.status_code = status_code
        self.token_usage = dict(token_usage) if token_usage else None
        self.metadata: dict[str, Any] = dict(metadata) if metadata else {}


class ItemDeadlineExceeded(BatchLLMError, TimeoutError):
    """An item's total deadline (admission, calls, retries, waits) expired."""


class AttemptTimedOut(BatchLLMError, TimeoutError):
    """An attempt ran past ``attempt_timeout``; classified TIMEOUT and retried.

    What a timed-out item's result carries (``result.exception``). Also a
    :class:`TimeoutError`, so ``except TimeoutError`` catches it.
    """


class QueueFullError(BatchLLMError, RuntimeError):
    """The pool already holds ``concurrency + max_pending`` requests."""


class AdmissionClosedError(BatchLLMError, RuntimeError):
    """The owner is closing or closed and admits no new work."""


class QuotaBackendError(BatchLLMError, RuntimeError):
    """The shared quota store (Redis) stayed unreachable past its bound; nothing was admitted meanwhile.

    The message names the store by its URL without the password.
    """


class BatchInterruptedError(BatchLLMError, RuntimeError):
    """Workers were cancelled before the queue drained (for example by a concurrent close)."""


class CleanupInterruptedError(BatchLLMError, RuntimeError):
    """A close was forced, or one of its steps was cancelled; a later close resumes it."""


class StreamFinalizationError(BatchLLMError, RuntimeError):
    """A result stream's finalization was cancelled; the cancellation is ``__cause__``."""


class ArtifactStoreError(BatchLLMError, RuntimeError):
    """Reading or writing checkpoint artifacts failed."""


class ArtifactMismatchError(ArtifactStoreError):
    """A store was written under a different identity, or its records conflict."""


class ArtifactEncodeError(ArtifactStoreError):
    """One result cannot be stored faithfully (its output, or its item id); nothing was written.

    Raised by ``append()`` before any I/O; the store stays usable. The engine
    turns it into a ``PARSE`` failure of that item, which it stores and
    publishes instead, and the batch goes on.
    """


class DatabaseUnavailableError(ArtifactStoreError):
    """A durable run's database could not be reached: down, restarting, or cut off.

    A driver rides out an outage shorter than ``open_run(unreachable_timeout=...)``
    (it reconnects and carries on); this is raised past it, or at once by a
    one-shot reader. Nothing is stored as failed: the run continues when the
    database is back. The message names the database without its password.
    """


class RunStateError(BatchLLMError, RuntimeError):
    """A durable run's status (or this handle's state) does not allow the operation."""


class RunSourceError(BatchLLMError, ValueError):
    """A durable run's source cannot continue it: missing, changed since the checkpoint, or spent."""
