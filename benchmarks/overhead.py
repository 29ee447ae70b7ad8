"""Engine overhead next to a bare anyio worker pool, on trio and asyncio, measured side by side.

    python benchmarks/overhead.py [--items 10000] [--workers 100] [--repeat 5]

Two workloads: 5 ms fake latency (items/s; ceiling = workers / latency) and
zero latency (µs of process CPU per item). The repetitions are interleaved
(every variant once per round) and medians reported, so drift on a shared
machine hits all variants alike. Writes benchmarks/results/overhead.json.
"""

from __future__ import annotations

import argparse
import gc
from typing import Any

import anyio
import anyio.lowlevel

from _common import measure, median, table, write_json
from trio_batch_llm import FakeStrategy, LLMWorkItem, ParallelBatchProcessor, ProcessorConfig, process_prompts


async def bare_pool(items: int, workers: int, latency: float, yield_each: bool) -> int:
    """Task group + memory stream + N workers: the floor any engine is measured against."""
    send, recv = anyio.create_memory_object_stream[int](workers)
    done = 0

    async def worker(r: Any) -> None:
        nonlocal done
        async with r:
            async for _ in r:
                if latency:
                    await anyio.sleep(latency)
                elif yield_each:
                    await anyio.lowlevel.checkpoint()
                done += 1

    async with anyio.create_task_group() as tg:
        for _ in range(workers):
            tg.start_soon(worker, recv.clone())
        recv.close()
        async with send:
            for i in range(items):
                await send.send(i)
    return done


async def ours_process_all(items: int, workers: int, latency: float) -> int:
    fake = FakeStrategy(latency=latency, record_calls=False)
    config = ProcessorConfig(concurrency=workers)
    async with ParallelBatchProcessor[str](config) as proc:
        for i in range(items):
            await proc.add_work(LLMWorkItem(item_id=str(i), strategy=fake, prompt="p"))
        batch = await proc.process_all()
    return batch.succeeded


async def ours_process_prompts(items: int, workers: int, latency: float) -> int:
    fake = FakeStrategy(latency=latency, record_calls=False)
    batch = await process_prompts(fake, ["p"] * 0 + [f"p{i}" for i in range(items)], concurrency=workers)
    return batch.succeeded


VARIANTS = {
    "bare pool": lambda n, w, lat: bare_pool(n, w, lat, yield_each=False),
    "bare pool + 1 checkpoint/item": lambda n, w, lat: bare_pool(n, w, lat, yield_each=True),
    "ParallelBatchProcessor.process_all": ours_process_all,
    "process_prompts": ours_process_prompts,
}


def run_once(backend: str, variant: str, items: int, workers: int, latency: float) -> tuple[float, float]:
    fn = VARIANTS[variant]
    gc.collect()
    wall, cpu, done = measure(lambda: anyio.run(fn, items, workers, latency, backend=backend))
    assert done == items, (variant, done)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--backends", default="trio,asyncio")
    args = parser.parse_args()
    backends = args.backends.split(",")
    samples: dict[tuple[str, str, float], list[tuple[float, float]]] = {}
    for _ in range(args.repeat):
        for latency in (0.005, 0.0):
            for backend in backends:
                for variant in VARIANTS:
                    key = (backend, variant, latency)
                    samples.setdefault(key, []).append(
                        run_once(backend, variant, args.items, args.workers, latency)
                    )
    rows, records = [], []
    for (backend, variant, latency), runs in samples.items():
        wall = median([w for w, _ in runs])
        cpu_us = median([c for _, c in runs]) / args.items * 1e6
        base = samples[(backend, "bare pool", latency)]
        base_wall = median([w for w, _ in base])
        base_cpu = median([c for _, c in base]) / args.items * 1e6
        record = {
            "backend": backend,
            "variant": variant,
            "latency_s": latency,
            "items": args.items,
            "workers": args.workers,
            "items_per_s": args.items / wall,
            "cpu_us_per_item": cpu_us,
            "throughput_vs_bare": base_wall / wall,
            "cpu_vs_bare": cpu_us / base_cpu,
        }
        records.append(record)
        rows.append(
            [
                backend,
                f"{latency * 1000:g} ms",
                variant,
                record["items_per_s"],
                cpu_us,
                f"{record['throughput_vs_bare']:.0%}",
                f"{record['cpu_vs_bare']:.2f}x",
            ]
        )
    print(
        table(
            ["backend", "latency", "variant", "items/s", "CPU µs/item", "items/s vs bare", "CPU vs bare"],
            rows,
        )
    )
    path = write_json("overhead", {"repeat": args.repeat, "results": records})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
