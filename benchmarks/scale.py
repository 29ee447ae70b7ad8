"""Scale beyond one process (issue 20), runs part: one run driven by 1, 2 and 4 processes, and
PostgreSQL vs SQLite record throughput.

    python3 benchmarks/scale.py [--items N] [--latency S] [--out scale.json]

* ``drivers``: items/s of one live run (``lease_seconds=30``) driven by 1, 2 and 4 driver
  processes (``tests/_lease_child.py``) against the mock server in its own process, on
  PostgreSQL and on SQLite. The machine's cores are printed: with 2 cores, four Python
  drivers plus the mock share them, so items/s stops growing at the cores, not at the lease
  machinery.
* ``record``: results recorded per second by one repository, groups of 256 (the driver's
  group size), each group one transaction.

The PostgreSQL server is started as the tests start it (``tests/_servers/postgres.py``).
The Redis part of issue 20 goes beside these functions (``shared quota admission``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._mock_process import MockServerProcess  # noqa: E402
from tests._servers.postgres import PostgresServer  # noqa: E402

from trio_batch_llm import ArtifactIdentity  # noqa: E402
from trio_batch_llm._runs._schema import NewItem, NewResult, RunSpec, SourceCheckpoint  # noqa: E402
from trio_batch_llm._runs.repository._locate import repository_at  # noqa: E402

CHILD = ROOT / "tests" / "_lease_child.py"


def drivers_items_per_second(store: str, drivers: int, items: int, base_url: str, tmp: Path) -> float:
    """Items/s of one run of ``items`` driven by ``drivers`` processes, from first start to last exit."""
    source = tmp / f"in-{drivers}.jsonl"
    source.write_text("".join(json.dumps({"id": f"i{n}", "prompt": f"prompt {n}"}) + "\n"
                              for n in range(items)), encoding="utf-8")
    run_id = f"scale-{drivers}-{time.time_ns()}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, str(CHILD), store, run_id, str(source), base_url, "30"],
                              env=env, stdout=subprocess.DEVNULL) for _ in range(drivers)]
    codes = [p.wait(timeout=600) for p in procs]
    elapsed = time.perf_counter() - start
    if codes != [0] * drivers:
        raise RuntimeError(f"drivers exited {codes}")
    return items / elapsed


def record_throughput(store: str, results: int) -> float:
    """Results/s recorded by one repository in groups of 256, one transaction each."""
    repo = repository_at(store)
    repo.open()
    try:
        run_id = f"record-{time.time_ns()}"
        repo.attach(RunSpec(run_id, "live", ArtifactIdentity("bench", "record"), {}))
        repo.ingest(run_id, [NewItem(f"i{n}", "p", None, "f") for n in range(results)],
                    SourceCheckpoint(results, exhausted=True))
        start = time.perf_counter()
        for base in range(0, results, 256):
            repo.record(run_id, [NewResult(f"i{n}", True, None, '{"output": "x"}', 3, 2, 5)
                                 for n in range(base, min(base + 256, results))])
        return results / (time.perf_counter() - start)
    finally:
        repo.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--out", default="scale.json")
    args = parser.parse_args()
    server = PostgresServer()
    figures: dict[str, Any] = {"cores": os.cpu_count(), "items": args.items, "latency": args.latency}
    try:
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            stores = {"postgresql": server.new_database(), "sqlite": str(tmp / "runs.sqlite")}
            figures["record_per_s"] = {name: record_throughput(store, args.records) for name, store in stores.items()}
            with MockServerProcess(config={"latency": args.latency}) as mock:
                figures["drivers_items_per_s"] = {
                    name: {n: drivers_items_per_second(store, n, args.items, mock.base_url, tmp) for n in (1, 2, 4)}
                    for name, store in stores.items()
                }
    finally:
        server.close()
    print(f"cores: {figures['cores']}; {args.items} items, mock latency {args.latency} s, concurrency 4 per driver")
    print(f"{'store':<12}{'1 driver':>12}{'2 drivers':>12}{'4 drivers':>12}{'record/s':>12}")
    for name, by_n in figures["drivers_items_per_s"].items():
        print(f"{name:<12}" + "".join(f"{by_n[n]:>12.1f}" for n in (1, 2, 4))
              + f"{figures['record_per_s'][name]:>12.0f}")
    Path(args.out).write_text(json.dumps(figures, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
