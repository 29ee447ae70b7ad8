"""The command line at scale: ``trio-batch-llm run`` over a file of a million prompts.

    python benchmarks/cli_scale.py [--lines 1000000] [--concurrency 64] [--stop-after N]
                                   [--backend trio] [--src OTHER/src] [--quick]

The input is written to a temporary folder (one JSON object per line with an
id, a prompt and a small context, ~95 bytes a line); the mock server runs in
its own process (``_mock_process.py``: its CPU never shares the command's);
the command runs as an operator would start it, ``python -m trio_batch_llm
run IN --out OUT --no-progress``, in a fresh process. Measured:

- **first request**: seconds from just before the command's process is
  started to the first time the mock server reports a request (its own
  ``time.monotonic()``, the same clock on Linux; polled every 2 ms, so an
  upper bound within a few ms). Everything before it is start-up and
  checking the whole input.
- **peak RSS**: the command's ``ru_maxrss`` from ``wait4()`` (its high-water
  mark over the whole run), and its RSS sampled every 0.5 s with the number
  of requests the server had answered then, so growth per result shows.
- **items/s** over the run, and the exit status and summary it printed.

``--stop-after N`` sends SIGINT once the server has answered N requests (the
command then drains and stops; the rest is "not run"), for a shorter run.
``--src`` runs another checkout's ``src`` (e.g. the code before a change),
with this checkout's benchmark. Goals (issue 21): peak RSS <= 200 MB and the
first request within 3 s of start, for 1,000,000 lines.

Prints a table; writes benchmarks/results/cli_scale.json (``--quick``: 20,000
lines into a scratch folder).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import table, use_quick_results, write_json
from _mock_process import MockServerProcess

GOAL_RSS_MB = 200.0
GOAL_FIRST_REQUEST_S = 3.0
SRC = Path(__file__).resolve().parent.parent / "src"


def write_input(path: Path, lines: int) -> int:
    with path.open("w", encoding="utf-8") as f:
        for n in range(lines):
            f.write(json.dumps({"id": f"doc-{n}", "prompt": f"Summarise document {n} in one line.",
                                "context": {"n": n}}) + "\n")
    return path.stat().st_size


def _rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run_once(args: argparse.Namespace, folder: Path, source: Path) -> dict[str, Any]:
    out = folder / "results.jsonl"
    out.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(Path(args.src).resolve()), "PYTHONUNBUFFERED": "1"}
    with MockServerProcess(record=False) as server:
        command = [sys.executable, "-m", "trio_batch_llm", "run", str(source), "--model",
                   "openai-compatible:bench-model", "--base-url", server.base_url, "--out", str(out),
                   "--concurrency", str(args.concurrency), "--backend", args.backend, "--no-progress"]
        stdout, stderr = (folder / "stdout.txt").open("w"), (folder / "stderr.txt").open("w")
        started = time.monotonic()
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=env, stdin=subprocess.DEVNULL)
        first_request: float | None = None
        samples: list[dict[str, float]] = []
        next_sample = started
        interrupted = False
        status = rusage = None
        try:
            while True:
                pid, status, rusage = os.wait4(process.pid, os.WNOHANG)
                if pid:
                    process.returncode = os.waitstatus_to_exitcode(status)
                    break
                now = time.monotonic()
                stats = server.stats() if first_request is None or now >= next_sample else None
                if stats is not None and first_request is None and stats["requests"] > 0:
                    first_request = stats["now"] - started  # an upper bound, within one poll
                if stats is not None and now >= next_sample:
                    rss = _rss_mb(process.pid)
                    if rss is not None:
                        samples.append({"t": now - started, "requests": stats["requests"], "rss_mb": rss})
                    next_sample = now + 0.5
                    if args.stop_after and not interrupted and stats["requests"] >= args.stop_after:
                        process.send_signal(signal.SIGINT)
                        interrupted = True
                time.sleep(0.002 if first_request is None else 0.05)
        finally:
            if process.returncode is None:
                process.kill()
                process.wait()
            stdout.close()
            stderr.close()
        wall = time.monotonic() - started
        answered = server.stats()["requests"]
    assert rusage is not None
    output = (folder / "stdout.txt").read_text()
    return {
        "lines": args.lines,
        "backend": args.backend,
        "concurrency": args.concurrency,
        "src": str(Path(args.src).resolve()),
        "exit_status": process.returncode,
        "first_request_s": first_request,
        "peak_rss_mb": rusage.ru_maxrss / 1024,
        "requests": answered,
        "wall_s": wall,
        "items_per_s": answered / wall if wall else 0.0,
        "rss_samples": samples,
        "summary": output.strip().splitlines(),
        "stderr_tail": (folder / "stderr.txt").read_text().strip().splitlines()[-5:],
        "interrupted_after": args.stop_after if interrupted else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--backend", default="trio", choices=["trio", "asyncio"])
    parser.add_argument("--stop-after", type=int, default=0, metavar="N",
                        help="SIGINT once the server answered N requests (0: run to the end)")
    parser.add_argument("--src", default=str(SRC), help="the src folder to run (default: this checkout's)")
    parser.add_argument("--name", default="cli_scale", help="the results file's name")
    parser.add_argument("--quick", action="store_true", help="20,000 lines, into a scratch folder")
    args = parser.parse_args()
    if args.quick:
        use_quick_results()
        args.lines = min(args.lines, 20_000)
    with tempfile.TemporaryDirectory(prefix="cli-scale-") as tmp:
        folder = Path(tmp)
        source = folder / "prompts.jsonl"
        size = write_input(source, args.lines)
        result = run_once(args, folder, source)
    result["input_bytes"] = size
    first, peak = result["first_request_s"], result["peak_rss_mb"]
    rows = [[f"{args.lines:,}", args.backend, args.concurrency,
             "-" if first is None else f"{first:.2f}", f"{peak:.1f}", result["requests"],
             f"{result['items_per_s']:,.0f}", result["exit_status"]]]
    print(table(["lines", "backend", "concurrency", "first request s", "peak RSS MB", "requests",
                 "items/s", "exit"], rows))
    met = {"first_request": first is not None and first <= GOAL_FIRST_REQUEST_S,
           "peak_rss": peak <= GOAL_RSS_MB}
    print(f"goals: first request <= {GOAL_FIRST_REQUEST_S} s: {'met' if met['first_request'] else 'MISSED'}; "
          f"peak RSS <= {GOAL_RSS_MB} MB: {'met' if met['peak_rss'] else 'MISSED'}")
    for line in result["summary"]:
        print(f"  | {line}")
    samples = result["rss_samples"]
    if samples:
        picks = [samples[round(i * (len(samples) - 1) / 5)] for i in range(6)]
        print("RSS over the run: " + ", ".join(f"{s['t']:.0f}s {s['requests']:,} req {s['rss_mb']:.0f} MB"
                                              for s in picks))
    result["goals"] = {"first_request_s": GOAL_FIRST_REQUEST_S, "peak_rss_mb": GOAL_RSS_MB, "met": met}
    path = write_json(args.name, result)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
