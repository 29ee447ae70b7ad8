"""Artifact-store throughput: fresh appends with concurrent appenders, then load and replay.

    .venv/bin/python benchmarks/store_throughput.py [--records 10000] [--concurrency 64]
                                                    [--repeat 3] [--fsync] [--backends trio asyncio]

For each backend (trio, asyncio) and store (JSONL, SQLite) it writes
``--records`` results into a fresh store from ``--concurrency`` tasks (each
append returns only once its record is flushed / committed), then reopens the
store and measures ``load()`` and a full resume pass (``prepare_resume`` +
``plan.replay(item)`` for every item, fingerprints included). Each figure is
the median of ``--repeat`` runs. Prints a table and writes
benchmarks/results/store_throughput.json.

The issue's goal: >= 10,000 fresh appends/s per store (async-batch-llm 0.28
measured 943/s for JSONL and 1,075/s for SQLite).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from trio_batch_llm import ArtifactIdentity, ItemTiming, LLMWorkItem, ResumePolicy, WorkItemResult
from trio_batch_llm._artifacts import JsonlArtifactStore, SqliteArtifactStore, fingerprint, prepare_resume

IDENTITY = ArtifactIdentity(provider="bench", model="bench-model", prompt_version="1")
RESULTS_PATH = Path(__file__).resolve().parent / "results" / "store_throughput.json"


def make_store(kind: str, directory: Path, fsync: bool) -> JsonlArtifactStore | SqliteArtifactStore:
    if kind == "jsonl":
        return JsonlArtifactStore(directory / "run.jsonl", identity=IDENTITY, fsync=fsync)
    return SqliteArtifactStore(directory / "run.sqlite", identity=IDENTITY, fsync=fsync)


def prompt_for(i: int) -> str:
    return f"Summarise document {i} in two sentences. " + "lorem ipsum " * 20


def result_for(i: int) -> WorkItemResult[Any]:
    """A realistic small result: ~200 characters of output, usage, timing, context."""
    return WorkItemResult(
        item_id=f"item-{i}",
        success=True,
        output=f"Document {i} describes a process. " + "It has several steps and one outcome. " * 4,
        attempts=1,
        token_usage={"input_tokens": 64, "output_tokens": 48, "total_tokens": 112},
        timing=ItemTiming(admission_wait=0.001, execution=0.25, total=0.251),
        context={"row": i, "source": "bench.jsonl"},
        metadata={"model": "bench-model", "finish_reason": "stop"},
    )


async def one_run(kind: str, records: int, concurrency: int, fsync: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="store-bench-") as tmp:
        directory = Path(tmp)
        prepared = [(result_for(i), fingerprint(prompt_for(i), {"row": i, "source": "bench.jsonl"}))
                    for i in range(records)]
        store = make_store(kind, directory, fsync)
        await store.open()

        async def appender(start: int) -> None:
            for index in range(start, records, concurrency):
                result, fp = prepared[index]
                await store.append(result, fingerprint=fp)

        began = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for start in range(concurrency):
                tg.start_soon(appender, start)
        append_seconds = time.perf_counter() - began
        stats = store.statistics()
        await store.aclose()
        assert stats.records_written == records, stats

        reader = make_store(kind, directory, fsync)
        await reader.open()
        began = time.perf_counter()
        loaded = await reader.load()
        load_seconds = time.perf_counter() - began
        await reader.aclose()
        assert len(loaded) == records

        resumer = make_store(kind, directory, fsync)
        items = [LLMWorkItem(item_id=f"item-{i}", strategy=None, prompt=prompt_for(i),  # type: ignore[arg-type]
                             context={"row": i, "source": "bench.jsonl"}) for i in range(records)]
        began = time.perf_counter()
        plan = await prepare_resume(resumer, ResumePolicy.REUSE_SUCCESSES)
        replayed = sum(1 for item in items if plan.replay(item) is not None)
        replay_seconds = time.perf_counter() - began
        await resumer.aclose()
        assert replayed == records, replayed

        return {
            "append_per_s": records / append_seconds,
            "write_batches": stats.write_batches,
            "mean_batch": records / stats.write_batches,
            "load_per_s": records / load_seconds,
            "resume_per_s": records / replay_seconds,
        }


async def measure(kind: str, args: argparse.Namespace) -> dict[str, float]:
    runs = [await one_run(kind, args.records, args.concurrency, args.fsync) for _ in range(args.repeat)]
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fsync", action="store_true", help="fsync=True (JSONL fdatasync, SQLite FULL)")
    parser.add_argument("--backends", nargs="+", default=["trio", "asyncio"], choices=["trio", "asyncio"])
    parser.add_argument("--output", type=Path, default=RESULTS_PATH)
    args = parser.parse_args(argv)

    rows: list[dict[str, Any]] = []
    for backend in args.backends:
        for kind in ("jsonl", "sqlite"):
            figures = anyio.run(measure, kind, args, backend=backend)
            rows.append({"backend": backend, "store": kind, **figures})

    header = f"{'backend':<8} {'store':<7} {'append/s':>10} {'batches':>8} {'mean batch':>10} " \
             f"{'load/s':>11} {'resume/s':>10}"
    print(f"{args.records:,} records, {args.concurrency} concurrent appenders, fsync={args.fsync}, "
          f"median of {args.repeat}")
    print(header)
    print("-" * len(header))
    for row in rows:
        print(f"{row['backend']:<8} {row['store']:<7} {row['append_per_s']:>10,.0f} "
              f"{row['write_batches']:>8,.0f} {row['mean_batch']:>10.1f} {row['load_per_s']:>11,.0f} "
              f"{row['resume_per_s']:>10,.0f}")

    report = {
        "benchmark": "store_throughput",
        "records": args.records,
        "concurrency": args.concurrency,
        "repeat": args.repeat,
        "fsync": args.fsync,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "goal_append_per_s": 10_000,
        "rows": rows,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
