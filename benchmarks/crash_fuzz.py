"""Crash fuzzing: SIGKILL a real child at seeded moments of a 2,000-item run, resume, check.

    python benchmarks/crash_fuzz.py [--trials 200] [--items 2000] [--concurrency 32]
                                    [--stores jsonl,sqlite] [--seed 0] [--fsync-published]
    python benchmarks/crash_fuzz.py --mode provider-batch [--trials 50] [--items 24] [--seed 0]

The same trial as tests/e2e/test_crash_resume.py (the harness is tests/_crash_child.py;
its docstring lists the invariants), run ``--trials`` times per store. Child
backends alternate trio/asyncio every trial and parent (resume) backends every
two trials, so all four pairs are covered; every fifth trial kills the resumed
child a second time. A failing trial keeps its directory (store, published and
calls logs, child stderr) and the script exits 1. Prints a summary per store and
child backend and writes benchmarks/results/crash_fuzz.json.

``--mode provider-batch`` runs the provider-batch trial of
tests/runs/test_batch_crash.py instead (the harness is tests/_runs_batch_child.py;
its docstring lists the kill moments and the invariants): a durable run in Batch
API mode against the mock server, its child SIGKILLed at a seeded moment (kill
triggers stratified over the trials; a third of the trials kill the resumed
child again; a create-triggered kill meets a hanging create), finished by the
parent or a fresh child. Prints, per trigger, how many kills landed, the moments
they interrupted and how often a create had to be settled by the operator, and
writes benchmarks/results/crash_fuzz_batch.json.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio

from _common import median, table, write_json

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests._crash_child import CrashInvariantError, TrialReport, kill_plans, run_trial
from tests._runs_batch_child import BatchCrashError, BatchTrial, KillPlan, Trigger, run_batch_trial


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


# --- provider-batch mode ------------------------------------------------------------------

TRIGGERS: tuple[Trigger, ...] = ("entry", "upload", "create", "open", "collect", "start")
HANG_FAULTS = ("hang_before_create", "hang_after_create", "reset_after_create")


def batch_kill(trigger: Trigger, rng: random.Random, items: int) -> KillPlan:
    match trigger:
        case "start":
            return KillPlan("start", delay=rng.uniform(0.0, 1.5))
        case "entry":
            return KillPlan("entry", count=rng.randint(1, items - 1))
        case "upload" | "create":
            return KillPlan(trigger, count=rng.randint(1, 2), delay=rng.uniform(0.0, 0.1))
        case "open":
            return KillPlan("open", count=rng.randint(1, 2), delay=rng.uniform(0.0, 0.3))
        case "collect":
            return KillPlan("collect", count=rng.randint(1, max(1, items // 4 - 1)), delay=rng.uniform(0.0, 0.05))
    raise ValueError(trigger)


def batch_trial(trial: int, rng: random.Random, items: int) -> BatchTrial:
    trigger = TRIGGERS[trial % len(TRIGGERS)]
    kills = [batch_kill(trigger, rng, items)]
    if rng.random() < 0.35:
        kills.append(batch_kill(rng.choice(TRIGGERS[1:]), rng, items))
    faults: tuple[str, ...] = ()
    if trigger == "create":  # the kill lands inside that create
        faults = ("ok",) * (kills[0].count - 1) + (rng.choice(HANG_FAULTS),)
    elif rng.random() < 0.3:
        faults = ("ok",) * rng.randint(0, 3) + (rng.choice((*HANG_FAULTS, "error:500", "error:429")),)
    return BatchTrial(
        kills=tuple(kills), items=items, child_backend="trio" if trial % 2 == 0 else "asyncio",
        final="parent" if rng.random() < 0.6 else "child", create_faults=faults,
        latency=0.03 if trigger == "upload" else rng.choice((0.0, 0.0, 0.02)),
        entry_delay=rng.choice((0.0, 0.005, 0.02)),
    )


def one_batch_trial(trial: int, spec: BatchTrial) -> dict[str, Any]:
    parent_backend = "trio" if trial // 2 % 2 == 0 else "asyncio"
    directory = Path(tempfile.mkdtemp(prefix=f"crash-fuzz-batch-{trial}-"))
    record: dict[str, Any] = {"trial": trial, "trigger": spec.kills[0].trigger, "spec": spec.describe(),
                              "child_backend": spec.child_backend, "parent_backend": parent_backend}
    started = time.perf_counter()
    try:
        report = anyio.run(run_batch_trial, spec, directory, backend=parent_backend)
    except Exception as exc:  # an invariant, or an error from the resume itself: both are findings
        kind_of = "invariant" if isinstance(exc, BatchCrashError) else type(exc).__name__
        record |= {"ok": False, "error": f"{kind_of}: {exc}", "kept": str(directory),
                   "seconds": time.perf_counter() - started}
        print(f"FAILED batch trial {trial} ({spec.describe()}): {exc}\n  kept {directory}", flush=True)
        return record
    shutil.rmtree(directory, ignore_errors=True)
    record |= {
        "ok": True, "seconds": report.seconds, "resolutions": len(report.resolutions),
        "batches_created": report.batches_created,
        "phases": [{"plan": p.plan, "killed": p.killed, "moment": sorted(p.moment), "done": p.done}
                   for p in report.phases],
    }
    return record


def batch_main(args: argparse.Namespace) -> int:
    items = args.items if args.items is not None else 24
    rng = random.Random(f"crash-fuzz/{args.seed}/provider-batch")
    records: list[dict[str, Any]] = []
    started = time.perf_counter()
    for trial in range(args.trials):
        records.append(one_batch_trial(trial, batch_trial(trial, rng, items)))
        if (trial + 1) % 10 == 0:
            print(f"  {trial + 1}/{args.trials} trials, {sum(not r['ok'] for r in records)} failed", flush=True)
    rows = []
    for trigger in TRIGGERS:
        group = [r for r in records if r["trigger"] == trigger]
        ok = [r for r in group if r["ok"]]
        moments = Counter(tag for r in ok for p in r["phases"][:1] if p["killed"] for tag in p["moment"])
        rows.append([
            trigger, len(group), len(group) - len(ok), sum(r["phases"][0]["killed"] for r in ok),
            sum(len(r["phases"]) > 1 and r["phases"][1]["killed"] for r in ok),
            ", ".join(f"{tag} {n}" for tag, n in sorted(moments.items())),
            sum(r["resolutions"] for r in ok), median([r["seconds"] for r in group]) if group else 0.0,
        ])
    headers = ["first kill at", "trials", "failed", "killed", "2nd kills", "moments interrupted (1st kill)",
               "operator settled", "median s/trial"]
    print(table(headers, rows))
    failed = [r for r in records if not r["ok"]]
    total = time.perf_counter() - started
    print(f"{len(records)} trials in {total:.1f} s; {len(failed)} broke an invariant")
    path = write_json("crash_fuzz_batch", {
        "items": items, "trials": args.trials, "seed": args.seed, "failed": len(failed), "seconds": total,
        "records": records,
    })
    print(f"wrote {path}")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("store", "provider-batch"), default="store")
    parser.add_argument("--trials", type=int, default=200, help="trials per store")
    parser.add_argument("--items", type=int, help="items per run (default: 2000; provider-batch: 24)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--stores", default="jsonl,sqlite")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fsync-published", action="store_true",
                        help="fsync the child's published log per line (only matters for power loss)")
    args = parser.parse_args()
    if args.mode == "provider-batch":
        return batch_main(args)
    args.items = args.items if args.items is not None else 2000
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
