"""Regression tests for issue 16, cases 8, 9 and 12 (named ``test_rel<case>_...``).

8. Several processes create, open and claim one run on one SQLite database at
   once: each waits its turn (bounded by ``busy_timeout``), none sees "database
   is locked"; past the bound the error names the database and the bound.
9. A cost budget fails closed: an invalid cost stops the batch as
   ``budget_exhausted`` naming the value and the item, and every result is kept.
12. Every second of an item's time lands in exactly one timing bucket, and a
   deadline names what set it.

Exact times run on Trio's virtual clock; behaviour on both backends.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import sqlite3
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from trio_batch_llm import (
    ConfigurationError,
    FakeStrategy,
    SqliteArtifactStore,
    SqliteRunRepository,
    process_prompts,
)
from trio_batch_llm._errors import ArtifactStoreError
from trio_batch_llm._runs import open_run

from ._reliability_child import race
from ._runs_child import IDENTITY, CountingStrategy, prompts
from .conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio

virtual = pytest.mark.parametrize("anyio_backend", [pytest.param(trio_virtual_clock(), id="trio-virtual")])


# --- case 8: opening, attaching and claiming wait their turn, with a bound ----------------------


def _hold_write_lock(db: Path) -> sqlite3.Connection:
    """A connection holding the write lock, as a process in its opening transaction (or turning a
    fresh file into a WAL database) does."""
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    return holder


async def _open_and_drive(store: Any) -> Any:
    async with await open_run(store, "r", CountingStrategy(), prompts(2), identity=IDENTITY,
                              poll_interval=0.02) as run:
        return await run.wait(timeout=30)


async def test_rel8_opening_a_fresh_database_waits_while_another_process_creates_it(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    holder = _hold_write_lock(db)  # the file is still in rollback mode: the lock SQLite gave up on at once

    async def release_soon() -> None:
        await anyio.sleep(0.2)
        await anyio.to_thread.run_sync(holder.execute, "COMMIT")

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(release_soon)
            snap = await _open_and_drive(db)
    finally:
        holder.close()
    assert (snap.status, snap.done) == ("completed", 2)


async def test_rel8_opening_an_existing_database_waits_for_a_writer(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    await _open_and_drive(db)
    holder = _hold_write_lock(db)

    async def release_soon() -> None:
        await anyio.sleep(0.2)
        await anyio.to_thread.run_sync(holder.execute, "COMMIT")

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(release_soon)
            snap = await _open_and_drive(db)
    finally:
        holder.close()
    assert (snap.status, snap.done) == ("completed", 2)


async def test_rel8_an_artifact_store_opening_a_fresh_file_waits_too(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    holder = _hold_write_lock(db)

    async def release_soon() -> None:
        await anyio.sleep(0.2)
        await anyio.to_thread.run_sync(holder.execute, "COMMIT")

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(release_soon)
            store = SqliteArtifactStore(db, identity=IDENTITY)
            batch = await process_prompts(FakeStrategy(), ["a", "b"], artifact_store=store)
    finally:
        holder.close()
    assert batch.succeeded == 2


@pytest.mark.parametrize("fresh", [True, False], ids=["fresh-file", "existing-database"])
async def test_rel8_a_lock_held_past_the_bound_fails_naming_the_database_and_the_bound(
    tmp_path: Path, fresh: bool
) -> None:
    db = tmp_path / "runs.db"
    if not fresh:
        await _open_and_drive(db)
    holder = _hold_write_lock(db)
    try:
        began = time.monotonic()
        with pytest.raises(ArtifactStoreError) as info:
            await _open_and_drive(SqliteRunRepository(db, identity=IDENTITY, busy_timeout=0.3))
        waited = time.monotonic() - began
    finally:
        holder.close()
    message = str(info.value)
    assert str(db) in message and "busy_timeout=0.3 s" in message and "locked" in message, message
    assert 0.3 <= waited < 10.0


def test_rel8_a_write_of_an_open_repository_waits_at_most_the_bound(tmp_path: Path) -> None:
    from trio_batch_llm._runs._schema import RunSpec

    db = tmp_path / "runs.db"
    repo = SqliteRunRepository(db, identity=IDENTITY, busy_timeout=0.3)
    repo.open()
    try:
        holder = _hold_write_lock(db)
        try:
            began = time.monotonic()
            with pytest.raises(ArtifactStoreError, match=r"busy_timeout=0\.3 s") as info:
                repo.attach(RunSpec(run_id="r", mode="live", identity=IDENTITY, config={}))
            assert 0.3 <= time.monotonic() - began < 10.0
            assert "opening run 'r'" in str(info.value)
        finally:
            holder.close()
        # The lock is free again: the same repository carries on.
        assert repo.attach(RunSpec(run_id="r", mode="live", identity=IDENTITY, config={})).status == "running"
    finally:
        repo.close()


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "30", True, 10**400],
                         ids=["negative", "nan", "inf", "str", "bool", "huge-int"])
def test_rel8_busy_timeout_is_validated(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        SqliteRunRepository(tmp_path / "runs.db", busy_timeout=bad)
    assert info.value.field == "busy_timeout"
    assert SqliteRunRepository(tmp_path / "runs.db").busy_timeout == 30.0


def test_rel8_six_processes_race_to_create_open_and_claim_one_run(anyio_backend: Any, tmp_path: Path) -> None:
    processes, rounds = 6, 10
    dbs = [str(tmp_path / f"race{i}.db") for i in range(rounds)]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    outs = [tmp_path / f"out{k}.jsonl" for k in range(processes)]
    children = [ctx.Process(target=race, args=(dbs, barrier, anyio_backend, str(out))) for out in outs]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=120)
    assert [child.exitcode for child in children] == [0] * processes
    outcomes = [[json.loads(line) for line in out.read_text().splitlines()] for out in outs]
    errors = [o["error"] for per_child in outcomes for o in per_child if "error" in o]
    assert errors == []
    for i in range(rounds):
        this_round = [per_child[i] for per_child in outcomes]
        assert {(o["status"], o["done"]) for o in this_round} == {("completed", 3)}
        assert sum(o["calls"] for o in this_round) == 3  # one driver at a time: each item called once
