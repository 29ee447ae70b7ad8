"""The long version of the lease crash test (``tests/runs/test_leases_crash.py``).

    python3 benchmarks/runs_fuzz.py [--items 2000] [--kills 12] [--lease 2.0] [--rounds 3]

Four driver processes on one PostgreSQL run against the mock server: drivers are
killed (kill -9) and restarted, one is frozen past its lease then woken, the server
is restarted once; each round checks exactly one result per item and that every
extra call at the mock went through an expired (or cut-short) lease.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests._servers.postgres import PostgresServer  # noqa: E402
from tests.runs.test_leases_crash import check, fuzz, summary  # noqa: E402


async def _round(server: PostgresServer, url: str, tmp: Path, args: argparse.Namespace, seed: int) -> Any:
    return await fuzz(server, url, tmp, items=args.items, lease=args.lease, kills=args.kills, seed=seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--kills", type=int, default=12)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    server = PostgresServer()
    try:
        for seed in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                url = server.new_database()
                outcome = anyio.run(_round, server, url, Path(tmp), args, seed, backend="trio")
                check(outcome)
                print(f"round {seed}: {summary(outcome)}: ok", flush=True)
    finally:
        server.close()


if __name__ == "__main__":
    main()
