"""Shared helpers for benchmark scripts: timing, medians, tables, JSON output."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(os.environ.get("BENCH_RESULTS_DIR") or Path(__file__).parent / "results")
"""Where results go; smoke runs (``--quick``) point BENCH_RESULTS_DIR elsewhere (see ``quick_results_dir``)."""


def machine() -> dict[str, Any]:
    import os

    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }


def measure(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """Run ``fn`` once; return (wall seconds, process CPU seconds, its result)."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    value = fn()
    return time.perf_counter() - wall0, time.process_time() - cpu0, value


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append(
            "  ".join(
                c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def write_json(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"machine": machine(), "argv": sys.argv, **payload}
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    return path


# --- added for drain.py / throughput.py (issue 9) ------------------------------

BACKENDS = ("trio", "asyncio", "uvloop")
"""Backends our engine runs on here: Trio, asyncio through anyio, and asyncio on uvloop."""


def uvloop_available() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def run_on(backend: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``anyio.run(fn, *args)`` on ``trio``, ``asyncio`` or ``uvloop`` (asyncio with uvloop's loop)."""
    import anyio

    if backend == "uvloop":
        return anyio.run(fn, *args, backend="asyncio", backend_options={"use_uvloop": True})
    return anyio.run(fn, *args, backend=backend)


def run_native_asyncio(fn: Callable[..., Any], *args: Any, uvloop: bool = False) -> Any:
    """Plain ``asyncio.run`` (async-batch-llm is asyncio-only and never touches anyio)."""
    import asyncio

    if uvloop:
        import uvloop as _uvloop

        return _uvloop.run(fn(*args))
    return asyncio.run(fn(*args))


def spread(values: list[float]) -> dict[str, float]:
    """p50 / p95 / max / reps of a sample (``percentile``'s nearest-rank convention)."""
    return {
        "p50": percentile(values, 0.50),
        "p95": percentile(values, 0.95),
        "max": max(values) if values else float("nan"),
        "reps": len(values),
    }


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def results_path(name: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS / name


def quick_results_dir() -> Path:
    """Where smoke runs write, so that they never overwrite the published figures in results/."""
    import tempfile

    return Path(tempfile.gettempdir()) / "trio-batch-llm-bench-quick"


def use_quick_results() -> Path:
    """Send this process's results (and its children's, through the environment) to ``quick_results_dir()``."""
    global RESULTS
    RESULTS = quick_results_dir()
    os.environ["BENCH_RESULTS_DIR"] = str(RESULTS)
    return RESULTS
