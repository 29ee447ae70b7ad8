"""Memory at scale and import time, each measured in fresh subprocesses.

Memory: ``python _footprint.py memory N BACKEND`` streams N prompts (a lazy
generator) through ``process_stream`` with bounded input and result queues and
zero latency, after a small warm-up run, and prints one JSON line: peak RSS
(``VmHWM``) before and after, the growth, and items/s. A fresh process per
size keeps one run's peak from hiding the next one's.

Import time: ``python -X importtime -c "import X"`` in a subprocess; the
cumulative microseconds of the top-level package, median of several runs.
"""

from __future__ import annotations

import json
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve()


def memory_in_subprocess(items: int, backend: str, concurrency: int = 64) -> dict[str, Any]:
    out = subprocess.run([sys.executable, str(_HERE), "memory", str(items), backend, str(concurrency)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _max_rss_mib() -> float:
    """Peak RSS of this process. VmHWM, not ru_maxrss: on Linux ru_maxrss survives fork+exec, so a
    child started by a big parent would report the parent's peak and hide its own growth."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


async def _stream(items: int, concurrency: int) -> int:
    from trio_batch_llm import FakeStrategy, ProcessorConfig, process_stream

    fake = FakeStrategy(record_calls=False)
    config = ProcessorConfig(concurrency=concurrency, max_queue_size=4 * concurrency,
                             max_result_queue_size=4 * concurrency)
    count = 0
    async with process_stream(fake, (f"p{i}" for i in range(items)), config=config) as results:
        async for result in results:
            count += result.success
    return count


def _memory_child(items: int, backend: str, concurrency: int) -> None:
    import gc

    sys.path.insert(0, str(_HERE.parent))
    from _common import run_on

    run_on(backend, _stream, 2_000, concurrency)  # warm-up: imports, caches, first allocations
    gc.collect()
    before, rss_before = _max_rss_mib(), _rss_mib()
    t0 = time.perf_counter()
    done = run_on(backend, _stream, items, concurrency)
    wall = time.perf_counter() - t0
    after, rss_after = _max_rss_mib(), _rss_mib()
    assert done == items, (done, items)
    print(json.dumps({"items": items, "backend": backend, "concurrency": concurrency,
                      "peak_rss_before_mib": before, "peak_rss_after_mib": after,
                      "peak_growth_mib": after - before,
                      "rss_before_mib": rss_before, "rss_after_mib": rss_after, "items_per_s": items / wall}))


_LINE = re.compile(r"import time:\s+(\d+)\s+\|\s+(\d+)\s+\|\s+(\S.*)$")


def import_time_us(module: str, runs: int = 7) -> dict[str, Any]:
    """Median cumulative import time of ``module`` (µs) and what else it pulled in."""
    samples = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"],
                             check=True, capture_output=True, text=True)
        for line in out.stderr.splitlines():
            match = _LINE.match(line)
            if match and match.group(3).strip() == module:
                samples.append(int(match.group(2)))
    probe = subprocess.run(
        [sys.executable, "-c", f"import sys, {module}; print(sorted(m for m in ('httpx2', 'httpx', 'openai', "
                               "'trio', 'pydantic', 'sqlite3', 'hypercorn') if m in sys.modules))"],
        check=True, capture_output=True, text=True)
    return {"module": module, "median_us": statistics.median(samples), "min_us": min(samples),
            "runs": len(samples), "also_imported": probe.stdout.strip()}


if __name__ == "__main__":
    if sys.argv[1] == "memory":
        _memory_child(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
