"""Durable runs across processes: a pause resumed by a new process, and SIGKILLs.

The child is ``tests/_runs_child.py``. A SIGKILL is sent by the child to
itself at a chosen point (when asked for an input entry, or at a call), which
is a real SIGKILL at a reproducible moment. The evidence of what a child ran is
its calls log (one ``os.write`` per call on an ``O_APPEND`` descriptor, kept
by the kernel through the kill) and the database it leaves behind. After a
kill the parent reopens the run with a fresh source and checks that nothing is
lost or repeated: every item has exactly one result, items recorded before the
kill are never run again, and the others run exactly once.
"""

from __future__ import annotations

import json
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

from trio_batch_llm import ProcessorConfig
from trio_batch_llm._runs import iter_run_results, open_run, read_run_snapshot

from .._paths import TESTS
from .._runs_child import IDENTITY, CountingStrategy, prompts

pytestmark = pytest.mark.anyio

CHILD = TESTS.joinpath("_runs_child.py")
ITEMS = 20


async def _child(*args: object) -> Any:
    command = [sys.executable, str(CHILD), *map(str, args)]
    with anyio.fail_after(60):
        return await anyio.run_process(command, check=False)


def _prompt(item_id: str) -> str:
    return "p" + item_id.removeprefix("item-")


def _stored(db: Path) -> Counter[str]:
    return Counter(r.item_id for r in iter_run_results(db, "run"))


async def _finish_in_this_process(db: Path, source: Any) -> tuple[Any, CountingStrategy]:
    strategy = CountingStrategy()
    async with await open_run(
        db, "run", strategy, source, config=ProcessorConfig(concurrency=4), identity=IDENTITY, slice_items=5
    ) as run:
        snap = await run.wait(timeout=60)
    return snap, strategy


def _assert_each_item_once(db: Path) -> None:
    results = list(iter_run_results(db, "run"))
    assert [r.sequence for r in results] == list(range(1, ITEMS + 1))
    assert Counter(r.item_id for r in results) == Counter(f"item-{i}" for i in range(ITEMS))
    assert all(r.result.success and r.result.output == "out: " + _prompt(r.item_id) for r in results)


async def test_pause_then_resume_in_a_new_process_is_exactly_once(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    strategy = CountingStrategy(latency=0.001, signal_at_call=6)
    async with await open_run(
        db, "run", strategy, prompts(ITEMS), config=ProcessorConfig(concurrency=4), identity=IDENTITY,
        slice_items=5,
    ) as run, anyio.create_task_group() as tg:
        tg.start_soon(run.wait)
        await strategy.reached.wait()
        paused = await run.pause()
        tg.cancel_scope.cancel()
    assert paused.status == "paused" and strategy.total == paused.done < ITEMS
    child = await _child("--db", db, "--run-id", "run", "--items", ITEMS, "--resume")
    assert child.returncode == 0, child.stderr.decode()
    outcome = json.loads(child.stdout)
    assert outcome["status"] == "completed"
    assert strategy.calls + Counter(outcome["calls"]) == Counter(prompts(ITEMS))
    _assert_each_item_once(db)


# (entry whose read kills the child, seconds between entries, child backend): a fast sync
# source is read ahead of processing; a slow async one lets results be recorded meanwhile.
TRIALS = [(3, 0.0, "trio"), (6, 0.0, "asyncio"), (8, 0.01, "trio"), (17, 0.01, "asyncio")]


@pytest.mark.parametrize(("kill_at_entry", "delay", "backend"), TRIALS)
async def test_sigkill_between_ingestion_slices_loses_and_repeats_nothing(
    tmp_path: Path, kill_at_entry: int, delay: float, backend: str
) -> None:
    db, log = tmp_path / "runs.sqlite", tmp_path / "calls.log"
    child = await _child("--db", db, "--run-id", "run", "--items", ITEMS, "--kill-at-entry", kill_at_entry,
                         "--entry-delay", delay, "--calls-log", log, "--slice-items", 5, "--backend", backend)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    before = await anyio.to_thread.run_sync(read_run_snapshot, db, "run")
    stored = await anyio.to_thread.run_sync(_stored, db)
    # The process died holding the run: it is still "running", ingested a prefix of the input
    # (never the entry it died reading), and every stored result comes from a call it made.
    assert before.status == "running" and not before.ingestion_complete
    assert before.items == before.checkpoint.position <= kill_at_entry
    assert before.checkpoint.last_item_id == (f"item-{before.items - 1}" if before.items else None)
    assert before.done == sum(stored.values()) == len(stored)
    child_calls = Counter((tmp_path / "calls.log").read_text().split()) if log.exists() else Counter()
    assert {_prompt(item_id) for item_id in stored} <= set(child_calls)

    snap, strategy = await _finish_in_this_process(db, prompts(ITEMS))
    assert snap.status == "completed" and snap.items == ITEMS
    assert strategy.calls == Counter(set(prompts(ITEMS)) - {_prompt(i) for i in stored})
    _assert_each_item_once(db)


@pytest.mark.parametrize("kill_at_call", [4, 11])
async def test_sigkill_while_processing_a_jsonl_source_resumes_from_its_cursor(
    tmp_path: Path, kill_at_call: int
) -> None:
    db, log, source = tmp_path / "runs.sqlite", tmp_path / "calls.log", tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(p) + "\n" for p in prompts(ITEMS)), encoding="utf-8")
    child = await _child("--db", db, "--run-id", "run", "--items", ITEMS, "--jsonl", source,
                         "--kill-at-call", kill_at_call, "--calls-log", log, "--slice-items", 5)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    assert sum(Counter(log.read_text().split()).values()) == kill_at_call
    stored = await anyio.to_thread.run_sync(_stored, db)
    assert len(stored) < kill_at_call  # the killing call's result was never recorded

    snap, strategy = await _finish_in_this_process(db, source)
    assert snap.status == "completed" and snap.ingestion_complete and snap.items == ITEMS
    assert strategy.calls == Counter(set(prompts(ITEMS)) - {_prompt(i) for i in stored})
    _assert_each_item_once(db)
