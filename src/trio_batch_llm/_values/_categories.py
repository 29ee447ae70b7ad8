"""``ErrorCategory``: why an item failed, the one vocabulary every failure carries.

Its own module because results, errors, strategies and the engine all speak it
and none of them should have to import another to do so.
"""

from __future__ import annotations

import enum

__all__ = ["ErrorCategory"]


class ErrorCategory(enum.StrEnum):
    """Why an item failed; decides whether and how it is retried.

    The first twelve members classify a failed attempt: eleven say what the
    provider (or the way to it) did, and ``LOGIC_ERROR`` says the caller's own
    code failed (a ``ValueError``, ``TypeError``, ``KeyError``, ``AttributeError``
    or ``NameError`` with nothing more specific to it: a bug, so calling again
    would only pay for it again). The last four are the engine's own verdicts (a
    deadline, an abort, a spent budget, an item that never ran); a resume always
    reruns items that ended with one of those.
    """

    RATE_LIMIT = "rate_limit"
    TIMEOUT = "timeout"
    TRANSIENT = "transient"
    SERVER = "server"
    AUTHENTICATION = "authentication"
    INSUFFICIENT_BALANCE = "insufficient_balance"
    INVALID_REQUEST = "invalid_request"
    CONTEXT_LENGTH = "context_length"
    CONTENT_POLICY = "content_policy"
    PARSE = "parse"
    LOGIC_ERROR = "logic_error"  # async-batch-llm's value, so its users' strings keep meaning it
    UNKNOWN = "unknown"
    DEADLINE = "deadline"
    ABORTED = "aborted"
    BUDGET = "budget"
    NOT_EXECUTED = "not_executed"

    @property
    def retryable(self) -> bool:
        """Whether a failure of this category may be tried again."""
        return self in _RETRYABLE

    @property
    def engine_verdict(self) -> bool:
        """Whether the engine (not the provider) decided this outcome."""
        return self in _ENGINE_VERDICTS


_RETRYABLE = frozenset(
    {
        ErrorCategory.RATE_LIMIT,
        ErrorCategory.TIMEOUT,
        ErrorCategory.TRANSIENT,
        ErrorCategory.SERVER,
        ErrorCategory.PARSE,
        ErrorCategory.UNKNOWN,
    }
)
_ENGINE_VERDICTS = frozenset(
    {
        ErrorCategory.DEADLINE,
        ErrorCategory.ABORTED,
        ErrorCategory.BUDGET,
        ErrorCategory.NOT_EXECUTED,
    }
)
