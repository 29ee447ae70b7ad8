"""Run every benchmark in one go: ``python3 dev.py bench`` (or ``python benchmarks/run_all.py``).

    python benchmarks/run_all.py [--quick] [--only drain,throughput,overhead,store,checkpoint,batch,cli,limits,gateway]

Runs drain.py, throughput.py, overhead.py, store_throughput.py,
checkpoint_throughput.py, batch_mode.py, cli_scale.py, limits.py and
gateway_litellm.py, each in its
own process (so one benchmark's heap and event-loop state never leak into the
next), in that order. Every script prints its tables and writes JSON (and PNG
plots where it has them) into benchmarks/results/. ``--quick`` is a smoke run
with small sizes and few repetitions that finishes in under two minutes; its
figures are not for publication and go to a scratch folder
(``_common.quick_results_dir()``), never over benchmarks/results/.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from _common import use_quick_results

HERE = Path(__file__).resolve().parent

# (name, script, full-run args, quick-run args)
SCRIPTS: list[tuple[str, str, list[str], list[str]]] = [
    ("drain", "drain.py", [], ["--quick"]),
    ("throughput", "throughput.py", [], ["--quick"]),
    ("overhead", "overhead.py", [], ["--items", "2000", "--repeat", "1"]),
    ("store", "store_throughput.py", [], ["--records", "2000", "--repeat", "1", "--output", "QUICK/store_throughput.json"]),
    ("checkpoint", "checkpoint_throughput.py", [], ["--items", "2000", "--repeat", "1"]),
    ("batch", "batch_mode.py", [], ["--quick"]),
    # The command line on a million-line file; stopped (SIGINT) after 100,000 answers to bound its time.
    ("cli", "cli_scale.py", ["--stop-after", "100000"], ["--quick"]),
    # Admission that learns the provider's limits: three scenarios of a few real 60 s windows (~11 min).
    ("limits", "limits.py", [], ["--quick", "--only", "rpm"]),
    # Behind LiteLLM's proxy (skipped when it is not installed): does the client find a gateway's retry hint?
    ("gateway", "gateway_litellm.py", [], ["--items", "100"]),
]
# crash_fuzz.py is a fuzz test of the stores (pass/fail), not a benchmark: run it on its own.


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run (< 2 minutes), not for publication")
    parser.add_argument("--only", default="", help="comma-separated subset of: " + ",".join(s[0] for s in SCRIPTS))
    args = parser.parse_args(argv)
    only = set(filter(None, args.only.split(",")))
    failures = []
    started = time.perf_counter()
    if args.quick:
        # Smoke figures go to a scratch folder (children inherit BENCH_RESULTS_DIR), never over results/.
        quick_dir = use_quick_results()
        print(f"quick run: results go to {quick_dir}", flush=True)
    for name, script, full, quick in SCRIPTS:
        if only and name not in only:
            continue
        path = HERE / script
        if not path.exists():
            print(f"== {name}: {script} not found, skipped", flush=True)
            continue
        extra = [a.replace("QUICK", str(quick_dir)) for a in quick] if args.quick else full
        print(f"\n== {name}: {script} {' '.join(extra)}", flush=True)
        t0 = time.perf_counter()
        code = subprocess.run([sys.executable, str(path), *extra], cwd=HERE).returncode
        print(f"== {name}: exit {code} after {time.perf_counter() - t0:.0f} s", flush=True)
        if code:
            failures.append(name)
    where = quick_dir if args.quick else HERE / "results"
    print(f"\nall benchmarks: {time.perf_counter() - started:.0f} s; results in {where}")
    if failures:
        print(f"FAILED: {', '.join(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
