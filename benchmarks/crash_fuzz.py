"""Crash fuzzing: SIGKILL a real child at seeded moments of a 2,000-item run, resume, check.

    python benchmarks/crash_fuzz.py [--trials 200] [--items 2000] [--concurrency 32]
                                    [--stores jsonl,sqlite] [--seed 0] [--fsync-published]

The same trial as tests/test_crash_resume.py (the harness is tests/_crash_child.py;
its docstring lists the invariants), run ``--trials`` times per store. Child
backends alternate trio/asyncio every trial and parent (resume) backends every
two trials, so all four pairs are covered; every fifth trial kills the resumed
child a second time. A failing trial keeps its directory (store, published and
calls logs, child stderr) and the script exits 1. Prints a summary per store and
child backend and writes benchmarks/results/crash_fuzz.json.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from _common import median, table, write_json

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests._crash_child import CrashInvariantError, TrialReport, kill_plans, run_trial


def one_trial(args: argparse.Namespace, kind: str, trial: int, rng: random.Random) -> dict[str, Any]:
    plans = kill_plans(trial, args.trials, rng, items=args.items, second_kill=trial % 5 == 4)
    child_backend = "trio" if trial % 2 == 0 else "asyncio"
    parent_backend = "trio" if trial // 2 % 2 == 0 else "asyncio"
    seed = rng.randrange(2**32)
    directory = Path(tempfile.mkdtemp(prefix=f"crash-fuzz-{kind}-{trial}-"))
    record: dict[str, Any] = {
        "store": kind, "trial": trial, "seed": seed, "child_backend": child_backend,
        "parent_backend": parent_backend, "kills": [plan.describe() for plan in plans],
    }
    started = time.perf_counter()
    try:
        report: TrialReport = anyio.run(
            lambda: run_trial(
                kind, directory, kills=plans, child_backend=child_backend, items=args.items,
                concurrency=args.concurrency, seed=seed, fsync_published=args.fsync_published,
            ),
            backend=parent_backend,
        )
    except Exception as exc:  # an invariant, or an error from the resume itself: both are findings
        kind_of = "invariant" if isinstance(exc, CrashInvariantError) else type(exc).__name__
        record |= {"ok": False, "error": f"{kind_of}: {exc}", "kept": str(directory),
                   "seconds": time.perf_counter() - started}
        print(f"FAILED {kind} trial {trial}: {exc}\n  kept {directory}", flush=True)
        return record
    shutil.rmtree(directory, ignore_errors=True)
    first = report.phases[0]
    record |= {
        "ok": True,
        "seconds": report.seconds,
        "killed": first.killed,
        "stored_at_first_kill": first.stored_after,
        "second_kill": len(report.phases) > 1 and report.phases[1].killed,
        "published": [phase.published for phase in report.phases],
        "stored_successes_before_final": report.stored_successes_before_final,
        "final_replayed": report.final_replayed,
        "final_executed": report.final_executed,
    }
    return record


def summarize(records: list[dict[str, Any]], items: int) -> list[list[Any]]:
    rows = []
    for kind in sorted({r["store"] for r in records}):
        for child in ("trio", "asyncio"):
            group = [r for r in records if r["store"] == kind and r["child_backend"] == child]
            if not group:
                continue
            ok = [r for r in group if r["ok"]]
            at_start = [r for r in ok if r["killed"] and r["stored_at_first_kill"] == 0]
            mid = [r for r in ok if r["killed"] and 0 < r["stored_at_first_kill"] < items]
            rows.append([
                kind, child, len(group), len(group) - len(ok), len(at_start), len(mid),
                sum(1 for r in ok if not r["killed"] or r["stored_at_first_kill"] == items),
                sum(1 for r in ok if r["second_kill"]),
                int(median([float(r["stored_at_first_kill"]) for r in mid])) if mid else 0,
                median([r["seconds"] for r in group]),
            ])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200, help="trials per store")
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--stores", default="jsonl,sqlite")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fsync-published", action="store_true",
                        help="fsync the child's published log per line (only matters for power loss)")
    args = parser.parse_args()
    records: list[dict[str, Any]] = []
    started = time.perf_counter()
    stores = args.stores.split(",")
    rngs = {kind: random.Random(f"crash-fuzz/{args.seed}/{kind}") for kind in stores}
    for trial in range(args.trials):  # interleaved: both stores per round
        for kind in stores:
            records.append(one_trial(args, kind, trial, rngs[kind]))
        if (trial + 1) % 20 == 0:
            print(f"  {trial + 1}/{args.trials} trials per store, "
                  f"{sum(not r['ok'] for r in records)} failed", flush=True)
    headers = ["store", "child", "trials", "failed", "killed at start", "killed mid-run",
               "finished first", "2nd kills", "median stored @kill", "median s/trial"]
    print(table(headers, summarize(records, args.items)))
    failed = [r for r in records if not r["ok"]]
    total = time.perf_counter() - started
    print(f"{len(records)} trials in {total:.1f} s; {len(failed)} broke an invariant")
    path = write_json("crash_fuzz", {
        "items": args.items, "concurrency": args.concurrency, "trials_per_store": args.trials,
        "seed": args.seed, "fsync_published": args.fsync_published, "failed": len(failed),
        "seconds": total, "trials": records,
    })
    print(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
