"""One run, several drivers: every wait() with lease_seconds drives beside the others.

Against PostgreSQL set RUNS_DB=postgresql://user:password@host/db (the drivers
may then be processes on many machines); without it the run lives in a SQLite
file (one machine).
Here three drivers share one process, as three processes would share the run.
"""

import os
import tempfile
from pathlib import Path

import anyio
import trio

from trio_batch_llm import (
    OpenAICompatibleStrategy,
    ProcessorConfig,
    open_run,
    read_lease_report,
)
from trio_batch_llm.mock import MockServerConfig, serve_mock

PROMPTS = [(f"doc-{i:02d}", f"Summarise document {i}.") for i in range(60)]


async def drive(db: str, strategy: OpenAICompatibleStrategy) -> None:
    async with await open_run(
        db, "nightly", strategy, PROMPTS, config=ProcessorConfig(concurrency=4),
        lease_seconds=30.0,  # a driver silent for 30 s loses its items to the others
    ) as run:
        await run.wait()


async def main() -> None:
    async with serve_mock(MockServerConfig(latency=0.02)) as server:
        strategy = OpenAICompatibleStrategy("any-model", base_url=server.base_url)
        with tempfile.TemporaryDirectory() as tmp:
            db = os.environ.get("RUNS_DB") or str(Path(tmp) / "runs.sqlite")
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(drive, db, strategy)
            report = await anyio.to_thread.run_sync(read_lease_report, db, "nightly")
            done = sum(d.items_done for d in report.drivers)
            drivers = {d.driver_id for d in report.drivers}
            print(f"{done} results from {len(drivers)} drivers; "
                  f"re-executed after a lease expiry: {report.expired_lease_items}")
            print(f"the mock answered {server.stats.requests} requests")


if __name__ == "__main__":
    trio.run(main)
