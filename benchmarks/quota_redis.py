"""Shared quotas on Redis: what they cost per call, and what they keep of in-process throughput.

Two sections, each on trio and asyncio:

- ``admission``: one quota scope's admit + release, ``--calls`` times at a
  concurrency of ``--workers`` tasks, with an RPM limit far above the rate
  (so nothing waits on the limit and the cost is the machinery's): in-process
  vs Redis-backed. Round trips per call are counted by the scope itself.
- ``http``: items/s of ``process_prompts`` at concurrency ``--concurrency``
  over real HTTP against the mock server in its own process, with an RPM limit
  far above the rate, in-process vs through Redis; the goal is >= 85 % of
  in-process items/s and <= 1 Redis round trip per call on average.

A ``redis-server`` is started on a random loopback port for the run (the tests'
helper). Results go to ``results/quota_redis.json``.

    python benchmarks/quota_redis.py                  # both sections
    python benchmarks/quota_redis.py --items 20000 --reps 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _common import machine, table, write_json
from _mock_process import MockServerProcess
from _servers.redis import RedisServer
from trio_batch_llm import (
    ExecutorHost,
    OpenAICompatibleStrategy,
    ProcessorConfig,
    RedisQuotaBackend,
    process_prompts,
)
from trio_batch_llm._admission import QuotaRegistry

RPM = 10_000_000  # far above any rate reached here: the limit is checked, never binding


async def admission(calls: int, workers: int, url: str | None) -> tuple[float, float]:
    """Seconds per admit + release, and Redis round trips per call."""
    backend = None if url is None else RedisQuotaBackend(url)
    config = ProcessorConfig(concurrency=workers, max_requests_per_minute=RPM, quota_backend=backend)
    async with anyio.create_task_group() as tg:
        registry = QuotaRegistry(backend=backend, spawn=tg.start_soon)
        scope = registry.scope_for("bench", config)
        (await scope.admit()).release()  # connected (and coredis imported) before the clock starts
        left = calls
        before = scope.statistics().backend_round_trips

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                try:
                    admission = scope.try_admit_nowait()
                except anyio.WouldBlock:
                    admission = await scope.admit()
                await anyio.lowlevel.checkpoint()
                admission.release()

        started = time.perf_counter()
        async with anyio.create_task_group() as inner:
            for _ in range(workers):
                inner.start_soon(worker)
        elapsed = time.perf_counter() - started
        trips = scope.statistics().backend_round_trips - before
        await registry.aclose()
    return elapsed / calls, trips / calls


async def http(items: int, concurrency: int, base_url: str, url: str | None) -> tuple[float, float]:
    """Items/s, and Redis round trips per call."""
    backend = None if url is None else RedisQuotaBackend(url)
    config = ProcessorConfig(concurrency=concurrency, max_requests_per_minute=RPM, quota_backend=backend)
    strategy = OpenAICompatibleStrategy("mock-model", base_url=base_url, api_key="bench", api_key_env=None)
    async with ExecutorHost(config) as host:
        await process_prompts(strategy, ["warm-up"], config=config, host=host)  # connections open
        before = host.quota_scope(strategy).statistics().backend_round_trips
        started = time.perf_counter()
        batch = await process_prompts(strategy, [f"p{i}" for i in range(items)], config=config, host=host)
        elapsed = time.perf_counter() - started
        trips = host.quota_scope(strategy).statistics().backend_round_trips - before
    assert batch.succeeded == items, batch
    return items / elapsed, trips / items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=50)
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sections", default="admission,http")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    payload: dict[str, Any] = {"machine": machine(), "args": vars(args), "admission": {}, "http": {}}
    server = RedisServer()
    try:
        if "admission" in sections:
            rows = []
            for backend in ("trio", "asyncio"):
                local = [anyio.run(admission, args.calls, args.workers, None, backend=backend)
                         for _ in range(args.reps)]
                shared = []
                for _ in range(args.reps):
                    server.flush()
                    shared.append(anyio.run(admission, args.calls, args.workers, server.url, backend=backend))
                cost_local = statistics.median(s for s, _ in local) * 1e6
                cost_redis = statistics.median(s for s, _ in shared) * 1e6
                trips = statistics.median(t for _, t in shared)
                payload["admission"][backend] = {"local_us": cost_local, "redis_us": cost_redis,
                                                 "round_trips_per_call": trips}
                rows.append([backend, f"{cost_local:.1f}", f"{cost_redis:.1f}", f"{trips:.3f}"])
            print(f"admit + release, {args.calls} calls by {args.workers} tasks, RPM limit {RPM:,}")
            print(table(["backend", "in-process µs/call", "Redis µs/call", "round trips/call"], rows))
        if "http" in sections:
            rows = []
            with MockServerProcess() as mock:
                for backend in ("trio", "asyncio"):
                    local = [anyio.run(http, args.items, args.concurrency, mock.base_url, None, backend=backend)
                             for _ in range(args.reps)]
                    shared = []
                    for _ in range(args.reps):
                        server.flush()
                        shared.append(anyio.run(http, args.items, args.concurrency, mock.base_url, server.url,
                                                backend=backend))
                    rate_local = statistics.median(r for r, _ in local)
                    rate_redis = statistics.median(r for r, _ in shared)
                    trips = statistics.median(t for _, t in shared)
                    payload["http"][backend] = {"local_items_per_s": rate_local, "redis_items_per_s": rate_redis,
                                                "share": rate_redis / rate_local, "round_trips_per_call": trips,
                                                "samples_local": local, "samples_redis": shared}
                    rows.append([backend, f"{rate_local:.0f}", f"{rate_redis:.0f}",
                                 f"{100 * rate_redis / rate_local:.0f} %", f"{trips:.3f}"])
            print(f"\nprocess_prompts over HTTP, {args.items} items at concurrency {args.concurrency},"
                  f" mock in its own process")
            print(table(["backend", "in-process items/s", "Redis items/s", "kept", "round trips/call"], rows))
    finally:
        server.close()
    print(f"\nwrote {write_json('quota_redis', payload)}")


if __name__ == "__main__":
    main()
