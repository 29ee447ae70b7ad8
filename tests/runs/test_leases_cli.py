"""``runs start`` leases by default: a second driver works beside the first, and says so.

Each command runs in a subprocess against the mock server served in this
process (as in ``test_cli_runs.py``). The first driver has one call at a
time and its first call never answers (``[[hangx1]]``), so whatever else gets
done is the second driver's work, with no timing involved. Then the first is
stopped (SIGTERM: its calls in flight abandoned, its items back to the pool),
and the second finishes the run. ``--lease-seconds 0`` keeps the one driver
and its watchers.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import anyio.to_thread
import pytest

from trio_batch_llm._runs import read_run_snapshot
from trio_batch_llm.testing import MockServerConfig, serve_mock

from ..cli.test_cli import MODEL, WAIT, spawn
from ..cli.test_runs import RUN, cli, exported, start_args, status, write_items
from ..cli.test_runs import assert_exactly_once as exactly_once

pytestmark = pytest.mark.anyio

ITEMS = 60


def _done_at_least(db: Path, count: int) -> int:
    deadline = time.monotonic() + WAIT
    while (done := read_run_snapshot(db, RUN).done) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return done


async def test_a_second_start_without_flags_works_beside_the_first_and_both_say_how_many_work(
    anyio_backend: str, tmp_path: Path
) -> None:
    db, source = tmp_path / "runs.sqlite", tmp_path / "in.jsonl"
    ids = write_items(source, ["first [[hangx1]]"] + [f"prompt {n}" for n in range(1, ITEMS)])
    async with serve_mock(MockServerConfig(model=MODEL)) as server:
        async with spawn(*start_args(server, db, source, anyio_backend, "--concurrency", "1")) as first:
            await server.wait_for(lambda stats: stats.hangs == 1)
            await first.wait_for_text(f"1 driver working on run {RUN}")
            async with spawn(*start_args(server, db, source, anyio_backend, "--concurrency", "4")) as second:
                await second.wait_for_text(f"joined run {RUN}: 2 drivers working on it")
                # The first driver's only call hangs: whatever gets done is the second's work.
                assert await anyio.to_thread.run_sync(_done_at_least, db, 10) >= 10
                await first.wait_for_text(f"2 drivers working on run {RUN}")
                first.send_signal(signal.SIGTERM)
            assert second.returncode == 0, second.output
            assert f"run {RUN}: completed" in second.output
        assert first.returncode == 128 + signal.SIGTERM, first.output
        snap = await status(db)
        assert (snap["status"], snap["done"]) == ("completed", ITEMS)
        assert {d["state"] for d in snap["drivers"]} == {"stopped"}  # each gave its leases back
        done_by: dict[str, int] = {}  # by driver (one per process; a driver takes a lease per drive)
        for d in snap["drivers"]:  # oldest lease first
            done_by[d["driver_id"]] = done_by.get(d["driver_id"], 0) + d["items_done"]
        assert list(done_by.values()) == [0, ITEMS]  # the first one's only call never answered
        # The hanging call was abandoned and made again: one request beyond one per item, counted.
        assert server.stats.requests == ITEMS + 1
        assert snap["reexecuted_after_lease_expiry"] == 1
    exactly_once(await exported(db, tmp_path / "out.jsonl", anyio_backend), ids)


async def test_lease_seconds_0_keeps_one_driver_and_a_watcher(anyio_backend: str, tmp_path: Path) -> None:
    db, source = tmp_path / "runs.sqlite", tmp_path / "in.jsonl"
    write_items(source, ["first [[hangx1]]"] + [f"prompt {n}" for n in range(1, 6)])
    async with serve_mock(MockServerConfig(model=MODEL)) as server:
        args = start_args(server, db, source, anyio_backend, "--concurrency", "1", "--lease-seconds", "0")
        async with spawn(*args) as first:
            await server.wait_for(lambda stats: stats.hangs == 1)
            code, out, err = await cli(*args, "--timeout", "0.5")
            assert code == 3, out + err  # it watched: nothing of its own got done
            assert "joined" not in err and "drivers working" not in err
            assert server.stats.requests == 1
            first.send_signal(signal.SIGTERM)
        assert first.returncode == 128 + signal.SIGTERM, first.output
        snap = await status(db)
        assert snap["drivers"] == [] and snap["done"] == 0


async def test_lease_seconds_is_refused_in_provider_batch_mode(anyio_backend: str, tmp_path: Path) -> None:
    db, source = tmp_path / "runs.sqlite", tmp_path / "in.jsonl"
    write_items(source, ["a"])
    async with serve_mock(MockServerConfig(model=MODEL)) as server:
        code, out, err = await cli(*start_args(server, db, source, anyio_backend, "--mode", "provider-batch",
                                               "--lease-seconds", "30"))
    assert code == 2 and "--lease-seconds is not used with --mode provider-batch" in err, out + err
