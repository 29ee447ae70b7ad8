"""A driver process for the lease crash tests: drives one shared run until it is terminal.

    python tests/_lease_child.py URL RUN_ID INPUT.jsonl BASE_URL LEASE_SECONDS [BACKEND]

Opens the run with ``lease_seconds`` (many drivers at once) against the mock
server at BASE_URL, and calls ``wait()`` again whenever the database is
unreachable (a server restart) -- the documented way to ride one out. Prints
the final status; exits 0 when the run is terminal.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio

from trio_batch_llm import ArtifactStoreError, ProcessorConfig
from trio_batch_llm._runs import open_run
from trio_batch_llm._strategies.openai._compatible import OpenAICompatibleStrategy

CONCURRENCY = int(os.environ.get("LEASE_CHILD_CONCURRENCY", "4"))  # benchmarks/scale.py sets it


async def main(url: str, run_id: str, source: str, base_url: str, lease: float) -> None:
    strategy = OpenAICompatibleStrategy("mock-model", base_url=base_url, api_key="sk-test")
    with anyio.fail_after(120):
        while True:
            try:
                async with await open_run(url, run_id, strategy, Path(source), lease_seconds=lease,
                                          config=ProcessorConfig(concurrency=CONCURRENCY), poll_interval=0.05,
                                          slice_items=50) as run:
                    snap = await run.wait()
                    print(snap.status, flush=True)
                    return
            except ArtifactStoreError as exc:
                print(f"database unreachable, again: {exc}", file=sys.stderr, flush=True)
                await anyio.sleep(0.2)


if __name__ == "__main__":
    url, run_id, source, base_url, lease = sys.argv[1:6]
    backend = sys.argv[6] if len(sys.argv) > 6 else "trio"
    anyio.run(main, url, run_id, source, base_url, float(lease), backend=backend)
