"""The process side of ``test_rel8_...``: several processes race to create, open and claim one run.

:func:`race` is a ``multiprocessing`` target (spawned, so it imports this module
afresh): for each database in turn it waits at the shared barrier, then opens
(creating it if it is first) the run ``race`` there with three prompts and
drives or watches it until it is terminal. It writes one JSON line per
database to ``out``: ``{"status": ...}`` or ``{"error": "..."}``.
"""

from __future__ import annotations

import json
from typing import Any

import anyio

from ._runs_child import IDENTITY, CountingStrategy, prompts


async def _one(db: str, barrier: Any) -> dict[str, Any]:
    from trio_batch_llm._runs import open_run

    strategy = CountingStrategy()
    # Released together as close to the first SQLite call as a process can get.
    await anyio.to_thread.run_sync(barrier.wait, 60)
    async with await open_run(db, "race", strategy, prompts(3), identity=IDENTITY, poll_interval=0.02) as run:
        snap = await run.wait(timeout=60)
    return {"status": snap.status, "done": snap.done, "calls": strategy.total}


def race(dbs: list[str], barrier: Any, backend: str, out: str) -> None:
    with open(out, "w", encoding="utf-8") as f:
        for db in dbs:
            try:
                outcome = anyio.run(_one, db, barrier, backend=backend)
            except Exception as exc:
                outcome = {"error": f"{type(exc).__name__}: {exc}"}
            f.write(json.dumps(outcome) + "\n")
            f.flush()
