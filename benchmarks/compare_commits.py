"""Commits side by side: drain.py and throughput.py (latency, cpu) for each, in ABBA order.

    python benchmarks/compare_commits.py BEFORE AFTER [LATER ...] [--rounds 2] [--kinds drain,tp] [--out DIR]
    python benchmarks/compare_commits.py --report DIR

The sides are named ``before``, ``after``, then ``later1``, ``later2``, ...; every side
after the first is reported against ``before``.

Each commit is checked out into a temporary worktree and imported from there
(``PYTHONPATH=<worktree>/src``, this checkout's virtual environment), while the
benchmark scripts are this checkout's for both, so only the library differs.
Rounds alternate the order (A B C, then C B A, ...) so that drift on a shared machine
hits both alike. Drain runs use half the default repetitions and no async-batch-llm
(``--reps 10 --http-reps 5 --http-reps-1000 3 --no-abl``); throughput runs use the
defaults of ``--sections latency,cpu --no-abl``. Every run's JSON is kept in DIR
(default ``results/compare_commits``), and the report pools each side's samples:
p95 and p50 of ours against the floor for every drain row (and the p50 against
both sides' floors pooled: the floor is the same code on both sides, so pooling
removes its noise from the change), and the mean ratio to the bare pool for every
throughput row, with the change (positive: worse).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DRAIN_ARGS = ["--reps", "10", "--http-reps", "5", "--http-reps-1000", "3", "--no-abl", "--no-plot"]
THROUGHPUT_ARGS = ["--sections", "latency,cpu", "--no-abl", "--no-plot"]


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * len(ordered) + 0.5) - 1)]


def run_side(side: str, tree: Path, scripts: Path, kind: str, tag: str, out: Path) -> None:
    script, args = ("drain.py", DRAIN_ARGS) if kind == "drain" else ("throughput.py", THROUGHPUT_ARGS)
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    print(f"{tag}: {side} {kind}", flush=True)
    subprocess.run([sys.executable, script, *args], cwd=scripts, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    name = "drain" if kind == "drain" else "throughput"
    shutil.copy(scripts / "results" / f"{name}.json", out / f"{tag}-{side}-{kind}.json")


def side_names(count: int) -> list[str]:
    return ["before", "after", *(f"later{n}" for n in range(1, count - 1))]


def measure(commits: list[str], rounds: int, out: Path, kinds: tuple[str, ...] = ("drain", "tp")) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        sides = dict(zip(side_names(len(commits)), commits, strict=True))
        trees, scripts = {}, {}
        for side, commit in sides.items():
            trees[side] = tmp / f"tree-{side}"
            subprocess.run(["git", "worktree", "add", "--detach", str(trees[side]), commit], cwd=ROOT,
                           check=True, stdout=subprocess.DEVNULL)
            scripts[side] = tmp / f"scripts-{side}"
            shutil.copytree(HERE, scripts[side], ignore=shutil.ignore_patterns("results", "__pycache__"))
        try:
            for kind in kinds:
                for n in range(rounds):
                    order = list(sides) if n % 2 == 0 else list(reversed(sides))
                    for side in order:
                        run_side(side, trees[side], scripts[side], kind, f"r{n + 1}", out)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    (out / "commits.json").write_text(json.dumps(sides, indent=2) + "\n", encoding="utf-8")


def _runs(out: Path, kind: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(out.glob(f"r*-*-{kind}.json")):
        side = path.stem.split("-")[1]
        found.append((side, json.loads(path.read_text(encoding="utf-8"))))
    return found


def report(out: Path) -> None:
    names = json.loads((out / "commits.json").read_text(encoding="utf-8"))
    later = [side for side in names if side in side_names(len(names))[1:]]
    for side in later:
        print(f"\n### before ({names['before']}) against {side} ({names[side]})\n")
        report_pair(out, side)


def report_pair(out: Path, after: str) -> None:
    sides = ("before", after)
    samples: dict[tuple[str, ...], list[float]] = collections.defaultdict(list)
    for side, data in _runs(out, "drain"):
        for row in data["records"]:
            key = (side, row["group"], row["scenario"], str(row["n"]), row["backend"], row["impl"])
            samples[key] += row["samples_ms"]
    if samples:
        drain_table(samples, sides)
    tp_table(out, after)


def drain_table(samples: dict[tuple[str, ...], list[float]], sides: tuple[str, str]) -> None:
    after = sides[1]
    # The floor is the same code on both sides (this checkout's scripts), so its difference between
    # the sides is noise: the last columns divide each side's p50 by the p50 of both sides' floors.
    print("| group | stop | N | backend | before p95/floor | after p95/floor | before p50/floor"
          " | after p50/floor | p50 change | before p50/both floors | after p50/both floors | change |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = sorted({key[1:5] for key in samples}, key=lambda k: (k[0], k[1], int(k[2]), k[3]))
    for group, stop, n, backend in rows:
        cells: dict[str, tuple[float, float, float]] = {}
        floors = [ms for side in sides for ms in samples.get((side, group, stop, n, backend, "floor"), [])]
        for side in sides:
            ours = samples.get((side, group, stop, n, backend, "ours"))
            floor = samples.get((side, group, stop, n, backend, "floor"))
            if ours and floor:
                cells[side] = (p95(ours) / p95(floor), statistics.median(ours) / statistics.median(floor),
                               statistics.median(ours) / statistics.median(floors))
        if len(cells) < 2:
            continue
        (b95, b50, bboth), (a95, a50, aboth) = cells["before"], cells[after]
        print(f"| {group} | {stop} | {n} | {backend} | {b95:.2f} | {a95:.2f} | {b50:.2f} | {a50:.2f}"
              f" | {100 * (a50 / b50 - 1):+.0f} % | {bboth:.2f} | {aboth:.2f} | {100 * (aboth / bboth - 1):+.0f} % |")


def tp_table(out: Path, after: str) -> None:
    ratios: dict[tuple[str, str, str], list[float]] = collections.defaultdict(list)
    for side, data in _runs(out, "tp"):
        for section, key in (("latency", "vs_bare"), ("cpu", "cpu_vs_bare")):
            for row in data[section]:
                ratios[(section, row["variant"], side)].append(row[key])
    if not ratios:
        return
    print("\n| section | variant | before (mean of runs) | after | change (positive: worse) |")
    print("|---|---|---:|---:|---:|")
    for section, variant in sorted({(k[0], k[1]) for k in ratios}):
        before_runs, after_runs = ratios.get((section, variant, "before")), ratios.get((section, variant, after))
        if variant.startswith("bare") or not before_runs or not after_runs:
            continue
        b, a = statistics.mean(before_runs), statistics.mean(after_runs)
        worse = (a / b - 1) if section == "cpu" else (1 - a / b)  # cpu: per item, lower is better
        print(f"| {section} | {variant} | {b:.3f} | {a:.3f} | {100 * worse:+.1f} % |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("commits", nargs="*", metavar="COMMIT")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "compare_commits")
    parser.add_argument("--kinds", default="drain,tp", help="what to run: drain, tp or both (drain,tp)")
    parser.add_argument("--report", type=Path, help="only print the report of a DIR measured before")
    args = parser.parse_args()
    if args.report is not None:
        report(args.report)
        return
    if len(args.commits) < 2:
        parser.error("BEFORE and AFTER commits are required (or --report DIR)")
    kinds = tuple(kind.strip() for kind in args.kinds.split(","))
    if not kinds or not set(kinds) <= {"drain", "tp"}:
        parser.error(f"--kinds={args.kinds!r}: drain, tp or drain,tp")
    measure(args.commits, args.rounds, args.out, kinds)
    report(args.out)


if __name__ == "__main__":
    main()
