"""Durable runs (issue 12), live mode: lifecycle, exactly-once, deadlines, ingestion, result reading.

Both backends; Trio runs on a virtual clock, so the deadline tests assert
exact times (they are Trio-only: asyncio would need real waiting). Repository
calls run in worker threads, during which the virtual clock may jump to the
next deadline; only assertions that hold under any such jump are made on
timings, except in the ingestion test, which runs the repository on the loop.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_batch_llm import (
    ArtifactIdentity,
    ArtifactMismatchError,
    ConfigurationError,
    ErrorCategory,
    FakeStrategy,
    GuardrailConfig,
    ProcessorConfig,
    ProviderError,
    SqliteArtifactStore,
    WorkItemResult,
)
from trio_batch_llm._runs import (
    Run,
    RunSourceError,
    RunStateError,
    SqliteRunRepository,
    iter_run_results,
    open_run,
    read_run_snapshot,
)
from trio_batch_llm._runs._ingest import Ingestor
from trio_batch_llm._runs._schema import RunSpec, SourceCheckpoint
from trio_batch_llm._runs._source import IterableSource

from .._runs_child import IDENTITY, CountingStrategy, prompts
from ..conftest import clock_waits_for_threads, trio_virtual_clock

pytestmark = pytest.mark.anyio


@pytest.fixture(
    scope="module",
    params=[pytest.param("asyncio", id="asyncio"), pytest.param(trio_virtual_clock(threads=True), id="trio")],
)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


@pytest.fixture
def trio_only(anyio_backend: Any) -> None:
    if anyio_backend == "asyncio":
        pytest.skip("exact timing needs Trio's virtual clock")


async def _open(db: Path, strategy: Any, source: Any, *, run_id: str = "run", **kwargs: Any) -> Run:
    kwargs.setdefault("config", ProcessorConfig(concurrency=4))
    kwargs.setdefault("identity", IDENTITY)
    return await open_run(db, run_id, strategy, source, **kwargs)


def _results_by_item(db: Path, run_id: str = "run") -> Counter[str]:
    return Counter(r.item_id for r in iter_run_results(db, run_id))


def _assert_exactly_once(db: Path, n: int, *, run_id: str = "run") -> None:
    results = list(iter_run_results(db, run_id))
    assert [r.sequence for r in results] == list(range(1, n + 1))
    assert Counter(r.item_id for r in results) == Counter(f"item-{i}" for i in range(n))


# --- a run from start to end --------------------------------------------------------


async def test_run_completes_each_item_once_with_gapless_sequences(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    strategy = CountingStrategy()
    async with await _open(db, strategy, prompts(50), slice_items=7) as run:
        snap = await run.wait()
        assert snap.status == "completed"
        assert snap.termination is not None and snap.termination.kind == "completed"
        assert (snap.items, snap.done, snap.succeeded, snap.failed, snap.pending) == (50, 50, 50, 0, 0)
        assert (snap.input_tokens, snap.output_tokens, snap.total_tokens) == (150, 100, 250)
        assert snap.ingestion_complete and snap.checkpoint.position == 50
        assert snap.last_sequence == 50
        page = await run.read_results()
        assert [r.sequence for r in page] == list(range(1, 51))
        assert {r.item_id: r.result.output for r in page} == {f"item-{i}": f"out: p{i}" for i in range(50)}
    assert strategy.calls == Counter(prompts(50))
    _assert_exactly_once(db, 50)


async def test_reattaching_a_completed_run_runs_nothing(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    async with await _open(db, CountingStrategy(), prompts(5)) as run:
        await run.wait()
    again = CountingStrategy()
    async with await _open(db, again, prompts(5)) as run:
        snap = await run.wait()
    assert snap.status == "completed" and snap.done == 5
    assert again.total == 0


async def test_provider_failures_are_terminal_results(tmp_path: Path) -> None:
    bad = ProviderError("no", category=ErrorCategory.INVALID_REQUEST)
    strategy = FakeStrategy(script={"p3": [bad]})
    async with await _open(tmp_path / "r.sqlite", strategy, prompts(6)) as run:
        snap = await run.wait()
        failures = [r.result for r in await run.read_results() if not r.result.success]
    assert (snap.status, snap.done, snap.succeeded, snap.failed) == ("completed", 6, 5, 1)
    assert [(f.item_id, f.error_category) for f in failures] == [("item-3", ErrorCategory.INVALID_REQUEST)]


# --- pause, resume, cancel ----------------------------------------------------------


async def test_pause_then_resume_in_the_same_process_is_exactly_once(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    strategy = CountingStrategy(latency=0.01, signal_at_call=10)
    async with await _open(db, strategy, prompts(60), slice_items=8) as run:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run.wait)
            await strategy.reached.wait()
            paused = await run.pause()
            # Drained: every call that started has finished and is recorded.
            assert paused.status == "paused"
            assert paused.termination is not None and paused.termination.kind == "paused"
            assert strategy.total == paused.done
            assert 10 <= paused.done < 60
            calls_when_paused = strategy.total
            await anyio.sleep(0.05)  # a paused run starts nothing (any timing would do)
            assert strategy.total == calls_when_paused
            tg.cancel_scope.cancel()
        resumed = await run.resume()
        assert resumed.status == "running"
        snap = await run.wait()
    assert snap.status == "completed"
    assert strategy.calls == Counter(prompts(60))
    _assert_exactly_once(db, 60)


@pytest.mark.usefixtures("trio_only")
async def test_pause_from_another_handle_reaches_the_driver(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    # Calls 1-4 answer at once; calls 5-8 (one per worker) hold until released.
    strategy = CountingStrategy(signal_at_call=8, hold_from_call=5)
    other = CountingStrategy()
    driver = await _open(db, strategy, prompts(200), poll_interval=0.5)
    observer = await _open(db, other, None, poll_interval=0.5)
    async with driver, observer, anyio.create_task_group() as tg:
        with clock_waits_for_threads():
            tg.start_soon(driver.wait)
            await strategy.reached.wait()
            assert (await observer.pause()).status == "paused"
            await anyio.sleep(0.6)  # the driver's next status poll comes within 0.5 s
            strategy.release.set()  # the calls in flight finish and are recorded; nothing new starts
            await anyio.sleep(2)
        assert strategy.total == 8
        snap = await observer.snapshot()
        assert (snap.status, snap.done, snap.pending) == ("paused", 8, 192)
        await observer.resume()
        final = await observer.wait()  # one of the two handles drives it to the end
        assert final.status == "completed"
        tg.cancel_scope.cancel()
    assert strategy.calls + other.calls == Counter(prompts(200))


async def test_cancel_stops_the_run_for_good(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    strategy = CountingStrategy(latency=0.01, signal_at_call=3)
    outcome: list[Any] = []
    async with await _open(db, strategy, prompts(100)) as run:
        async with anyio.create_task_group() as tg:

            async def drive() -> None:
                outcome.append(await run.wait())

            tg.start_soon(drive)
            await strategy.reached.wait()
            snap = await run.cancel("operator said so")
        assert outcome[0].status == "cancelled"
        assert snap.status == "cancelled" and snap.terminal and snap.pending + snap.done == snap.items
        assert snap.termination is not None and snap.termination.reason == "operator said so"
        calls = strategy.total
        with pytest.raises(RunStateError, match="cancelled"):
            await run.resume()
        with pytest.raises(RunStateError, match="cancelled"):
            await run.pause()
        assert (await run.wait()).status == "cancelled"
    assert strategy.total == calls


async def test_resume_from_a_new_handle_continues_at_the_first_unconsumed_input(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    first = CountingStrategy(latency=0.01, signal_at_call=6)
    async with await _open(db, first, prompts(40), slice_items=4) as run, anyio.create_task_group() as tg:
        tg.start_soon(run.wait)
        await first.reached.wait()
        paused = await run.pause()
        tg.cancel_scope.cancel()
    assert not paused.ingestion_complete and paused.checkpoint.position < 40
    second = CountingStrategy()
    # A one-shot iterator: it is fast-forwarded past the checkpoint, never re-ingested.
    async with await _open(db, second, iter(prompts(40)), slice_items=4) as run:
        await run.resume()
        snap = await run.wait()
    assert snap.status == "completed" and snap.items == 40
    assert first.calls + second.calls == Counter(prompts(40))
    _assert_exactly_once(db, 40)


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=30),
    slice_items=st.integers(min_value=1, max_value=8),
    pause_at=st.integers(min_value=1, max_value=30),
    concurrency=st.integers(min_value=1, max_value=4),
)
async def test_a_pause_at_any_point_then_a_new_handle_is_exactly_once(
    n: int, slice_items: int, pause_at: int, concurrency: int
) -> None:
    config = ProcessorConfig(concurrency=concurrency)
    with tempfile.TemporaryDirectory() as directory:
        db = Path(directory) / "r.sqlite"
        first = CountingStrategy(signal_at_call=min(pause_at, n))
        async with await _open(db, first, prompts(n), config=config, slice_items=slice_items) as run:
            async with anyio.create_task_group() as tg:
                tg.start_soon(run.wait)
                await first.reached.wait()
                with contextlib.suppress(RunStateError):  # it may have completed meanwhile
                    await run.pause()
                tg.cancel_scope.cancel()
            assert first.total == (await run.snapshot()).done  # drained
        second = CountingStrategy()
        async with await _open(db, second, iter(prompts(n)), config=config, slice_items=slice_items) as run:
            if (await run.snapshot()).status == "paused":
                await run.resume()
            assert (await run.wait()).status == "completed"
        assert first.calls + second.calls == Counter(prompts(n))
        _assert_exactly_once(db, n)


# --- wait(timeout) --------------------------------------------------------------------


@pytest.mark.usefixtures("trio_only")
async def test_wait_raises_at_the_deadline_and_starts_no_work_after_it(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    strategy = CountingStrategy(latency=1.0)
    async with await _open(db, strategy, prompts(100), config=ProcessorConfig(concurrency=2),
                           poll_interval=3600) as run:
        with clock_waits_for_threads():
            start = anyio.current_time()
            with pytest.raises(TimeoutError):
                await run.wait(timeout=5)
            assert anyio.current_time() == start + 5
        # Two calls start at 0, 1, … 4 s; the two ending at 5 s would start the next
        # ones at the very instant of the deadline: none may.
        offsets = {round(t - start, 9) for t in strategy.starts}
        assert 0 in offsets and offsets <= {0, 1, 2, 3, 4}
        calls = strategy.total
        await anyio.sleep(100)
        assert strategy.total == calls  # nothing runs once wait() has returned
        snap = await run.snapshot()
        assert snap.status == "running" and snap.done < 100
        # The run is resumable: a later wait() finishes it, each item with one result.
        assert (await run.wait()).status == "completed"
    _assert_exactly_once(db, 100)
    assert set(strategy.calls) == set(prompts(100))


@pytest.mark.usefixtures("trio_only")
async def test_wait_deadline_caps_the_idle_wait_of_a_paused_run(tmp_path: Path) -> None:
    strategy = CountingStrategy()
    async with await _open(tmp_path / "r.sqlite", strategy, prompts(10), poll_interval=3600) as run:
        await run.pause()
        start = anyio.current_time()
        with pytest.raises(TimeoutError):
            await run.wait(timeout=7.5)
        assert anyio.current_time() == start + 7.5
    assert strategy.total == 0


@pytest.mark.usefixtures("trio_only")
async def test_wait_deadline_caps_polling_while_another_process_drives(tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite"
    strategy = CountingStrategy()
    async with await _open(db, strategy, prompts(10), poll_interval=3600) as run:
        elsewhere = SqliteRunRepository(db)  # stands for a live process holding the claim
        elsewhere.open()
        try:
            assert elsewhere.try_claim("run")
            start = anyio.current_time()
            with pytest.raises(TimeoutError):
                await run.wait(timeout=3)
            assert anyio.current_time() == start + 3
            assert strategy.total == 0
        finally:
            elsewhere.close()  # the claim dies with its holder
        assert (await run.wait()).status == "completed"  # claimed at the next poll
    assert strategy.calls == Counter(prompts(10))


async def test_wait_rejects_a_bad_timeout(tmp_path: Path) -> None:
    async with await _open(tmp_path / "r.sqlite", CountingStrategy(), prompts(1)) as run:
        for bad in (-1, float("nan"), "5", True):
            with pytest.raises(ValueError, match="timeout"):
                await run.wait(timeout=bad)  # type: ignore[arg-type]


# --- ingestion --------------------------------------------------------------------------


class _LoopDb:
    """A RepositoryClient stand-in that runs the repository on the loop: exact virtual times."""

    def __init__(self, repository: SqliteRunRepository) -> None:
        self.repository = repository
        self.commits: list[tuple[float, int, SourceCheckpoint]] = []

    async def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        await anyio.lowlevel.checkpoint()
        if fn == self.repository.ingest:
            self.commits.append((anyio.current_time(), len(args[1]), args[2]))
        return fn(*args, **kwargs)


async def _drain(ingestor: Ingestor) -> list[list[str]]:
    slices = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(ingestor.read_ahead)
        while (items := await ingestor.next_slice()) is not None:
            slices.append([item_id for item_id, _, _ in items])
    return slices


def _ingestor(
    tmp_path: Path, source: Any, *, slice_items: int, slice_seconds: float
) -> tuple[Ingestor, _LoopDb]:
    repository = SqliteRunRepository(tmp_path / "i.sqlite")
    repository.open()
    repository.attach(RunSpec("run", "live", IDENTITY, {}))
    db = _LoopDb(repository)
    strategy = CountingStrategy()
    ingestor = Ingestor(IterableSource(source, strategy), strategy, run_id="run", db=db,  # type: ignore[arg-type]
                        slice_items=slice_items, slice_seconds=slice_seconds)
    return ingestor, db


@pytest.mark.usefixtures("trio_only")
async def test_slices_are_bounded_by_time_so_a_slow_source_cannot_starve_processing(tmp_path: Path) -> None:
    async def slow() -> AsyncIterator[str]:
        for i in range(6):
            await anyio.sleep(1.0)
            yield f"p{i}"

    ingestor, db = _ingestor(tmp_path, slow(), slice_items=100, slice_seconds=2.5)
    start = anyio.current_time()
    await ingestor.prepare(SourceCheckpoint())
    slices = await _drain(ingestor)
    # Entries arrive at 1..6 s; a slice closes 2.5 s after its first entry (or at the source's end).
    assert slices == [["item-0", "item-1", "item-2"], ["item-3", "item-4", "item-5"]]
    assert [(t - start, n) for t, n, _ in db.commits] == [(3.5, 3), (6.0, 3)]
    assert [c.position for _, _, c in db.commits] == [3, 6]
    assert [c.exhausted for _, _, c in db.commits] == [False, True]
    db.repository.close()


async def test_slices_are_bounded_by_count_and_commit_their_checkpoint(tmp_path: Path) -> None:
    ingestor, db = _ingestor(tmp_path, prompts(11), slice_items=4, slice_seconds=60)
    await ingestor.prepare(SourceCheckpoint())
    slices = await _drain(ingestor)
    assert [len(s) for s in slices] == [4, 4, 3]
    checkpoints = [c for _, _, c in db.commits]
    assert [(c.position, c.last_item_id, c.exhausted) for c in checkpoints] == [
        (4, "item-3", False), (8, "item-7", False), (11, "item-10", True)
    ]
    snap = db.repository.snapshot("run")
    assert (snap.items, snap.checkpoint.position, snap.ingestion_complete) == (11, 11, True)
    db.repository.close()


async def test_a_bad_entry_commits_the_good_ones_then_fails_the_run(tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite"
    strategy = CountingStrategy()
    async with await _open(db, strategy, ["a", "b", ("x", 3), "d"], slice_items=10) as run:
        with pytest.raises(TypeError, match="prompt=3"):
            await run.wait()
        snap = await run.snapshot()
    assert snap.status == "failed" and snap.termination is not None
    assert snap.termination.kind == "ingestion_failed"
    assert (snap.items, snap.done, snap.checkpoint.position) == (2, 2, 2)
    assert not snap.ingestion_complete
    assert strategy.calls == Counter({"a": 1, "b": 1})


async def test_a_duplicate_item_id_fails_the_run(tmp_path: Path) -> None:
    async with await _open(tmp_path / "r.sqlite", CountingStrategy(),
                           [("a", "x"), ("b", "y"), ("a", "z")], slice_items=2) as run:
        with pytest.raises(ValueError, match="duplicate item_id='a'"):
            await run.wait()
        snap = await run.snapshot()
    assert (snap.status, snap.items, snap.done) == ("failed", 2, 2)


async def test_a_source_error_drains_then_fails_and_a_fresh_source_resumes(tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite"

    def flaky() -> Any:
        yield from prompts(5)
        raise OSError("disk went away")

    strategy = CountingStrategy()
    async with await _open(db, strategy, flaky(), slice_items=3) as run:
        with pytest.raises(OSError, match="disk went away"):
            await run.wait()
        assert (await run.snapshot()).items == 5  # the entries before the error are kept
    async with await _open(db, strategy, prompts(8), slice_items=3) as run:
        await run.resume()
        assert (await run.wait()).status == "completed"
    assert strategy.calls == Counter(prompts(8))
    _assert_exactly_once(db, 8)


async def test_a_different_source_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite"
    strategy = CountingStrategy(signal_at_call=2, latency=0.01)
    async with await _open(db, strategy, prompts(30), slice_items=4) as run, anyio.create_task_group() as tg:
        tg.start_soon(run.wait)
        await strategy.reached.wait()
        await run.pause()
        tg.cancel_scope.cancel()
    other = [(f"other-{i}", f"q{i}") for i in range(30)]
    async with await _open(db, strategy, other) as run:
        await run.resume()
        with pytest.raises(RunSourceError, match="not the source"):
            await run.wait()
        assert (await run.snapshot()).status == "running"  # a wrong source is this handle's problem
    async with await _open(db, strategy, prompts(2)) as run:
        with pytest.raises(RunSourceError, match="ended after 2"):
            await run.wait()
    async with await _open(db, strategy, None) as run:
        with pytest.raises(RunSourceError, match="without a source"):
            await run.wait()


async def test_jsonl_source_continues_from_its_byte_cursor(tmp_path: Path) -> None:
    db, path = tmp_path / "r.sqlite", tmp_path / "in.jsonl"
    lines = ['"plain"', "", '{"id": "a", "prompt": "x", "context": {"k": 1}}', '{"id": 7, "prompt": "y"}']
    lines += [json.dumps({"id": f"n{i}", "prompt": f"p{i}"}) for i in range(30)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    first = CountingStrategy(latency=0.01, signal_at_call=5)
    async with await _open(db, first, path, slice_items=4) as run, anyio.create_task_group() as tg:
        tg.start_soon(run.wait)
        await first.reached.wait()
        paused = await run.pause()
        tg.cancel_scope.cancel()
    assert paused.checkpoint.cursor is not None and paused.checkpoint.fingerprint is not None
    original = path.read_bytes()
    path.write_bytes(b'"changed"\n' + original)  # not the input the run started with
    second = CountingStrategy()
    async with await _open(db, second, path, slice_items=4) as run:
        await run.resume()
        with pytest.raises(RunSourceError, match="changed since the run's checkpoint"):
            await run.wait()
    path.write_bytes(original)
    async with await _open(db, second, path, slice_items=4) as run:
        assert (await run.wait()).status == "completed"
        results = {r.item_id: r.result for r in await run.read_results()}
    assert first.calls + second.calls == Counter(["plain", "x", "y", *prompts(30)])
    assert set(results) == {"item-0", "a", "7"} | {f"n{i}" for i in range(30)}
    assert results["a"].context == {"k": 1} and results["item-0"].output == "out: plain"


# --- reading results ----------------------------------------------------------------------


async def test_a_result_reader_replays_after_a_failure_without_double_counting(tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite"
    strategy = CountingStrategy(latency=0.001)
    committed = {"cursor": 0, "sums": Counter[str]()}
    failures_left = [2]

    async def consume(run: Run, n: int) -> None:
        # Effects are applied together with the cursor, page by page; a failure mid-page
        # loses the page's uncommitted effects and the consumer restarts from its cursor.
        while sum(committed["sums"].values()) < n:  # type: ignore[attr-defined]
            try:
                page = await run.read_results(after_sequence=committed["cursor"], limit=7)  # type: ignore[arg-type]
                pending = Counter[str]()
                for index, entry in enumerate(page):
                    if index == 3 and failures_left[0] > 0:
                        failures_left[0] -= 1
                        raise ConnectionError("consumer crashed mid-page")
                    pending[entry.item_id] += 1
                if page:
                    assert page[0].sequence == committed["cursor"] + 1  # gapless
                    committed["sums"] = committed["sums"] + pending  # type: ignore[operator]
                    committed["cursor"] = page[-1].sequence
                else:
                    await anyio.sleep(0.001)
            except ConnectionError:
                continue

    async with await _open(db, strategy, prompts(40), slice_items=5) as run:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run.wait)
            await consume(run, 40)  # reads while the run is still producing
        assert failures_left == [0]
        assert committed["sums"] == Counter(f"item-{i}" for i in range(40))
        assert committed["cursor"] == 40
        assert await run.read_results(after_sequence=40) == []
        assert [r.sequence for r in await run.read_results(after_sequence=10, limit=3)] == [11, 12, 13]
        for bad in ({"after_sequence": -1}, {"limit": 0}, {"after_sequence": 1.5}):
            with pytest.raises(ValueError, match="must be"):
                await run.read_results(**bad)
        out = tmp_path / "out.jsonl"
        assert await run.export_jsonl(out, after_sequence=30) == 10
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [line["sequence"] for line in lines] == list(range(31, 41))
    assert isinstance(WorkItemResult.from_dict(lines[0]["result"]), WorkItemResult)
    assert not (tmp_path / "out.jsonl.partial").exists()


async def test_snapshot_and_results_are_readable_without_the_handle(tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite"
    async with await _open(db, CountingStrategy(), prompts(12)) as run:
        await run.wait()
    snap = await anyio.to_thread.run_sync(read_run_snapshot, db, "run")
    assert (snap.status, snap.done) == ("completed", 12)
    with pytest.raises(RunStateError, match="no run named"):
        await anyio.to_thread.run_sync(read_run_snapshot, db, "nope")


# --- budgets, identity, configuration ---------------------------------------------------------


async def test_token_budget_covers_the_whole_run(tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite"
    strategy = CountingStrategy()
    config = ProcessorConfig(concurrency=1, guardrails=GuardrailConfig(max_total_tokens=20))
    async with await _open(db, strategy, prompts(10), config=config) as run:
        snap = await run.wait()
        assert snap.status == "failed" and snap.termination is not None
        assert snap.termination.kind == "budget_exhausted"
        assert (snap.done, snap.total_tokens) == (4, 20)
        await run.resume()  # the budget is spent for the run, not per drive
        again = await run.wait()
    assert again.status == "failed" and again.done == 4
    assert strategy.total == 4


async def test_reattach_with_another_identity_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite"
    async with await _open(db, CountingStrategy(), prompts(1)):
        pass
    other = ArtifactIdentity(provider="test", model="counting", prompt_version="2")
    with pytest.raises(ArtifactMismatchError, match="identity"):
        await _open(db, CountingStrategy(), prompts(1), identity=other)


async def test_runs_share_the_artifact_store_file(tmp_path: Path) -> None:
    db = tmp_path / "store.sqlite"
    async with SqliteArtifactStore(db, identity=IDENTITY) as store:
        await store.append(WorkItemResult(item_id="old", success=True, output="x"), fingerprint="f")
    store = SqliteArtifactStore(db, identity=IDENTITY)
    async with await open_run(store, "run", CountingStrategy(), prompts(3)) as run:
        assert (await run.snapshot()).identity == IDENTITY
        assert (await run.wait()).done == 3
    async with SqliteArtifactStore(db, identity=IDENTITY) as reopened:
        assert set(await reopened.load()) == {"old"}


async def test_bad_arguments(tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite"
    with pytest.raises(ConfigurationError, match="OpenAICompatibleStrategy"):
        await open_run(db, "run", CountingStrategy(), prompts(1), mode="provider-batch")
    with pytest.raises(ConfigurationError, match="mode"):
        await open_run(db, "run", CountingStrategy(), prompts(1), mode="later")
    timed = ProcessorConfig(guardrails=GuardrailConfig(batch_timeout=5))
    with pytest.raises(ConfigurationError, match=r"wait\(timeout"):
        await open_run(db, "run", CountingStrategy(), prompts(1), config=timed)
    with pytest.raises(TypeError, match=r"pathlib\.Path"):
        await open_run(db, "run", CountingStrategy(), "one prompt")
    for name in ("poll_interval", "slice_items", "slice_seconds"):
        with pytest.raises(ConfigurationError, match=name):
            await open_run(db, "run", CountingStrategy(), prompts(1), **{name: 0})
    run = await _open(db, CountingStrategy(), prompts(1))
    with pytest.raises(RunStateError, match="live mode"):
        await run.resolve_submission(created=True, batch_id="b")
    await run.aclose()
    await run.aclose()
    with pytest.raises(RunStateError, match="closed"):
        await run.snapshot()


async def test_list_runs_reads_every_run_oldest_first(tmp_path: Path) -> None:
    from trio_batch_llm import list_runs

    db = tmp_path / "r.sqlite"
    for run_id in ("b-first", "a-second"):
        async with await _open(db, CountingStrategy(), prompts(2), run_id=run_id) as run:
            await run.wait()
    snaps = list_runs(db)
    assert [s.run_id for s in snaps] == ["b-first", "a-second"]
    assert [s.status for s in snaps] == ["completed", "completed"]
