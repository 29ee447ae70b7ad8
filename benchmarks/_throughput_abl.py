"""async-batch-llm 0.28 twins of the throughput workloads (asyncio only; run with ``asyncio.run``).

Same shapes as ``overhead.py``: N items, W workers, a fake call of ``latency``
seconds, every result kept. Configured as its own benchmark script configures
it (no progress log, generous attempt timeout).
"""

from __future__ import annotations

import logging
from typing import Any

from async_batch_llm import LLMWorkItem, ParallelBatchProcessor, ProcessorConfig, llm, process_prompts
from async_batch_llm.testing import FakeStrategy

_USAGE = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
logging.getLogger("async_batch_llm").setLevel(logging.CRITICAL)


def _config(workers: int, items: int) -> ProcessorConfig:
    return ProcessorConfig(concurrency=workers, attempt_timeout=120.0, progress_interval=items + 1)


async def abl_process_all(items: int, workers: int, latency: float) -> int:
    strategy = FakeStrategy("ok", latency=latency, token_usage=_USAGE)
    async with ParallelBatchProcessor(config=_config(workers, items)) as proc:
        for i in range(items):
            await proc.add_work(LLMWorkItem(item_id=str(i), strategy=strategy, prompt=f"p{i}"))
        batch = await proc.process_all()
    return int(batch.succeeded)


async def abl_process_prompts(items: int, workers: int, latency: float) -> int:
    strategy = FakeStrategy("ok", latency=latency, token_usage=_USAGE)
    batch = await process_prompts(strategy, [f"p{i}" for i in range(items)], config=_config(workers, items))
    return int(batch.succeeded)


async def abl_http(items: int, concurrency: int, base_url: str) -> int:
    """async-batch-llm's OpenAI-compatible path: ``llm("openai-compatible:...")`` (the openai SDK)."""
    strategy: Any = llm("openai-compatible:mock-model", base_url=base_url, api_key="bench",
                        max_connections=concurrency, max_retries=0)
    batch = await process_prompts(strategy, [f"p{i}" for i in range(items)], config=_config(concurrency, items))
    return int(batch.succeeded)
