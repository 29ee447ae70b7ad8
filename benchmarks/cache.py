"""The response cache: a warm re-run against a cold one, and two processes racing on a shared cache.

Two sections (issue 34's goals), against the mock server in its own process (the
provider; it counts the calls) with ``--latency`` seconds per answer:

- ``warm``: ``process_prompts`` over ``--items`` distinct prompts with a fresh SQLite
  cache, cold (every item a miss: one call each), then the same again warm, on trio and
  on asyncio. Goal: the warm run makes 0 provider calls and takes <= 10 % of the cold
  run's wall time.
- ``race``: two processes (``tests/_cache_race_child.py``, started together) run
  ``process_prompts`` over the same ``--prompts`` prompts with one shared cache, on Redis
  and on PostgreSQL (servers started for the run with the tests' helpers), the racers on
  trio and on asyncio. Goal: <= prompts + 1 % provider calls in all (1,010 for 1,000):
  the cache's single flight across processes makes each prompt's call once.

Results go to ``results/cache.json`` and the plots ``cache_warm.png`` and ``cache_race.png``.

    python benchmarks/cache.py                       # both sections, full size
    python benchmarks/cache.py --quick               # smoke run (small sizes, scratch folder)
    python benchmarks/cache.py --sections race --prompts 1000 --latency 0.05
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _cache_race_child import run_race
from _common import machine, table, use_quick_results, write_json
from _mock_process import MockServerProcess
from _plots import plot_bars
from _servers.postgres import PostgresServer
from _servers.redis import RedisServer
from trio_batch_llm import (
    OpenAICompatibleStrategy,
    ProcessorConfig,
    RetryConfig,
    SqliteResponseCache,
    process_prompts,
)

MODEL = "bench-model"


def warm_prompts(count: int) -> list[str]:
    return [f"warm prompt {i}: say something about {i}" for i in range(count)]


async def one_pass(base_url: str, path: Path | None, items: int, concurrency: int) -> tuple[float, int, int]:
    """Seconds, cached results and failures of one ``process_prompts`` pass through the cache at ``path``
    (``None``: no cache, the baseline a cold run's cost is read against)."""
    strategy = OpenAICompatibleStrategy(MODEL, base_url=base_url, api_key="sk-bench")
    cache = SqliteResponseCache(path, max_bytes=None) if path is not None else None
    config = ProcessorConfig(concurrency=concurrency, retry=RetryConfig(max_attempts=1), cache=cache)
    started = time.perf_counter()
    batch = await process_prompts(strategy, warm_prompts(items), config=config)
    seconds = time.perf_counter() - started
    cached = sum(1 for result in batch.results if result.cached)
    failed = sum(1 for result in batch.results if not result.success)
    return seconds, cached, failed


def warm_section(args: argparse.Namespace, mock: MockServerProcess) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for backend in ("trio", "asyncio"):
        with tempfile.TemporaryDirectory(prefix="tbl-cache-bench-") as folder:
            path = Path(folder) / "cache.sqlite3"
            for run in ("uncached", "cold", "warm"):
                before = mock.stats()["requests"]
                seconds, cached, failed = anyio.run(one_pass, mock.base_url, path if run != "uncached" else None,
                                                    args.items, args.concurrency, backend=backend)
                calls = mock.stats()["requests"] - before
                rows.append({"backend": backend, "run": run, "items": args.items, "calls": calls,
                             "cached": cached, "failed": failed, "seconds": seconds})
                print(f"  {backend} {run}: {calls} calls, {cached} cached, {seconds:.2f} s", flush=True)
    return rows


def race_section(args: argparse.Namespace, mock: MockServerProcess) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    redis = RedisServer()
    postgres = PostgresServer()
    try:
        for name in args.caches.split(","):
            for backend in ("trio", "asyncio"):
                if name == "redis":
                    redis.flush()
                    url = redis.url
                else:
                    url = postgres.new_database()
                before = mock.stats()["requests"]
                outs = run_race(url, mock.base_url, args.prompts, processes=2, mode=args.mode, backend=backend,
                                concurrency=args.concurrency)
                calls = mock.stats()["requests"] - before
                rows.append({"cache": name, "backend": backend, "prompts": args.prompts, "calls": calls,
                             "hits": sum(out["hits"] for out in outs),
                             "failed": sum(out.get("failed", 0) for out in outs),
                             "seconds": max(out["seconds"] for out in outs), "racers": outs})
                print(f"  {name} {backend}: {calls} calls for {args.prompts} prompts", flush=True)
    finally:
        redis.close()
        postgres.close()
    return rows


def plot(*args: Any, **kwargs: Any) -> None:
    try:
        print(f"wrote {plot_bars(*args, **kwargs)}")
    except ImportError:  # matplotlib comes with the bench extra
        print("no plot: matplotlib is not installed (pip install -e '.[bench]')")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--prompts", type=int, default=1_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--latency", type=float, default=0.1, help="the mock's seconds per answer")
    parser.add_argument("--mode", choices=["engine", "gate"], default="engine",
                        help="racers through process_prompts (engine) or the cache gate directly")
    parser.add_argument("--sections", default="warm,race")
    parser.add_argument("--caches", default="redis,postgresql", help="the race section's shared caches")
    parser.add_argument("--quick", action="store_true", help="smoke run: small sizes, scratch results folder")
    args = parser.parse_args()
    if args.quick:
        use_quick_results()
        args.items, args.prompts = min(args.items, 300), min(args.prompts, 100)
    sections = set(args.sections.split(","))
    payload: dict[str, Any] = {"machine": machine(), "args": vars(args), "warm": [], "race": []}
    with MockServerProcess(config={"latency": args.latency}) as mock:
        if "warm" in sections:
            print(f"warm: {args.items} items, cold then warm, SQLite cache, mock latency {args.latency} s")
            payload["warm"] = warm_rows = warm_section(args, mock)
            lines = []
            for backend in ("trio", "asyncio"):
                plain, cold, warm = (next(r for r in warm_rows if r["backend"] == backend and r["run"] == run)
                                     for run in ("uncached", "cold", "warm"))
                share = warm["seconds"] / cold["seconds"]
                ok = warm["calls"] == 0 and share <= 0.10
                lines.append([backend, f"{plain['seconds']:.2f}", cold["calls"], f"{cold['seconds']:.2f}",
                              f"{cold['seconds'] / plain['seconds']:.2f}x", warm["calls"],
                              f"{warm['seconds']:.2f}", f"{share:.1%}", "PASS" if ok else "MISS"])
            print(table(["backend", "no cache s", "cold calls", "cold s", "cold/none", "warm calls", "warm s",
                         "warm/cold", "goal"], lines))
            plot(f"Response cache: {args.items:,} items cold, then warm (SQLite)",
                      [f"{r['backend']} {r['run']}" for r in warm_rows], [r["seconds"] for r in warm_rows],
                      "wall seconds", "cache_warm.png")
        if "race" in sections:
            print(f"race: two processes over the same {args.prompts} prompts, shared cache ({args.mode})")
            payload["race"] = race_rows = race_section(args, mock)
            goal = args.prompts * 1.01
            lines = [[r["cache"], r["backend"], r["prompts"], r["calls"], r["hits"], r["failed"],
                      f"{r['seconds']:.2f}", "PASS" if r["calls"] <= goal and not r["failed"] else "MISS"]
                     for r in race_rows]
            print(table(["cache", "racers on", "prompts", "provider calls", "hits", "failed", "s", "goal"],
                        lines))
            plot("Two processes racing over the same prompts: provider calls",
                      [f"{r['cache']} {r['backend']}" for r in race_rows], [r["calls"] for r in race_rows],
                      "provider calls (both processes)", "cache_race.png",
                      reference=(f"goal {goal:,.0f}", goal))
    print(f"\nwrote {write_json('cache', payload)}")


if __name__ == "__main__":
    main()
