"""A stop ends the items waiting for the Redis-shared quota, as it ends those waiting for a local one.

Real Redis servers and real time (the shared window is Redis's): the batches end when their calls
in flight have finished, well inside the bounds (``fail_after``) the bug's waits would pass (a
60 s RPM window; ``unreachable_timeout`` with Redis gone).
"""

from __future__ import annotations

import gc
import warnings
from typing import Any

import anyio
import pytest

from trio_batch_llm import (
    ErrorCategory,
    LLMCallStrategy,
    LLMWorkItem,
    ParallelBatchProcessor,
    ProcessorConfig,
    RedisQuotaBackend,
    RetryState,
    StopReason,
    TokenUsage,
)

from .._servers.redis import start_redis

pytestmark = pytest.mark.anyio

CALL = 0.2


class Counting(LLMCallStrategy[str]):
    model_name = "m"
    provider_name = "counting"

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.two_started = anyio.Event()

    async def execute(self, prompt: str, attempt: int, timeout: float | None,
                      state: RetryState | None = None) -> tuple[str, TokenUsage | None, Any]:
        self.calls.append(prompt)
        if len(self.calls) == 2:
            self.two_started.set()
        await anyio.sleep(CALL)
        return f"answer {prompt}", {"input_tokens": 5, "output_tokens": 5, "total_tokens": 10}, None


async def _stop_after_two_calls(backend: RedisQuotaBackend, *, kill: Any = None) -> None:
    """Concurrency 4, a shared RPM of 2, 12 items: two calls start, two items wait for the share;
    ``kill`` (if given) takes Redis away first; then ``request_stop()``."""
    strategy = Counting()
    cfg = ProcessorConfig(concurrency=4, max_requests_per_minute=2, quota_backend=backend)
    prompts = [f"p{i:02d}" for i in range(12)]
    with anyio.fail_after(10):
        async with ParallelBatchProcessor[str](cfg) as proc, anyio.create_task_group() as tg:
            for prompt in prompts:
                await proc.add_work(LLMWorkItem(item_id=prompt, strategy=strategy, prompt=prompt))

            async def stop_after_two() -> None:
                await strategy.two_started.wait()
                if kill is not None:
                    kill()
                await anyio.sleep(0.05)  # the other two are waiting for the share by now
                proc.request_stop("interrupted by SIGINT")

            tg.start_soon(stop_after_two)
            batch = await proc.process_all()
    assert len(strategy.calls) == 2
    results = {r.item_id: r for r in batch.results}
    assert all(results[p].success for p in strategy.calls)
    rest = [r for p, r in results.items() if p not in strategy.calls]
    assert len(rest) == 10
    assert {(r.error_category, r.stop_reason, r.attempts) for r in rest} == {
        (ErrorCategory.NOT_EXECUTED, StopReason.SHUTDOWN, 0)}
    assert batch.termination.kind == "interrupted"


async def test_items_waiting_for_the_shared_rpm_end_at_the_stop(anyio_backend: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # coredis's leak (see test_quota_redis)
        server = start_redis()
        try:
            await _stop_after_two_calls(RedisQuotaBackend(server.url))
        finally:
            server.close()
            gc.collect()


async def test_items_waiting_for_an_unreachable_quota_backend_end_at_the_stop(anyio_backend: Any) -> None:
    """Redis gone: the waiting items would wait ``unreachable_timeout`` (30 s) and end the batch with
    ``QuotaBackendError``; the stop ends them NOT_EXECUTED now and the batch ends ``interrupted``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        server = start_redis()
        try:
            backend = RedisQuotaBackend(server.url, unreachable_timeout=30.0, connect_timeout=0.2,
                                        command_timeout=0.5)
            await _stop_after_two_calls(backend, kill=server.kill)
        finally:
            server.close()
            gc.collect()
