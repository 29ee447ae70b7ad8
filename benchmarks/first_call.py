"""Time to the first call: from ``process_prompts(...)`` over a list to the strategy's ``prepare()`` and first call.

    python benchmarks/first_call.py [--sizes 10000,100000,1000000] [--reps 3] [--big-reps 1]
                                    [--backends trio,asyncio,uvloop] [--variants texts,pairs,add_work]
                                    [--baseline OTHER/src] [--no-plot] [--quick]

Before its first call, ``process_prompts`` checks the whole list (bad input is refused
before any call, naming the item) and queues it; everything it does per item before the
strategy's ``prepare()`` is the up-front check, reported in µs per item beyond the fixed
cost (the time to ``prepare()`` for a list of one item, measured in the same process). Variants:

- ``texts``: ``process_prompts(strategy, ["p0", "p1", ...])``;
- ``pairs``: ``process_prompts(strategy, [("id0", "p0"), ...])``;
- ``add_work``: ``ParallelBatchProcessor``: ``add_work()`` of ready-made ``LLMWorkItem``s,
  then ``process_all()`` (the clock starts at the first ``add_work``; building the items
  is the caller's).

The strategy records when its ``prepare()`` and its first call begin, and the first call
cancels the run (what follows is not measured). Each (side, backend, size) runs in a
fresh process, so one size's heap does not slow the next; the list is built before the
clock starts. ``--baseline`` measures another checkout's ``src/`` beside this one
(``PYTHONPATH``), the sides alternating round by round so drift on a shared machine
falls on both alike; a figure is the fastest repetition (noise only ever adds time).
Writes benchmarks/results/first_call.json and first_call.png.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import BACKENDS, results_path, run_on, table, use_quick_results, uvloop_available, write_json

HERE = Path(__file__).resolve().parent
THIS_SRC = HERE.parent / "src"
VARIANTS = ("texts", "pairs", "add_work")


# --- the child: one side, one backend, one size ------------------------------------------------


def _strategy_class() -> Any:
    import anyio
    import anyio.lowlevel

    from trio_batch_llm import LLMCallStrategy

    class FirstCall(LLMCallStrategy[str]):
        """Marks ``prepare()`` and the first call; the first call cancels ``scope``."""

        def __init__(self, scope: anyio.CancelScope) -> None:
            self.scope = scope
            self.prepared: float | None = None
            self.called: float | None = None

        async def prepare(self) -> None:
            if self.prepared is None:
                self.prepared = time.perf_counter()
            await anyio.lowlevel.checkpoint()

        async def execute(self, prompt: str, attempt: int, timeout: float | None,
                          state: Any = None) -> tuple[str, None, None]:
            if self.called is None:
                self.called = time.perf_counter()
                self.scope.cancel()
            await anyio.lowlevel.checkpoint()
            return prompt, None, None

    return FirstCall


def _inputs(variant: str, n: int) -> list[Any]:
    if variant == "pairs":
        return [(f"id{i}", f"p{i}") for i in range(n)]
    return [f"p{i}" for i in range(n)]


async def _one(variant: str, prompts: list[Any]) -> tuple[float, float]:
    import anyio

    from trio_batch_llm import LLMWorkItem, ParallelBatchProcessor, ProcessorConfig, process_prompts

    scope = anyio.CancelScope()
    strategy = _strategy_class()(scope)
    items = ([LLMWorkItem(item_id=f"item-{i}", strategy=strategy, prompt=p) for i, p in enumerate(prompts)]
             if variant == "add_work" else None)
    gc.collect()
    with scope:
        start = time.perf_counter()
        if items is None:
            await process_prompts(strategy, prompts, concurrency=100)
        else:
            async with ParallelBatchProcessor[str](ProcessorConfig(concurrency=100)) as proc:
                for item in items:
                    await proc.add_work(item)
                await proc.process_all()
    assert strategy.prepared is not None and strategy.called is not None, "the run ended before its first call"
    return strategy.prepared - start, strategy.called - start


def child(backend: str, n: int, variants: list[str], reps: int) -> dict[str, list[list[float]]]:
    """``{variant: [[to prepare, to first call, the same for one item], ...]}`` in seconds.

    The one-item run (the same process, just before) is the fixed cost, which the per-item
    figure leaves out.
    """
    out: dict[str, list[list[float]]] = {}
    for variant in variants:
        prompts = _inputs(variant, n)
        one = _inputs(variant, 1)
        run_on(backend, _one, variant, one)  # a warm-up: the first run in a process pays imports
        out[variant] = [[*run_on(backend, _one, variant, prompts), *run_on(backend, _one, variant, one)]
                        for _ in range(reps)]
        del prompts
    return out


# --- the parent: rounds of children, the table, the plot ---------------------------------------


def _run_child(src: Path, backend: str, n: int, variants: list[str], reps: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(HERE)]), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", backend, str(n), ",".join(variants), str(reps)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    sides = {"this": THIS_SRC}
    if args.baseline is not None:
        sides = {"baseline": args.baseline.resolve(), "this": THIS_SRC}
    samples: dict[tuple[str, str, int, str], list[list[float]]] = {}
    for n in args.sizes:
        reps = args.reps if n < 1_000_000 else args.big_reps
        for round_ in range(args.rounds):
            order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            for backend in args.backends:
                for side in order:
                    print(f"  {side} {backend} n={n:,} round {round_ + 1}", file=sys.stderr, flush=True)
                    got = _run_child(sides[side], backend, n, args.variants, reps)
                    for variant, runs in got.items():
                        samples.setdefault((side, backend, n, variant), []).extend(runs)
    rows = []
    for (side, backend, n, variant), runs in samples.items():
        prepare = min(r[0] for r in runs)
        first = min(r[1] for r in runs)
        fixed = min(r[2] for r in runs)
        rows.append({"side": side, "backend": backend, "n": n, "variant": variant, "reps": len(runs),
                     "to_prepare_s": prepare, "to_first_call_s": first, "fixed_s": fixed,
                     "us_per_item": (prepare - fixed) / max(n - 1, 1) * 1e6, "samples": runs})
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    baseline = {(r["backend"], r["n"], r["variant"]): r for r in rows if r["side"] == "baseline"}
    headers = ["variant", "backend", "items", "side", "to prepare() s", "to first call s", "1 item ms",
               "µs/item"]
    if baseline:
        headers.append("× baseline")
    lines = []
    for r in sorted(rows, key=lambda r: (r["variant"], r["backend"], r["n"], r["side"] != "baseline")):
        line: list[Any] = [r["variant"], r["backend"], r["n"], r["side"], f"{r['to_prepare_s']:.3f}",
                           f"{r['to_first_call_s']:.3f}", f"{r['fixed_s'] * 1e3:.2f}", f"{r['us_per_item']:.2f}"]
        if baseline:
            base = baseline.get((r["backend"], r["n"], r["variant"]))
            line.append(f"{r['us_per_item'] / base['us_per_item']:.3f}" if base and r["side"] != "baseline" else "")
        lines.append(line)
    return table(headers, lines)


def plot(rows: list[dict[str, Any]]) -> Path:
    from _plots import _COLORS, _pyplot

    plt = _pyplot()
    variants = sorted({r["variant"] for r in rows}, key=VARIANTS.index)
    fig, axes = plt.subplots(1, len(variants), figsize=(5 * len(variants), 4), squeeze=False)
    for ax, variant in zip(axes.flat, variants, strict=True):
        for side in ("baseline", "this"):
            for backend in BACKENDS:
                series = sorted((r["n"], r["us_per_item"]) for r in rows
                                if r["variant"] == variant and r["side"] == side and r["backend"] == backend)
                if not series:
                    continue
                ns, us = zip(*series, strict=True)
                ax.plot(ns, us, color=_COLORS.get(backend), marker="o",
                        linestyle="-" if side == "this" else "--", label=f"{side} ({backend})")
        if variant != "add_work":  # the goal is process_prompts'
            ax.axhline(2.0, color="red", linestyle=":", label="goal 2 µs/item")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("items in the list")
        ax.set_ylabel("µs per item before prepare() (beyond 1 item's)")
        ax.set_title(f"process_prompts: {variant}" if variant != "add_work" else "add_work loop")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = results_path("first_call.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per process, below a million items")
    parser.add_argument("--big-reps", type=int, default=1, help="repetitions per process, a million items or more")
    parser.add_argument("--rounds", type=int, default=2, help="fresh processes per side, backend and size")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--baseline", type=Path, help="another checkout's src/ to measure beside this one")
    parser.add_argument("--no-plot", dest="plot", action="store_false")
    parser.add_argument("--quick", action="store_true", help="smoke run: small sizes, one round")
    args = parser.parse_args(argv)
    if args.quick:
        use_quick_results()  # a smoke run never overwrites the published figures
        args.sizes, args.reps, args.rounds = "1000,10000", 1, 1
    args.sizes = [int(x) for x in args.sizes.split(",")]
    args.backends = [b for b in args.backends.split(",") if b != "uvloop" or uvloop_available()]
    args.variants = args.variants.split(",")
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    rows = measure(args)
    print(table_text := render(rows))
    path = write_json("first_call", {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows,
                                     "table": table_text})
    print(f"\nwrote {path}")
    if args.plot:
        print(f"wrote {plot(rows)}")
    return {"rows": rows}


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        _, _, backend_, n_, variants_, reps_ = sys.argv
        print(json.dumps(child(backend_, int(n_), variants_.split(","), int(reps_))))
    else:
        main()
