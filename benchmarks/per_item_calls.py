"""Python calls per item, grouped by the module of the function called: where the engine's per-item cost goes.

    python benchmarks/per_item_calls.py [--items 2000] [--backends trio,asyncio]

Counts ``sys.setprofile`` call events (coroutine resumptions included) over one batch of
``--items`` zero-latency calls on 100 workers, after a warm-up batch, for the bare anyio
pool, ``process_all`` and ``process_prompts`` of ``overhead.py``. Machine load does not
change these counts, so two versions can be compared on a busy machine. Rows under half a
call per item are left out of the table (the totals include them).
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from overhead import bare_pool, ours_process_all, ours_process_prompts

Batch = Callable[[int, int, float], Awaitable[Any]]


def group(filename: str) -> str:
    """``ours: <folder>/<module>`` for the library's own code, else the library the frame belongs to."""
    if "trio_batch_llm/" in filename:
        return "ours: " + filename.split("trio_batch_llm/")[-1].removesuffix(".py")
    for lib in ("anyio", "trio", "asyncio", "sniffio", "outcome"):
        if f"/{lib}/" in filename:
            return lib
    return "other"


def count(backend: str, batch: Batch, items: int) -> dict[str, float]:
    counts: collections.Counter[str] = collections.Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            counts[group(frame.f_code.co_filename)] += 1

    async def main() -> None:
        await batch(200, 100, 0.0)  # warm-up: imports, caches
        sys.setprofile(profile)
        try:
            await batch(items, 100, 0.0)
        finally:
            sys.setprofile(None)

    anyio.run(main, backend=backend)
    return {where: calls / items for where, calls in counts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--backends", default="trio,asyncio")
    args = parser.parse_args()
    surfaces: dict[str, Batch] = {
        "bare pool": lambda n, w, latency: bare_pool(n, w, latency, yield_each=False),
        "process_all": ours_process_all,
        "process_prompts": ours_process_prompts,
    }
    for backend in args.backends.split(","):
        per_item = {name: count(backend, batch, args.items) for name, batch in surfaces.items()}
        rows = sorted({k for r in per_item.values() for k in r}, key=lambda k: -per_item["process_all"].get(k, 0))
        print(f"\n{backend}: Python calls per item\n| where | " + " | ".join(per_item) + " |\n|---|---|---|---|")
        for where in rows:
            values = [r.get(where, 0.0) for r in per_item.values()]
            if max(values) >= 0.5:
                print(f"| {where} | " + " | ".join(f"{v:.1f}" for v in values) + " |")
        print("| **total** | " + " | ".join(f"**{sum(r.values()):.1f}**" for r in per_item.values()) + " |")


if __name__ == "__main__":
    main()
