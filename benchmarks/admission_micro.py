"""Admission micro-benchmark: one quota scope's admit + release, uncontended and contended.

    python benchmarks/admission_micro.py [--baseline OTHER/src] [--rounds 40] [--quick]

Cases, in µs of process CPU per admit + release on trio and asyncio with the
scope's default clock (CPU rather than wall time, so that other processes on a
shared machine count less):

- ``bound only``: a concurrency bound, no RPM/TPM (the engine's common case);
- ``rpm``: plus a requests-per-minute limit far above the rate reached;
- ``rpm+tpm``: plus a tokens-per-minute limit, 100 tokens reserved, 80 used;
- ``contended``: 64 tasks share 8 slots (each holds its slot across one
  checkpoint), so most admissions wait in line and are woken by a release;
  task switches are included.

``--baseline`` measures another checkout beside this one, in the same process:
its ``trio_batch_llm`` package is copied to a temporary directory under another
name (every import inside the package is relative), and the two are measured
alternately, one short repetition each, round after round, so that drift on a
shared machine falls on both alike. A figure is the fastest repetition over
all rounds (noise only ever adds time). Writes benchmarks/results/admission_micro.json.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

from _common import median, table, write_json

BACKENDS = ("trio", "asyncio")
CASES = ("bound only", "rpm", "rpm+tpm", "contended")
LIMITS: dict[str, tuple[dict[str, Any], int, int]] = {
    "bound only": ({}, 0, 0),
    "rpm": ({"requests_per_minute": 1e12}, 0, 0),
    "rpm+tpm": ({"requests_per_minute": 1e12, "tokens_per_minute": 10**15}, 100, 80),
}


def _scope_class(package: str) -> Any:
    try:
        return importlib.import_module(f"{package}._admission").QuotaScope
    except AttributeError:  # a checkout from before the package face re-exported it
        return importlib.import_module(f"{package}._admission._scope").QuotaScope


def _load_baseline(src: Path, into: Path) -> str:
    name = "trio_batch_llm_baseline"
    shutil.copytree(src / "trio_batch_llm", into / name)
    sys.path.insert(0, str(into))
    return name


async def _uncontended(quota_scope: Any, case: str, n: int) -> float:
    limits, tokens, used = LIMITS[case]
    scope = quota_scope(concurrency=8, **limits)  # fresh: the RPM log starts empty each time
    admit = scope.try_admit_nowait
    start = time.process_time()
    for _ in range(n):
        admit(tokens).release(used)
    return (time.process_time() - start) / n * 1e6


async def _contended(quota_scope: Any, n: int) -> float:
    tasks = 64
    per_task = max(1, n // tasks)
    scope = quota_scope(concurrency=8)

    async def caller() -> None:
        for _ in range(per_task):
            try:
                admission = scope.try_admit_nowait(0)
            except anyio.WouldBlock:
                admission = await scope.admit(0)
            await anyio.lowlevel.checkpoint()
            admission.release(0)

    start = time.process_time()
    async with anyio.create_task_group() as tg:
        for _ in range(tasks):
            tg.start_soon(caller)
    return (time.process_time() - start) / (tasks * per_task) * 1e6


def _measure(variants: dict[str, Any], backend: str, rounds: int, n: int) -> dict[str, dict[str, list[float]]]:
    samples: dict[str, dict[str, list[float]]] = {v: {c: [] for c in CASES} for v in variants}

    async def main() -> None:
        for _ in range(rounds):
            for case in CASES:
                for variant, quota_scope in variants.items():
                    run: Awaitable[float] = (
                        _contended(quota_scope, n // 10) if case == "contended"
                        else _uncontended(quota_scope, case, n)
                    )
                    samples[variant][case].append(await run)

    anyio.run(main, backend=backend)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, help="another checkout's src/ to measure beside this one")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("-n", type=int, default=20_000, help="admissions per uncontended repetition")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 rounds, few admissions")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.n = 2, 2_000
    with tempfile.TemporaryDirectory() as tmp:
        variants: dict[str, Any] = {}
        if args.baseline is not None:
            variants["baseline"] = _scope_class(_load_baseline(args.baseline, Path(tmp)))
        variants["this"] = _scope_class("trio_batch_llm")
        samples = {backend: _measure(variants, backend, args.rounds, args.n) for backend in BACKENDS}
    best: Callable[[list[float]], float] = min
    figures = {v: {b: {c: best(samples[b][v][c]) for c in CASES} for b in BACKENDS} for v in variants}
    headers = ["case", "backend", *(f"{v} µs" for v in variants)]
    if args.baseline is not None:
        headers.append("this / baseline")
    rows = []
    for case in CASES:
        for backend in BACKENDS:
            row: list[Any] = [case, backend, *(f"{figures[v][backend][case]:.3f}" for v in variants)]
            if args.baseline is not None:
                row.append(f"{figures['this'][backend][case] / figures['baseline'][backend][case]:.2f}")
            rows.append(row)
    print(table(headers, rows))
    path = write_json("admission_micro", {
        "rounds": args.rounds, "n": args.n, "statistic": "fastest repetition, µs of process CPU per admission",
        "baseline": None if args.baseline is None else str(args.baseline),
        "us_per_admission": figures,
        "median_us_per_admission": {
            v: {b: {c: median(samples[b][v][c]) for c in CASES} for b in BACKENDS} for v in variants
        },
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
