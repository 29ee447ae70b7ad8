"""Two services, one provider limit: quota scopes shared through Redis.

Each ExecutorHost here stands for a separate process (it opens its own Redis
connection); they share nothing but the server named by REDIS_URL. With no Redis
server there nothing is admitted: it says so, and exits with status 1.
"""

import os
from functools import partial

import anyio
import trio

from trio_batch_llm import (
    ExecutorHost,
    FakeStrategy,
    GuardrailConfig,
    ProcessorConfig,
    RedisQuotaBackend,
    process_prompts,
)

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
# Settings only: each host opens its own connection.
QUOTA = RedisQuotaBackend(REDIS_URL, namespace="docs-example")


async def service(name: str, calls: dict[str, int]) -> None:
    strategy = FakeStrategy(latency=0.01)
    config = ProcessorConfig(
        concurrency=8,
        max_requests_per_minute=30,  # the key's limit, for every process together
        quota_backend=QUOTA,
        # 3 s: time for the Redis client to load and connect, and 30 calls
        guardrails=GuardrailConfig(batch_timeout=3.0),
    )
    async with ExecutorHost(config) as host:
        prompts = [f"{name} {i}" for i in range(25)]
        await process_prompts(strategy, prompts, config=config, host=host)
    calls[name] = len(strategy.calls)


async def main() -> None:
    calls: dict[str, int] = {}
    async with anyio.create_task_group() as tg:
        for name in ("billing", "search"):
            tg.start_soon(partial(service, name, calls))
    went = sum(calls.values())
    if went == 0:  # with Redis up, the first 30 go at once
        where = QUOTA.display_url  # the URL without its password
        message = f"no call went in 3 s: is a Redis server running at {where}?"
        raise SystemExit(message)
    print(f"50 prompts wanted to go; {went} calls went (limit: 30 a minute)")


if __name__ == "__main__":
    trio.run(main)
