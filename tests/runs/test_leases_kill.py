"""Leases: ``kill -9`` of a driver mid-call, on SQLite and PostgreSQL; the repeated calls are counted exactly.

The first driver is a process (``tests/_lease_child.py``) whose two calls in
flight never answer (``[[hangx1]]``: only their first occurrence hangs); it is
killed with SIGKILL while it holds those two calls and many more leased items.
A driver in this process then waits out its lease (1 s), and finishes the
run under a lease of its own. The mock server counts every request: the run's
``reexecuted_after_lease_expiry`` must equal the calls it got twice.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

import trio_batch_llm
from trio_batch_llm import ProcessorConfig
from trio_batch_llm._cli._render import status_json
from trio_batch_llm._runs import iter_run_results, open_run, read_run_snapshot
from trio_batch_llm._runs._reader import read_lease_report
from trio_batch_llm._strategies.openai._compatible import OpenAICompatibleStrategy
from trio_batch_llm.testing import MockServerConfig, serve_mock

from .._paths import ROOT, TESTS

pytestmark = pytest.mark.anyio

CHILD = str(TESTS.joinpath("_lease_child.py"))
RUN = "killed"
ITEMS = 30
LEASE = 1.0


@pytest.fixture(scope="module", params=[pytest.param("trio", id="trio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    # The killed driver is a process of its own; this process's loop is immaterial (one is enough).
    return request.param


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        url: str = request.getfixturevalue("postgres_url")
        return url
    return str(tmp_path / "runs.sqlite")


@pytest.mark.timeout(120)
async def test_a_driver_killed_mid_call_counts_exactly_the_calls_made_again(
    store: str, tmp_path: Path
) -> None:
    source = tmp_path / "in.jsonl"
    hanging = {0, 1}  # the killed driver's two calls in flight (concurrency 2, ingestion order)
    source.write_text("".join(
        json.dumps({"id": f"i{n}", "prompt": f"prompt {n}" + (" [[hangx1]]" if n in hanging else "")}) + "\n"
        for n in range(ITEMS)), encoding="utf-8")
    library = Path(trio_batch_llm.__file__).parent.parent
    env = {**os.environ, "LEASE_CHILD_CONCURRENCY": "2",
           "PYTHONPATH": os.pathsep.join([str(library), str(ROOT)])}
    async with serve_mock(MockServerConfig(model="mock-model")) as mock:
        child = await anyio.open_process(
            [sys.executable, CHILD, store, RUN, str(source), mock.base_url, str(LEASE), "asyncio"], env=env,
            stdout=None, stderr=None)
        try:
            with anyio.fail_after(60):
                await mock.wait_for(lambda stats: stats.hangs == 2)
        finally:
            child.kill()
            await child.wait()
        assert read_lease_report(store, RUN).leased > len(hanging)  # it held more than it started
        strategy = OpenAICompatibleStrategy("mock-model", base_url=mock.base_url, api_key="sk-test")
        # Its own lease is long: however loaded the machine, only the killed driver's expires.
        async with await open_run(store, RUN, strategy, source, lease_seconds=30.0,
                                  config=ProcessorConfig(concurrency=4), poll_interval=0.05) as run:
            snap = await run.wait(timeout=60)
        calls = Counter(r.prompt for r in mock.requests if r.prompt is not None)
    assert (snap.status, snap.done) == ("completed", ITEMS)
    assert Counter(r.item_id for r in iter_run_results(store, RUN)) == Counter(f"i{n}" for n in range(ITEMS))
    assert len(calls) == ITEMS
    again = sum(count - 1 for count in calls.values())
    assert again == len(hanging), calls  # the two calls in flight at the kill, made again
    report = status_json(read_run_snapshot(store, RUN), read_lease_report(store, RUN))
    assert report["reexecuted_after_lease_expiry"] == again
    states = [d["state"] for d in report["drivers"]]  # the killed driver's lease, then the other's
    assert states[0] == "expired" and set(states[1:]) == {"stopped"}, states
