"""Scale beyond one process (issue 20), runs part: one run driven by 1, 2 and 4 processes, and
PostgreSQL vs SQLite record throughput.

    python3 benchmarks/scale.py [--items N] [--latency S] [--concurrency C] [--out PATH]

* ``drivers``: items/s of one live run (``lease_seconds=30``) driven by 1, 2 and 4 driver
  processes (``tests/_lease_child.py``, concurrency ``--concurrency`` each) against the mock
  server in its own process, on PostgreSQL and on SQLite. Two figures: the *whole run*, from
  the first process started to the last one exited (Python start-up and connecting
  included), and the *steady* rate, between 10 % and 90 % of the items recorded, read off the
  repository every 20 ms by this process. The machine's cores are printed: with 2 cores, four
  Python drivers plus the mock share them.
* ``record``: results recorded per second by one repository, groups of 256 (the driver's
  group size), each group one transaction.

The PostgreSQL server is started as the tests start it (``tests/_servers/postgres.py``).
The Redis part of issue 20 (admission cost per call, items/s through a shared quota) is
``benchmarks/quota_redis.py``. Results go to ``results/scale.json``.
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

from trio_batch_llm import ArtifactIdentity, RunStateError  # noqa: E402
from trio_batch_llm._runs._schema import NewItem, NewResult, RunSpec, SourceCheckpoint  # noqa: E402
from trio_batch_llm._runs.repository._locate import repository_at  # noqa: E402

CHILD = ROOT / "tests" / "_lease_child.py"


def drivers_items_per_second(store: str, drivers: int, items: int, base_url: str, tmp: Path,
                             concurrency: int) -> dict[str, float]:
    """Items/s of one run of ``items`` driven by ``drivers`` processes: whole run and steady."""
    source = tmp / f"in-{drivers}.jsonl"
    source.write_text("".join(json.dumps({"id": f"i{n}", "prompt": f"prompt {n}"}) + "\n"
                              for n in range(items)), encoding="utf-8")
    run_id = f"scale-{drivers}-{time.time_ns()}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LEASE_CHILD_CONCURRENCY": str(concurrency)}
    watcher = repository_at(store)
    watcher.open()
    try:
        start = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, str(CHILD), store, run_id, str(source), base_url, "30"],
                                  env=env, stdout=subprocess.DEVNULL) for _ in range(drivers)]
        marks: dict[float, float] = {}
        while any(p.poll() is None for p in procs):
            try:
                done = watcher.snapshot(run_id).done
            except RunStateError:  # not attached yet
                done = 0
            now = time.perf_counter()
            for share in (0.1, 0.9):
                if share not in marks and done >= share * items:
                    marks[share] = now
            time.sleep(0.02)
        elapsed = time.perf_counter() - start
        codes = [p.wait(timeout=600) for p in procs]
    finally:
        watcher.close()
    if codes != [0] * drivers:
        raise RuntimeError(f"drivers exited {codes}")
    steady = 0.8 * items / (marks[0.9] - marks[0.1]) if len(marks) == 2 and marks[0.9] > marks[0.1] else 0.0
    return {"whole": items / elapsed, "steady": steady}


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
    parser.add_argument("--concurrency", type=int, default=4, help="of each driver")
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "scale.json"))
    args = parser.parse_args()
    server = PostgresServer()
    figures: dict[str, Any] = {"cores": os.cpu_count(), "items": args.items, "latency": args.latency,
                               "concurrency": args.concurrency}
    try:
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            stores = {"postgresql": server.new_database(), "sqlite": str(tmp / "runs.sqlite")}
            figures["record_per_s"] = {name: record_throughput(store, args.records) for name, store in stores.items()}
            with MockServerProcess(config={"latency": args.latency}) as mock:
                figures["drivers_items_per_s"] = {
                    name: {n: drivers_items_per_second(store, n, args.items, mock.base_url, tmp, args.concurrency)
                           for n in (1, 2, 4)}
                    for name, store in stores.items()
                }
    finally:
        server.close()
    ceiling = args.concurrency / args.latency
    print(f"cores: {figures['cores']}; {args.items} items, mock latency {args.latency} s, concurrency"
          f" {args.concurrency} per driver (at most {ceiling:.0f} items/s per driver)")
    print(f"{'store':<12}" + "".join(f"{f'{n} driver(s)':>22}" for n in (1, 2, 4)) + f"{'record/s':>12}")
    print(f"{'':<12}" + f"{'steady / whole run':>22}" * 3)
    for name, by_n in figures["drivers_items_per_s"].items():
        print(f"{name:<12}" + "".join(f"{by_n[n]['steady']:>13.1f} / {by_n[n]['whole']:>6.1f}" for n in (1, 2, 4))
              + f"{figures['record_per_s'][name]:>12.0f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2), encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
