"""Crash and resume: SIGKILL a real child mid-run, resume, and check that nothing was lost.

Each test runs ``TRIALS`` trials of tests/_crash_child.py (see its docstring
for the invariants) on one store, with the parent (the resume) on the
module's backend and the child alternating trio and asyncio. Both parent
backends together give each store ``2 * TRIALS`` = 20 trials of a 2,000-item
run. Kill moments are seeded and spread over the run: two during start-up,
the others after a stratified share of the results, some trials killing the
resumed child a second time. benchmarks/crash_fuzz.py runs many more.

This module uses real time on purpose: the child is a real process.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from .._crash_child import KillPlan, TrialReport, kill_plans, run_trial

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX"),
]

TRIALS = 10
ITEMS = 2000
CONCURRENCY = 32


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
async def test_sigkill_at_random_moments_loses_nothing(kind: str, anyio_backend: str, tmp_path: Path) -> None:
    rng = random.Random(f"crash-resume/{kind}/{anyio_backend}")
    reports: list[TrialReport] = []
    for trial in range(TRIALS):
        plans = kill_plans(trial, TRIALS, rng, items=ITEMS, second_kill=trial % 5 == 4)
        reports.append(
            await run_trial(
                kind,
                _fresh_dir(tmp_path / f"trial-{trial}"),
                kills=plans,
                child_backend="trio" if trial % 2 == 0 else "asyncio",
                items=ITEMS,
                concurrency=CONCURRENCY,
                seed=rng.randrange(2**32),
            )
        )
    # The trials must actually have interrupted runs part-way, or they tested nothing.
    mid_run = [r for r in reports if r.killed_mid_run]
    assert len(mid_run) >= TRIALS // 2, [r.phases for r in reports]
    assert any(len(r.phases) == 2 and r.phases[1].killed for r in reports)


async def test_a_kill_before_anything_is_stored_resumes_from_scratch(tmp_path: Path) -> None:
    """SIGKILL during the child's start-up (import, store creation): the resume runs all items."""
    report = await run_trial(
        "sqlite", tmp_path, kills=[KillPlan(delay=0.0)], items=50, concurrency=8, seed=7
    )
    assert report.phases[0].killed
    assert (report.stored_successes_before_final, report.final_executed) == (0, 50)


def _fresh_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path
