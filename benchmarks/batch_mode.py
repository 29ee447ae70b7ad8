"""Provider Batch API mode: items per second through a durable run, and what it costs the event loop.

    python benchmarks/batch_mode.py [--items 50000] [--repeat 3] [--backends trio,asyncio,uvloop] [--quick]

Each repetition opens a fresh run on a fresh SQLite file and drives it with
``run.wait()`` against the mock server in a separate process (its CPU never
shares our event loop): ingestion in slices, request files of up to
``--batch-size`` lines, upload, create, polls every 50 ms, output files
mapped back and recorded. The mock answers every batch at the first poll
after it was created, so the figure is our own cost per item (plus the
mock's): an upper bound for the bookkeeping, not a provider's speed.

Next to it, a *loop lag* probe sleeps 10 ms at a time in the same event loop
and records how late it wakes: the longest stall another task of the
application would have seen while the run worked (p99 and max).

Writes benchmarks/results/batch_mode.json (``--quick``: a scratch folder).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    BACKENDS,
    median,
    percentile,
    run_on,
    table,
    use_quick_results,
    uvloop_available,
    write_json,
)

_PROBE = 0.010


async def one_run(base_url: str, items: int, batch_size: int) -> dict[str, Any]:
    import anyio

    from trio_batch_llm import ArtifactIdentity, OpenAICompatibleStrategy, ProviderBatchConfig
    from trio_batch_llm._runs import open_run

    lags: list[float] = []

    async def probe() -> None:
        while True:
            began = time.perf_counter()
            await anyio.sleep(_PROBE)
            lags.append(time.perf_counter() - began - _PROBE)

    strategy = OpenAICompatibleStrategy("mock-model", base_url=base_url, api_key_env=None)
    batch = ProviderBatchConfig(poll_interval=0.05, max_requests_per_batch=batch_size)
    prompts = [f"benchmark prompt number {i}" for i in range(items)]
    with tempfile.TemporaryDirectory() as folder:
        began = time.perf_counter()
        async with anyio.create_task_group() as tg:
            tg.start_soon(probe)
            async with await open_run(
                Path(folder) / "runs.sqlite", "bench", strategy, prompts, mode="provider-batch",
                identity=ArtifactIdentity("bench", "mock-model"), poll_interval=0.05, batch=batch,
            ) as run:
                snap = await run.wait()
            tg.cancel_scope.cancel()
        elapsed = time.perf_counter() - began
    assert snap.status == "completed" and snap.succeeded == items, snap
    return {
        "seconds": elapsed,
        "items_per_s": items / elapsed,
        "lag_p99_ms": percentile(lags, 0.99) * 1000,
        "lag_max_ms": max(lags) * 1000,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=50_000)
    parser.add_argument("--batch-size", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--quick", action="store_true", help="smoke run: 2,000 items, one repetition")
    args = parser.parse_args(argv)
    if args.quick:
        use_quick_results()
        args.items, args.batch_size, args.repeat = 2_000, 500, 1
    backends = [b for b in args.backends.split(",") if b != "uvloop" or uvloop_available()]

    from _mock_process import MockServerProcess

    samples: dict[str, list[dict[str, Any]]] = {b: [] for b in backends}
    with MockServerProcess() as server:
        for _ in range(args.repeat):  # interleaved: every backend once per round
            for backend in backends:
                samples[backend].append(run_on(backend, one_run, server.base_url, args.items, args.batch_size))
    rows = []
    summary = []
    for backend, runs in samples.items():
        row = {
            "backend": backend,
            "items": args.items,
            "items_per_s": median([r["items_per_s"] for r in runs]),
            "lag_p99_ms": median([r["lag_p99_ms"] for r in runs]),
            "lag_max_ms": max(r["lag_max_ms"] for r in runs),
        }
        summary.append(row)
        rows.append([backend, args.items, row["items_per_s"], row["lag_p99_ms"], row["lag_max_ms"]])
    print(table(["backend", "items", "items/s (median)", "loop lag p99 ms", "loop lag max ms"], rows))
    path = write_json("batch_mode", {"args": vars(args), "summary": summary, "samples": samples})
    print(f"\nwrote {path}")
    return {"summary": summary}


if __name__ == "__main__":
    main()
