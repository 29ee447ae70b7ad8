"""``CircuitBreakerConfig``: when a quota scope stops calling an endpoint that is unusable.

Its own module so the breaker's state machine (:mod:`trio_batch_llm._engine._breaker`)
and :class:`~._config.ProcessorConfig` share it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

from ._checks import positive, whole
from ._errors import ConfigurationError

__all__ = ["CircuitBreakerConfig", "check_circuit_breaker"]


@final
@dataclass(frozen=True, slots=True)
class CircuitBreakerConfig:
    """The circuit breaker of each quota scope (``ProcessorConfig(circuit_breaker=...)``).

    After ``threshold`` attempts in a row fail with an error that says the endpoint
    itself is unusable (connection refused, DNS failure, TLS failure, HTTP 401/403, a
    404 about the model), with no success and no other outcome between, the scope
    stops admitting (open). After ``pause`` seconds one call goes (half-open): an
    answer closes the breaker; another endpoint-unusable failure opens it again, and
    after ``probes`` such failed probes the scope is retired: its waiting and queued
    items end with ``StopReason.PROVIDER_RETIRED`` and a batch ends ``provider_retired``.
    ``ProcessorConfig(circuit_breaker=None)`` turns it off.
    """

    threshold: int = 10
    """Endpoint-unusable failures in a row that open the breaker."""
    pause: float = 5.0
    """Seconds the breaker stays open before its probe."""
    probes: int = 1
    """Failed probes after which the scope is retired."""

    def __post_init__(self) -> None:
        whole("threshold", self.threshold, minimum=1, allow_none=False)
        positive("pause", self.pause, allow_none=False)
        whole("probes", self.probes, minimum=1, allow_none=False)


def check_circuit_breaker(value: object) -> None:
    """``ProcessorConfig(circuit_breaker=...)``: a :class:`CircuitBreakerConfig` or ``None``."""
    if value is not None and not isinstance(value, CircuitBreakerConfig):
        raise ConfigurationError("circuit_breaker", value, "must be a CircuitBreakerConfig or None")
