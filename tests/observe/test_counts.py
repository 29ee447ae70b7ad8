"""Issue 35, points 1 and 10 (ETA): one count of *not run* on the progress line, and no ETA that
no finished item supports.

After a stop (Ctrl+C, a guardrail) the items it kept from starting are *not run*, as the summary
says, not *failed*; they are no progress either (the head, the bar and the rate leave them out),
and the line estimates no time left, since what is left will not run. The engine-level tests run on
both backends, on Trio under a virtual clock.
"""

from __future__ import annotations

import re
from typing import Any

import anyio
import pytest

from trio_batch_llm import FakeStrategy, LLMWorkItem, ParallelBatchProcessor, ProcessorConfig
from trio_batch_llm._cli._render import _KnownTotal
from trio_batch_llm._observe._display import format_progress_line
from trio_batch_llm._observe._progress import ProgressTracker
from trio_batch_llm._observe._snapshot import Progress, ProgressSnapshot

from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio


@pytest.fixture(
    scope="module",
    params=[pytest.param("asyncio", id="asyncio"), pytest.param(trio_virtual_clock(), id="trio")],
)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


class Recorder(Progress):
    """Keeps every snapshot the engine draws, and the final one."""

    def __init__(self) -> None:
        self.snapshots: list[ProgressSnapshot] = []
        self.final: ProgressSnapshot | None = None

    def update(self, snapshot: ProgressSnapshot) -> None:
        self.snapshots.append(snapshot)

    def close(self, final: ProgressSnapshot) -> None:
        self.final = final


async def _stopped_batch(recorder: Progress, *, stop_after: int) -> tuple[Any, FakeStrategy]:
    """20 items, 2 workers, 0.1 s calls; a stop once ``stop_after`` items have finished (0: at once,
    while the first two calls are in flight)."""
    strategy = FakeStrategy(latency=0.1)
    config = ProcessorConfig(concurrency=2, max_queue_size=0, progress_interval=0.01)
    async with ParallelBatchProcessor(config, progress_callback=recorder) as processor:
        for n in range(20):
            await processor.add_work(LLMWorkItem(item_id=f"i{n}", strategy=strategy, prompt=f"p{n}"))

        async def stop() -> None:
            # Neither the processor nor FakeStrategy has an event to wait on: poll (virtual time on Trio).
            while processor.statistics().counters.finished < stop_after or not strategy.calls:  # noqa: ASYNC110
                await anyio.sleep(0.01)
            processor.request_stop("interrupted by SIGINT")

        async with anyio.create_task_group() as tg:
            tg.start_soon(stop)
            batch = await processor.process_all()
    return batch, strategy


async def test_the_bar_counts_items_a_stop_kept_from_starting_as_not_run(anyio_backend: Any) -> None:
    recorder = Recorder()
    batch, strategy = await _stopped_batch(recorder, stop_after=4)
    final = recorder.final
    assert final is not None
    ran = len(strategy.calls)
    assert ran >= 4 and batch.failed == 20 - ran  # BatchResult.failed counts the not-run ones too
    assert (final.completed, final.failed, final.not_run) == (ran, 0, 20 - ran)
    line = format_progress_line(final, bar_width=0)
    assert line.startswith(f"{ran}/20 ({ran * 5}%) | 0 failed | {20 - ran} not run | 0 in flight")
    assert "ETA" not in line  # what is left will not run: no time left to estimate


async def test_after_a_stop_the_line_estimates_no_time_left_and_rates_only_calls(anyio_backend: Any) -> None:
    recorder = Recorder()
    await _stopped_batch(recorder, stop_after=0)  # at once, while the first two calls are in flight
    final = recorder.final
    assert final is not None
    # The 18 queued items were reported when the first two calls ended: not run, no progress.
    assert format_progress_line(final, bar_width=0).startswith("2/20 (10%) | 0 failed | 18 not run")
    for snapshot in [*recorder.snapshots, final]:
        line = format_progress_line(snapshot, bar_width=0)
        assert re.search(r"ETA \d", line) is None or "not run" not in line, line
        assert snapshot.rate <= 2 / max(snapshot.elapsed, 0.1) + 1e-9, line  # only the 2 calls


def test_not_run_items_are_no_progress_and_no_rate() -> None:
    tracker = ProgressTracker(start=0.0, total=10)
    tracker.item_started()
    for _ in range(6):
        tracker.item_finished(success=False, not_run=True, started=False)
    snap = tracker.snapshot(1.0)
    assert (snap.completed, snap.failed, snap.not_run, snap.in_flight, snap.rate) == (0, 0, 6, 1, 0.0)
    assert snap.eta is None and snap.fraction == 0.0 and snap.succeeded == 0
    # A started item that a stop ended before its first call is not run, and no longer in flight.
    tracker.item_finished(success=False, not_run=True)
    snap = tracker.snapshot(2.0)
    assert (snap.completed, snap.not_run, snap.in_flight) == (0, 7, 0)


def test_no_eta_before_an_item_finished() -> None:
    tracker = ProgressTracker(start=0.0, total=2000)
    for _ in range(16):
        tracker.item_started()
    first = tracker.snapshot(0.5)
    assert first.eta is None and "ETA --:--" in format_progress_line(first)
    tracker.item_finished(success=True)
    assert tracker.snapshot(1.0).eta == pytest.approx(1999 / 1.0)


def test_the_command_lines_known_total_counts_the_items_never_read_as_not_run() -> None:
    shown: list[ProgressSnapshot] = []

    class Keep(Progress):
        def update(self, snapshot: ProgressSnapshot) -> None:
            shown.append(snapshot)

        def close(self, final: ProgressSnapshot) -> None:
            shown.append(final)

    display = _KnownTotal(Keep(), 2000)
    running = ProgressSnapshot(completed=900, failed=0, in_flight=16, total=None, rate=20.0)
    display.update(running)
    assert shown[-1].total == 2000 and shown[-1].eta == pytest.approx(1100 / 20.0)
    stopping = ProgressSnapshot(completed=916, failed=0, not_run=64, in_flight=0, total=None, rate=20.0)
    display.update(stopping)
    assert shown[-1].eta is None  # stopped: the rest will not run
    display.close(stopping)
    final = shown[-1]
    # The summary's "not run 1,084": the 64 the stop left in the queue and the 1,020 never read.
    assert (final.completed, final.not_run, final.total) == (916, 1084, 2000)
    assert "916/2,000 (45%) | 0 failed | 1,084 not run | 0 in flight" in format_progress_line(final)
