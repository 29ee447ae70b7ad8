"""What every command shares: its exit statuses, its usage error, the key it may send, its signals."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager
from typing import Final

import anyio

from .._values._breaker_config import CircuitBreakerConfig

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_UNAVAILABLE", "EXIT_USAGE", "UsageError", "api_key_from",
           "circuit_breaker_of",
           "signal_receiver"]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
# sysexits.h's EX_UNAVAILABLE ("a service is unavailable"): the run database could not be reached,
# or the circuit breaker retired the provider (`run`: the endpoint is unusable).
# Not 1 (the run did not fail) nor 2 (the usage was fine): a scheduler may simply try again later.
EXIT_UNAVAILABLE: Final = 69


def circuit_breaker_of(threshold: int | None) -> CircuitBreakerConfig | None:
    """``--circuit-breaker N``: the breaker with threshold ``N``; 0 turns it off."""
    if threshold is None:
        return CircuitBreakerConfig()
    return CircuitBreakerConfig(threshold=threshold) if threshold > 0 else None


class UsageError(Exception):
    """The command cannot run as given; the message says why. Nothing was written."""


def api_key_from(name: str | None) -> str | None:
    """The value of the environment variable ``--api-key-env`` names; :class:`UsageError` if it is unset."""
    if name is None:
        return None
    value = os.environ.get(name)
    if not value:
        raise UsageError(f"--api-key-env {name}: the environment variable {name} is not set (or is empty)")
    return value


def signal_receiver() -> AbstractContextManager[AsyncIterator[int] | None]:
    """SIGINT and SIGTERM as a stream, from now until the block ends; ``None`` where unsupported."""
    try:
        return anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM)
    except NotImplementedError:  # pragma: no cover - Windows asyncio: Ctrl+C stays KeyboardInterrupt
        return contextlib.nullcontext(None)
