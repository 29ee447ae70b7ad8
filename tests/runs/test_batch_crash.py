"""Provider-batch runs survive SIGKILL at any step: nothing lost, nothing run twice at the provider.

The harness is ``tests/_runs_batch_child.py`` (its docstring lists the kill
moments and the checks; ``benchmarks/crash_fuzz.py --mode provider-batch`` runs
many more seeded trials). Here a few fixed trials, each on both parent
backends (the parent serves the mock and, in some trials, finishes the run
itself), aim their kills at the moments the batch driver has to survive:
while the source is read, between a reservation and its create, inside a
create that made its batch and one that did not, while batches are open, and
while a finished batch is being collected. Kill delays are seeded; each trial
asserts which moment its first kill interrupted, so a harness that stopped
reaching it fails.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import anyio
import pytest

from trio_batch_llm.testing import serve_mock

from .._runs_batch_child import (
    BatchTrial,
    KillPlan,
    check_final,
    item_prompts,
    moment_tags,
    open_trial_run,
    read_stored,
    run_batch_trial,
    run_child_phase,
)

pytestmark = pytest.mark.anyio

_RNG = random.Random("test_runs_batch_crash")
TRIAL_TIMEOUT = 45.0

# (trial, the moment each kill must have interrupted, or None where the child may have finished first)
TRIALS: dict[str, tuple[BatchTrial, tuple[str | None, ...]]] = {
    "ingesting-then-open": (
        BatchTrial(kills=(KillPlan("entry", count=5), KillPlan("open", 1, _RNG.uniform(0.0, 0.15))),
                   entry_delay=0.02, child_backend="trio", final="child"),
        ("ingesting", None),
    ),
    "reserved-then-collecting": (
        # Every mock request takes 50 ms: the kill at an upload's (a download's) arrival lands inside it.
        BatchTrial(kills=(KillPlan("upload", 1), KillPlan("collect", 1)), latency=0.05,
                   child_backend="asyncio"),
        ("reserved", "collecting"),
    ),
    "inside-a-create-that-made-its-batch": (
        BatchTrial(kills=(KillPlan("create", 2, _RNG.uniform(0.05, 0.3)),),
                   create_faults=("ok", "hang_after_create"), child_backend="trio"),
        ("creating-made",),
    ),
    "inside-a-create-that-made-nothing-then-at-start": (
        BatchTrial(kills=(KillPlan("create", 1, _RNG.uniform(0.05, 0.3)),
                          KillPlan("start", delay=_RNG.uniform(0.9, 1.6))),
                   create_faults=("hang_before_create",), child_backend="asyncio", final="child"),
        ("creating-unmade", None),
    ),
}


@pytest.mark.parametrize("name", list(TRIALS))
async def test_a_killed_batch_run_resumes_to_exactly_once(tmp_path: Path, name: str) -> None:
    trial, moments = TRIALS[name]
    with anyio.fail_after(TRIAL_TIMEOUT):
        report = await run_batch_trial(trial, tmp_path)  # raises BatchCrashError on a broken invariant
    for phase, expected in zip(report.phases, moments, strict=True):
        if expected is not None:
            assert phase.killed and expected in phase.moment, (name, report.phases)
    # The listing shows a batch made by a create left in flight: nobody has to settle it by hand.
    # One that made nothing is settled by the operator, once.
    if name == "inside-a-create-that-made-nothing-then-at-start":
        assert len(report.resolutions) >= 1, report.resolutions
    else:
        assert report.resolutions == [], report.resolutions


async def test_a_create_killed_in_flight_without_a_listing_is_settled_by_the_operator(
    tmp_path: Path, anyio_backend: Any
) -> None:
    """hang_before_create + batch_list=False: only Run.resolve_submission(created=False) can settle it."""
    backend = anyio_backend if isinstance(anyio_backend, str) else anyio_backend[0]
    trial = BatchTrial(kills=(KillPlan("create", 1, _RNG.uniform(0.05, 0.3)),), items=8,
                       create_faults=("hang_before_create",), batch_list=False,
                       child_backend="asyncio" if backend == "trio" else "trio")
    db = tmp_path / "runs.sqlite"
    resolutions: list[str] = []
    with anyio.fail_after(TRIAL_TIMEOUT):
        async with serve_mock(trial.mock_config()) as server:
            assert await run_child_phase(server, db, trial, trial.kills[0], tmp_path, 0, resolutions)
            stored = await anyio.to_thread.run_sync(read_stored, db)
            assert stored is not None and "creating-unmade" in moment_tags(stored, server)
            snap = stored.snapshot
            [creating] = [s for s in stored.live() if s.state == "creating"]
            assert snap.status == "running" and snap.unresolved_submission == creating.submission_id
            assert snap.batched == creating.items and server.statistics().batches_created == 0
            async with await open_trial_run(db, server.base_url, item_prompts(trial.items)) as run:
                settled = await run.resolve_submission(created=False)
                assert settled.unresolved_submission is None and settled.batched == 0
                assert (await run.wait(timeout=30)).status == "completed"
            await check_final(db, server, trial.items)
    assert resolutions == []  # the harness's operator never had to step in: the test did
