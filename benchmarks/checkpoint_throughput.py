"""Checkpointed runs through the engine: fresh-run and replay items/s per store and backend.

    python benchmarks/checkpoint_throughput.py [--items 10000] [--concurrency 64] [--repeat 5]
                                               [--backends trio,asyncio] [--fsync]

Each sample is one ``process_prompts`` call in a fresh event loop (FakeStrategy,
zero latency): *fresh* runs every item into a new store (each result appended
and flushed/committed before it is published); *replay* reruns the same
prompts on that store with ``ResumePolicy.REUSE_SUCCESSES``, so every item is
replayed (the script checks: no strategy call, nothing appended). "none" is the
same run without a store, for reference. Repetitions are interleaved (every
variant once per round) and medians reported. Writes
benchmarks/results/checkpoint_throughput.json.

The issue's goal is >= 10,000 items/s for each store, fresh and replay
(async-batch-llm 0.28 measured JSONL 943/s and SQLite 1,075/s fresh, 3,117/s
and 1,479/s replay).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import anyio

from _common import measure, median, table, write_json
from trio_batch_llm import ArtifactIdentity, FakeStrategy, ResumePolicy, process_prompts
from trio_batch_llm._artifacts import JsonlArtifactStore, SqliteArtifactStore

IDENTITY = ArtifactIdentity(provider="fake", model="fake-model", prompt_version="1")
GOAL = 10_000
ASYNC_BATCH_LLM = {("jsonl", "fresh"): 943, ("sqlite", "fresh"): 1075,
                   ("jsonl", "replay"): 3117, ("sqlite", "replay"): 1479}


def make_store(kind: str, directory: Path, fsync: bool) -> JsonlArtifactStore | SqliteArtifactStore | None:
    if kind == "jsonl":
        return JsonlArtifactStore(directory / "run.jsonl", identity=IDENTITY, fsync=fsync)
    if kind == "sqlite":
        return SqliteArtifactStore(directory / "run.sqlite", identity=IDENTITY, fsync=fsync)
    return None


async def run(prompts: list[str], concurrency: int, store: Any, resume: ResumePolicy) -> tuple[int, int, int]:
    """One process_prompts call; returns (results, replayed, strategy calls)."""
    fake = FakeStrategy(record_calls=resume is not ResumePolicy.NONE)
    batch = await process_prompts(fake, prompts, concurrency=concurrency, artifact_store=store, resume=resume)
    assert batch.failed == 0, batch.summary()
    return batch.total_items, sum(r.replayed for r in batch.results), len(fake.calls)


def one_round(args: argparse.Namespace, backend: str, kind: str, prompts: list[str]) -> dict[str, float]:
    directory = Path(tempfile.mkdtemp(prefix=f"checkpoint-{kind}-"))
    try:
        gc.collect()
        fresh_store = make_store(kind, directory, args.fsync)
        wall, cpu, (done, replayed, _) = measure(
            lambda: anyio.run(run, prompts, args.concurrency, fresh_store, ResumePolicy.NONE, backend=backend)
        )
        assert (done, replayed) == (args.items, 0)
        sample = {"fresh_s": wall, "fresh_cpu_s": cpu}
        if fresh_store is None:
            return sample
        written = fresh_store.statistics()
        sample["fresh_write_batches"] = written.write_batches
        assert written.records_written == args.items
        gc.collect()
        replay_store = make_store(kind, directory, args.fsync)
        wall, cpu, (done, replayed, calls) = measure(
            lambda: anyio.run(run, prompts, args.concurrency, replay_store, ResumePolicy.REUSE_SUCCESSES,
                              backend=backend)
        )
        assert replay_store is not None
        assert (done, replayed, calls, replay_store.statistics().records_written) == (args.items, args.items, 0, 0)
        sample |= {"replay_s": wall, "replay_cpu_s": cpu}
        return sample
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--backends", default="trio,asyncio")
    parser.add_argument("--stores", default="jsonl,sqlite,none")
    parser.add_argument("--fsync", action="store_true", help="durable against power loss (fdatasync / FULL)")
    args = parser.parse_args()
    prompts = [f"Summarise document {i} in two sentences." for i in range(args.items)]
    backends, stores = args.backends.split(","), args.stores.split(",")
    samples: dict[tuple[str, str], list[dict[str, float]]] = {}
    for _ in range(args.repeat):
        for backend in backends:
            for kind in stores:
                samples.setdefault((backend, kind), []).append(one_round(args, backend, kind, prompts))
    rows, records = [], []
    for (backend, kind), runs in samples.items():
        record: dict[str, Any] = {"backend": backend, "store": kind, "items": args.items,
                                  "concurrency": args.concurrency, "fsync": args.fsync, "samples": runs}
        row: list[Any] = [backend, kind]
        for phase in ("fresh", "replay"):
            walls = [run[f"{phase}_s"] for run in runs if f"{phase}_s" in run]
            if not walls:
                row += ["-", "-", "-"]
                continue
            rate = args.items / median(walls)
            cpu_us = median([run[f"{phase}_cpu_s"] for run in runs]) / args.items * 1e6
            record[f"{phase}_items_per_s"] = rate
            record[f"{phase}_cpu_us_per_item"] = cpu_us
            baseline = ASYNC_BATCH_LLM.get((kind, phase))
            row += [rate, cpu_us, f"{rate / baseline:.1f}x" if baseline else "-"]
        if kind != "none":
            record["meets_goal"] = all(record[f"{p}_items_per_s"] >= GOAL for p in ("fresh", "replay"))
            row.append("yes" if record["meets_goal"] else "NO")
            record["median_write_batches"] = median([run["fresh_write_batches"] for run in runs])
        else:
            row.append("-")
        records.append(record)
        rows.append(row)
    print(table(["backend", "store", "fresh items/s", "µs CPU/item", "vs abl", "replay items/s",
                 "µs CPU/item", "vs abl", f">= {GOAL:,}/s"], rows))
    print(f"{args.items:,} items, concurrency {args.concurrency}, zero latency, median of {args.repeat}; "
          "abl = async-batch-llm 0.28 on the issue's machine")
    load = os.getloadavg() if hasattr(os, "getloadavg") else None  # wall rates drop on a busy machine
    if load is not None:
        print(f"load average {load[0]:.1f} over {os.cpu_count()} CPUs (CPU µs/item is the steadier figure)")
    payload = {"goal_items_per_s": GOAL, "load_average": load, "runs": records}
    print(f"wrote {write_json('checkpoint_throughput', payload)}")


if __name__ == "__main__":
    main()
