"""``trio-batch-llm demo``: a small batch end to end on the embedded default provider."""

from __future__ import annotations

import anyio

from ._config import GuardrailConfig, ProcessorConfig, RetryConfig
from ._entrypoints import process_prompts
from ._strategies._fake import FakeStrategy

__all__ = ["run_demo"]


async def _demo(items: int, concurrency: int) -> None:
    strategy = FakeStrategy(
        latency=(0.005, 0.03), failure_rate=0.05, rate_limit_rate=0.02, retry_after=0.2, seed=1
    )
    config = ProcessorConfig(
        concurrency=concurrency,
        attempt_timeout=5.0,
        retry=RetryConfig(max_attempts=3, initial_wait=0.05, max_wait=0.5, jitter_seed=1),
        guardrails=GuardrailConfig(batch_timeout=60.0),
    )
    prompts = [f"Summarise document {i} in one line." for i in range(items)]
    print(
        f"trio-batch-llm demo: {items} prompts, concurrency {concurrency}, "
        f"backend {anyio.get_current_task().name and _backend()}"
    )
    batch = await process_prompts(strategy, prompts, config=config)
    print(batch.summary())


def _backend() -> str:
    import sniffio

    return sniffio.current_async_library()


def run_demo(*, items: int, concurrency: int, backend: str) -> int:
    anyio.run(_demo, items, concurrency, backend=backend)
    return 0
