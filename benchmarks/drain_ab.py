"""One in-process drain row, two or more library trees, alternating subprocesses: a quick A/B.

    python benchmarks/drain_ab.py ROUNDS SAMPLES STOP BACKEND NAME=SRC_DIR NAME=SRC_DIR [NAME=SRC_DIR ...] [N=1000]

STOP is cancel, graceful or deadline; BACKEND trio, asyncio or uvloop. Each round runs
one subprocess per side (order reversed every other round), with ``PYTHONPATH`` set to
that side's ``src`` and this checkout's ``_drain_inproc`` for both, so only the library
differs. Each subprocess runs one untimed (floor, ours) pair, then takes SAMPLES pairs at
N calls in flight (1,000 unless an ``N=`` argument says). Prints each side's p50 of ours
and of the floor, their ratio, and ours against the floor pooled over every side (the
floor is the same code on all of them, so its difference between sides is noise).

Each process draws its own hash seed and memory layout, which moves a small-N drain by
tens of per cent: an A/A of one tree against itself at N = 10 differed by 43 % with 4
processes a side, by 2-7 % with 20. Use many ROUNDS and few SAMPLES. ``compare_commits.py``
is the full A/B (every row, HTTP and throughput too); this is the one to iterate with.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import sys, json
sys.path.insert(0, sys.argv[4])
import anyio, _drain_inproc as d
stop, backend, samples, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[5])
def one(fn, *a):
    if backend == "uvloop":
        return anyio.run(fn, *a, backend="asyncio", backend_options={"use_uvloop": True})["ms"]
    return anyio.run(fn, *a, backend=backend)["ms"]
pairs = {"cancel": ((d.floor_cancel,), (d.ours_cancel,)),
         "graceful": ((d.floor_graceful, 0.05), (d.ours_graceful, 0.05)),
         "deadline": ((d.floor_deadline, 0.3), (d.ours_deadline, 0.3))}
(floor, *fa), (ours, *oa) = pairs[stop]
one(floor, n, *fa), one(ours, n, *oa)  # warm-up, not kept: first-use costs (lazy imports, caches)
out = {"floor": [], "ours": []}
for _ in range(samples):
    out["floor"].append(one(floor, n, *fa))
    out["ours"].append(one(ours, n, *oa))
print(json.dumps(out))
"""


def main(argv: list[str]) -> None:
    rounds, samples, stop, backend, *side_args = argv
    sides = dict(arg.split("=", 1) for arg in side_args)
    n = sides.pop("N", "1000")
    pooled: dict[str, dict[str, list[float]]] = {side: {"floor": [], "ours": []} for side in sides}
    for index in range(int(rounds)):
        for side in list(sides) if index % 2 == 0 else list(reversed(sides)):
            env = {**os.environ, "PYTHONPATH": sides[side]}
            done = subprocess.run([sys.executable, "-c", CHILD, stop, backend, samples, str(HERE), n], env=env,
                                  capture_output=True, text=True, check=True)
            for kind, values in json.loads(done.stdout.strip().splitlines()[-1]).items():
                pooled[side][kind] += values
    all_floors = statistics.median([ms for got in pooled.values() for ms in got["floor"]])
    for side, got in pooled.items():
        ours, floor = statistics.median(got["ours"]), statistics.median(got["floor"])
        print(f"{side:8} ours p50 {ours:7.3f} ms  floor p50 {floor:7.3f} ms  ratio {ours / floor:.3f}"
              f"  to both floors {ours / all_floors:.3f}  samples {len(got['ours'])}")


if __name__ == "__main__":
    main(sys.argv[1:])
