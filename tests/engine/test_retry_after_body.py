"""A wait given in the body (issue 33, point 4): Gemini's per-minute 429 says ``RetryInfo.retryDelay``
("45.8s") in its body, and the strategy passes it as ``ProviderError(retry_after=45.8)`` with no
headers. The quota scope must honour it exactly as a ``Retry-After`` header: one scope-wide
cooldown of 45.8 s, every waiting item held by it, the refused call retried when it ends. On
Trio's virtual clock, so the times are exact.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from trio_batch_llm import (
    ErrorCategory,
    LLMCallPool,
    LLMCallStrategy,
    ProcessorConfig,
    ProviderError,
    RetryConfig,
    RetryState,
    TokenUsage,
)

from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module", params=[pytest.param(trio_virtual_clock(), id="trio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


def _in_body() -> ProviderError:
    return ProviderError("HTTP 429 (RESOURCE_EXHAUSTED): quota GenerateRequestsPerMinutePerProjectPerModel",
                         category=ErrorCategory.RATE_LIMIT, status_code=429, retry_after=45.8)


def _in_header() -> ProviderError:
    return ProviderError("HTTP 429", category=ErrorCategory.RATE_LIMIT, status_code=429,
                         metadata={"rate_limit": {"retry-after": "45.8"}})


class RefusedOnce(LLMCallStrategy[str]):
    """The first call is refused with ``refusal()``; every call is logged with its time."""

    def __init__(self, refusal: Any) -> None:
        self.refusal = refusal
        self.calls: list[tuple[str, float]] = []

    async def execute(self, prompt: str, attempt: int, timeout: float | None,
                      state: RetryState | None = None) -> tuple[str, TokenUsage | None, Any]:
        self.calls.append((prompt, round(anyio.current_time(), 3)))
        await anyio.sleep(0.1)
        if len(self.calls) == 1:
            raise self.refusal()
        return "ok", None, None


async def _run(refusal: Any) -> tuple[list[tuple[str, float]], float, list[Any]]:
    strategy = RefusedOnce(refusal)
    config = ProcessorConfig(concurrency=1, retry=RetryConfig(initial_wait=0.5, jitter_seed=1))
    results: list[Any] = []
    async with LLMCallPool(strategy, config=config) as pool:
        start = anyio.current_time()

        async def one(prompt: str) -> None:
            results.append(await pool.submit_result(prompt))

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "a")
            await anyio.sleep(0.01)
            tg.start_soon(one, "b")  # waits for the slot, then for the cooldown
            await anyio.sleep(0.2)
            cooldown = pool.statistics().admission.cooldown_remaining
    return [(p, round(t - start, 3)) for p, t in strategy.calls], cooldown, results


async def test_a_retry_after_in_the_body_cools_the_scope_down_as_the_header_does(anyio_backend: Any) -> None:
    body_calls, body_cooldown, body_results = await _run(_in_body)
    header_calls, header_cooldown, header_results = await _run(_in_header)
    assert all(r.success for r in body_results + header_results)
    assert body_cooldown == pytest.approx(45.8 - 0.11, abs=1e-6)  # from the 429 at 0.1 s, read at 0.21 s
    assert body_cooldown == pytest.approx(header_cooldown)
    assert body_calls == header_calls
    # "a" refused at 0.1 s; nothing goes for 45.8 s, then the scope reopens ("b" queued first).
    assert body_calls[0] == ("a", 0.0)
    assert min(t for _, t in body_calls[1:]) == pytest.approx(45.9, abs=1e-3)
