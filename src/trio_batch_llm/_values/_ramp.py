"""``StartupRampConfig``: full concurrency reached in steps when a processor starts."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import final

from ._checks import non_negative, positive, whole
from ._errors import ConfigurationError

__all__ = ["StartupRampConfig"]


@final
@dataclass(frozen=True, slots=True)
class StartupRampConfig:
    """Start ``initial_concurrency`` workers, then ``concurrency_step`` more every
    ``ramp_interval_seconds`` (each delayed by up to ``jitter_seconds`` more), up to
    ``max_concurrency`` (default: all the workers).

    For a cold endpoint that answers a full-width opening with 429s. A ramp never holds a
    batch up: once the input is drained, the workers still waiting to start leave.
    """

    initial_concurrency: int = 1
    concurrency_step: int = 1
    ramp_interval_seconds: float = 1.0
    max_concurrency: int | None = None
    jitter_seconds: float = 0.0

    def __post_init__(self) -> None:
        whole("initial_concurrency", self.initial_concurrency, minimum=1, allow_none=False)
        whole("concurrency_step", self.concurrency_step, minimum=1, allow_none=False)
        positive("ramp_interval_seconds", self.ramp_interval_seconds, allow_none=False)
        whole("max_concurrency", self.max_concurrency, minimum=1)
        non_negative("jitter_seconds", self.jitter_seconds)
        if self.max_concurrency is not None and self.initial_concurrency > self.max_concurrency:
            raise ConfigurationError(
                "initial_concurrency", self.initial_concurrency,
                f"exceeds max_concurrency={self.max_concurrency}",
            )

    def workers(self, configured: int) -> int:
        """How many workers run: the configured number, capped by ``max_concurrency``."""
        return configured if self.max_concurrency is None else min(configured, self.max_concurrency)

    def start_delay(self, index: int) -> float:
        """Seconds after the start at which worker ``index`` (0-based) may take its first item."""
        if index < self.initial_concurrency:
            return 0.0
        steps = math.ceil((index + 1 - self.initial_concurrency) / self.concurrency_step)
        return steps * self.ramp_interval_seconds
