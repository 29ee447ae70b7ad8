"""Discovery behind random refusals, over many seeds: how often the pace falls short of a true limit.

    python benchmarks/discovery_sweep.py [--seeds 0:64] [--shares 0,0.02,0.05] [--limits 600,1200]

The suite checks eight fixed seeds (tests/admission/test_discovery_refusals.py); this
sweeps as many as you like on the same simulated provider (a sliding-window
limit behind a gateway refusing ``share`` of all calls at random, no headers,
32 workers, 0.5 s a call, six simulated minutes on the pure quota core: exact
times, no event loop) and lists every case that misses the suite's bar: from
the third minute on, at least 0.85 of the limit served a minute, and the
limit's own 429s at most 5 % (15 % behind random refusals) of what was served.
Writes benchmarks/results/discovery_sweep.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests._pacing_sim import refused_between, served_between, simulate  # noqa: E402
from tests.admission.test_discovery_refusals import NO_RAMP, NoisyProvider  # noqa: E402

from _common import table, write_json  # noqa: E402


def _floats(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0:64", help="START:STOP (default 0:64)")
    parser.add_argument("--shares", default="0,0.02,0.05")
    parser.add_argument("--limits", default="600,1200")
    args = parser.parse_args()
    start, stop = (int(x) for x in args.seeds.split(":"))
    rows, misses = [], []
    for share in _floats(args.shares):
        for limit in (int(x) for x in _floats(args.limits)):
            ratios = []
            for seed in range(start, stop):
                provider = NoisyProvider(limit=limit, headers=False, share=share, seed=seed)
                simulate(provider, workers=32, latency=0.5, stop=360.0, config=NO_RAMP)
                served = served_between(provider, 120.0, 360.0) / 4.0
                refused = refused_between(provider, 120.0, 360.0)
                ratios.append(served / limit)
                if served < 0.85 * limit or refused > (0.05 if share == 0 else 0.15) * served * 4.0:
                    misses.append({"share": share, "limit": limit, "seed": seed,
                                   "served_per_minute": served, "limit_429s": refused})
            rows.append([share, limit, stop - start, sum(1 for m in misses
                                                      if m["share"] == share and m["limit"] == limit),
                         min(ratios), sorted(ratios)[len(ratios) // 2]])
    print(table(["share", "limit", "seeds", "missed", "worst served/limit", "median"], rows))
    for miss in misses:
        print(miss)
    print(write_json("discovery_sweep", {"rows": rows, "misses": misses}))


if __name__ == "__main__":
    main()
