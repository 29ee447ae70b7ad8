"""A scripted strategy for tests, demos and benchmarks. No network, deterministic per seed."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, final

import anyio
import anyio.lowlevel

from .._values._categories import ErrorCategory
from .._values._errors import ProviderError
from .._values._prompts import LLMRequest
from .._values._results import RetryState, TokenUsage
from ._base import LLMCallStrategy

__all__ = ["FakeStrategy"]

Outcome = Any  # a value to return, or an exception instance to raise


@final
class FakeStrategy(LLMCallStrategy[str]):
    """Answers prompts after a scripted latency, with scripted or seeded-random failures.

    - ``latency``: seconds per call, or ``(low, high)`` drawn per call.
    - ``script``: prompt -> outcomes by attempt (1-based); an outcome that is an
      exception instance is raised, anything else is returned as the output.
      Past the end of a script the default answer is given.
    - ``failure_rate`` / ``failure_category``: seeded random failures.
    - ``rate_limit_rate`` / ``retry_after``: seeded random 429s.
    - ``output``: ``fn(prompt) -> str``; default ``"echo: " + prompt``.

    Randomness is keyed by ``(seed, prompt, attempt)``, not drawn from one
    stream, so results do not depend on the order calls happen to run in:
    a seeded run gives identical results on both backends.
    The fake records ``calls``, ``in_flight``, ``max_in_flight``,
    ``prepare_count`` and ``cleanup_count`` for assertions.
    """

    def __init__(
        self,
        *,
        latency: float | tuple[float, float] = 0.0,
        script: Mapping[str, Sequence[Outcome]] | None = None,
        failure_rate: float = 0.0,
        failure_category: ErrorCategory = ErrorCategory.SERVER,
        rate_limit_rate: float = 0.0,
        retry_after: float | None = None,
        output: Callable[[str], str] | None = None,
        tokens: tuple[int, int] = (10, 5),
        seed: int = 0,
        model: str = "fake-model",
        hang: bool = False,
        record_calls: bool = True,
    ) -> None:
        for name, rate in (("failure_rate", failure_rate), ("rate_limit_rate", rate_limit_rate)):
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name}={rate!r}: must be between 0 and 1")
        # Reported as every answer's usage: a bad count is refused here, not on every item.
        if not (isinstance(tokens, tuple) and len(tokens) == 2
                and all(type(n) is int and n >= 0 for n in tokens)):
            raise ValueError(f"tokens={tokens!r:.80}: must be (input, output), two whole numbers >= 0")
        self.latency = latency
        self.script = dict(script or {})
        self.failure_rate = failure_rate
        self.failure_category = failure_category
        self.rate_limit_rate = rate_limit_rate
        self.retry_after = retry_after
        self._output = output
        self.tokens = tokens
        self.seed = seed
        self.model = model
        self.hang = hang
        self.record_calls = record_calls
        self.calls: list[tuple[str, int]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.prepare_count = 0
        self.cleanup_count = 0

    @property
    def model_name(self) -> str:
        return self.model

    def cache_key_material(self, request: LLMRequest) -> dict[str, Any] | None:
        """The default material and the seed; the scripted answers (functions) cannot be keyed,
        so fakes answering differently under one model name should differ in ``model`` or ``seed``."""
        material = super().cache_key_material(request)
        if material is not None:
            material["fake"] = {"seed": self.seed, "tokens": list(self.tokens)}
        return material

    async def prepare(self) -> None:
        self.prepare_count += 1
        await anyio.lowlevel.checkpoint()

    async def cleanup(self) -> None:
        self.cleanup_count += 1
        await anyio.lowlevel.checkpoint()

    def _rng(self, prompt: str, attempt: int) -> random.Random:
        return random.Random(f"{self.seed}\x00{prompt}\x00{attempt}")

    async def execute(
        self, prompt: str, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[str, TokenUsage | None, Any]:
        if self.record_calls:
            self.calls.append((prompt, attempt))
        self.in_flight += 1
        if self.in_flight > self.max_in_flight:
            self.max_in_flight = self.in_flight
        try:
            return await self._answer(prompt, attempt)
        finally:
            self.in_flight -= 1

    async def _answer(self, prompt: str, attempt: int) -> tuple[str, TokenUsage | None, Any]:
        randomized = self.failure_rate or self.rate_limit_rate or isinstance(self.latency, tuple)
        rng = self._rng(prompt, attempt) if randomized else None
        latency = self.latency
        if isinstance(latency, tuple):
            assert rng is not None
            latency = rng.uniform(*latency)
        if self.hang:
            await anyio.sleep_forever()
        if latency > 0:
            await anyio.sleep(latency)
        else:
            await anyio.lowlevel.checkpoint()
        outcomes = self.script.get(prompt)
        if outcomes is not None and attempt <= len(outcomes):
            outcome = outcomes[attempt - 1]
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome, self._usage(), None
        if rng is not None:
            roll = rng.random()
            if roll < self.rate_limit_rate:
                raise ProviderError(
                    "rate limited (fake)",
                    category=ErrorCategory.RATE_LIMIT,
                    retry_after=self.retry_after,
                    status_code=429,
                )
            if roll < self.rate_limit_rate + self.failure_rate:
                raise ProviderError("scripted failure (fake)", category=self.failure_category)
        text = self._output(prompt) if self._output is not None else "echo: " + prompt
        return text, self._usage(), None

    def _usage(self) -> TokenUsage:
        prompt_tokens, completion_tokens = self.tokens
        return {
            "input_tokens": prompt_tokens,
            "output_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    def __repr__(self) -> str:
        return f"FakeStrategy(model={self.model!r}, latency={self.latency!r}, seed={self.seed})"
