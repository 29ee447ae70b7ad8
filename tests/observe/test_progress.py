"""Issue 8: progress snapshots, renderers, and the per-item callback adapter.

Rendering is synchronous (the engine's progress task calls it), so those tests
are plain functions. The callback adapter awaits threads and user coroutines,
so its tests run on both backends. They use real threads, so they run on real
clocks, but they synchronise on events, never on sleeps.
"""

from __future__ import annotations

import ast
import fcntl
import io
import logging
import os
import re
import struct
import termios
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

import trio_batch_llm
from trio_batch_llm._observe._display import LogProgress, TerminalProgressBar, format_progress_line
from trio_batch_llm._observe._progress import CallbackProgress, ProgressTracker, make_progress
from trio_batch_llm._observe._snapshot import Progress, ProgressSnapshot

pytestmark = pytest.mark.anyio

HALF = ProgressSnapshot(completed=50, failed=2, in_flight=5, total=100, replayed=0, tokens_total=1234,
                        elapsed=12.0, rate=3.2, eta=15.6)
HALF_LINE = ("[###############---------------] 50/100 (50%) | 2 failed | 5 in flight | 3.2 items/s"
             " | ETA 0:16 | 1,234 tokens")
DONE = ProgressSnapshot(completed=100, failed=3, in_flight=0, total=100, tokens_total=2500,
                        elapsed=30.0, rate=3.5, eta=0.0)
DONE_LINE = ("[##############################] 100/100 (100%) | 3 failed | 0 in flight | 3.5 items/s"
             " | ETA 0:00 | 2,500 tokens")


# --------------------------------------------------------------------------
# The line


def test_line_with_total() -> None:
    assert format_progress_line(HALF) == HALF_LINE


def test_line_without_total_has_no_bar_and_no_eta() -> None:
    snap = ProgressSnapshot(completed=50, failed=2, in_flight=5, total=None, replayed=3,
                            tokens_total=1_234_567, rate=3.25)
    assert format_progress_line(snap) == (
        "50 done | 2 failed | 3 replayed | 5 in flight | 3.2 items/s | 1,234,567 tokens")


def test_line_unknown_eta_long_eta_and_empty_batch() -> None:
    slow = ProgressSnapshot(completed=0, failed=0, in_flight=1, total=10, eta=None)
    assert "ETA --:--" in format_progress_line(slow)
    long = ProgressSnapshot(completed=1, failed=0, in_flight=1, total=10, rate=0.1, eta=3600.5)
    assert "ETA 1:00:01" in format_progress_line(long)
    empty = ProgressSnapshot(completed=0, failed=0, in_flight=0, total=0, eta=0.0)
    assert format_progress_line(empty, bar_width=4).startswith("[####] 0/0 (100%)")


def test_bar_width_zero_leaves_the_bar_out() -> None:
    assert format_progress_line(HALF, bar_width=0) == HALF_LINE.split("] ", 1)[1]


# --------------------------------------------------------------------------
# The tracker


def test_tracker_rate_and_eta_over_the_window() -> None:
    tracker = ProgressTracker(start=100.0, total=100, window=10.0)
    for _ in range(12):
        tracker.item_started()
    for _ in range(10):
        tracker.item_finished(success=True, tokens=7)
    tracker.item_finished(success=False)
    snap = tracker.snapshot(105.0)
    assert snap == ProgressSnapshot(completed=11, failed=1, in_flight=1, total=100, replayed=0,
                                    tokens_total=70, elapsed=5.0, rate=11 / 5, eta=89 / (11 / 5))
    # Nothing more for 15 s: the window forgets the early burst, the rate drops to 0.
    later = tracker.snapshot(120.0)
    assert later.rate == 0.0
    assert later.eta is None
    assert later.elapsed == 20.0


def test_tracker_replays_do_not_count_towards_the_rate() -> None:
    tracker = ProgressTracker(start=0.0, total=10)
    for _ in range(6):
        tracker.item_replayed(success=True)
    tracker.item_started()
    tracker.item_finished(success=True)
    snap = tracker.snapshot(2.0)
    assert (snap.completed, snap.replayed, snap.in_flight, snap.rate) == (7, 6, 0, 0.5)
    assert snap.eta == 3 / 0.5


def test_tracker_eta_is_zero_when_done_and_none_without_total() -> None:
    tracker = ProgressTracker(start=0.0, total=1)
    tracker.item_started()
    tracker.item_finished(success=True)
    assert tracker.snapshot(1.0).eta == 0.0
    assert ProgressTracker(start=0.0).snapshot(1.0).eta is None


@given(st.lists(st.tuples(st.sampled_from(["start", "ok", "fail", "replay"]),
                          st.floats(min_value=0, max_value=5)), max_size=60))
def test_tracker_invariants(events: list[tuple[str, float]]) -> None:
    tracker = ProgressTracker(start=0.0, total=30, window=3.0)
    now = 0.0
    live_started = 0
    for kind, step in events:
        now += step
        if kind == "start":
            tracker.item_started()
            live_started += 1
        elif kind in ("ok", "fail") and live_started > 0:
            live_started -= 1
            tracker.item_finished(success=kind == "ok")
        elif kind == "replay":
            tracker.item_replayed(success=True)
        snap = tracker.snapshot(now)
        assert snap.in_flight == live_started
        assert snap.rate >= 0
        assert snap.eta is None or snap.eta >= 0
        assert 0 <= snap.failed <= snap.completed
        fraction = snap.fraction
        assert fraction is not None
        assert 0.0 <= fraction <= 1.0


# --------------------------------------------------------------------------
# Terminal bar


def test_terminal_bar_exact_text() -> None:
    out = io.StringIO()
    bar = TerminalProgressBar(out, columns=200)
    assert not bar.uses_rich  # a StringIO is not a terminal
    bar.update(HALF)
    bar.close(DONE)
    bar.update(HALF)  # after close: nothing
    bar.close(DONE)   # idempotent
    assert out.getvalue() == f"\r{HALF_LINE}\x1b[K\r{DONE_LINE}\x1b[K\n"


def set_terminal_size(fd: int, columns: int, rows: int = 24) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


@pytest.fixture
def pty(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, Any]]:
    """A pseudo-terminal 200 columns wide (tests that need another width resize it)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    master, slave = os.openpty()
    set_terminal_size(slave, 200)
    os.set_blocking(master, False)
    stream = os.fdopen(slave, "w", encoding="utf-8")
    try:
        yield master, stream
    finally:
        stream.close()
        os.close(master)


def _read_all(master: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except BlockingIOError:
            return b"".join(chunks)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def test_plain_bar_into_a_real_terminal(pty: tuple[int, Any]) -> None:
    master, stream = pty
    bar = TerminalProgressBar(stream, use_rich=False)
    bar.update(HALF)
    bar.close(DONE)
    data = _read_all(master)
    assert data.startswith(b"\r[###############---------------] 50/100 (50%)")
    assert data.count(b"\r[") == 2
    assert b"100/100 (100%)" in data


def test_make_progress_true_on_a_terminal_draws_a_bar(pty: tuple[int, Any]) -> None:
    master, stream = pty
    progress = make_progress(True, stream=stream)
    assert isinstance(progress, TerminalProgressBar)
    progress.update(HALF)
    progress.close(DONE)
    data = _read_all(master)
    assert b"50/100 (50%)" in data
    assert b"100/100 (100%)" in data
    assert b"\r" in data


def test_rich_bar_into_a_real_terminal(pty: tuple[int, Any]) -> None:
    pytest.importorskip("rich")
    master, stream = pty
    bar = TerminalProgressBar(stream)
    assert bar.uses_rich
    bar.update(HALF)
    # auto-refresh is off: rich started no refresh thread of its own
    assert not [t for t in threading.enumerate() if type(t).__name__ == "_RefreshThread"]
    bar.close(DONE)
    data = _read_all(master)
    assert b"50/100 (50%) | 2 failed" in data
    assert b"100/100 (100%)" in data
    assert b"\r" in data


# --------------------------------------------------------------------------
# Log fallback and the factory


def test_log_progress_one_line_per_interval_and_one_at_close(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="trio_batch_llm.progress")
    log = LogProgress(min_interval=10.0)
    for elapsed in (0.0, 0.5, 5.0, 10.0, 19.0, 25.0):
        log.update(ProgressSnapshot(completed=int(elapsed), failed=0, in_flight=1, total=None,
                                    elapsed=elapsed))
    log.close(DONE)
    log.close(DONE)
    log.update(HALF)
    messages = [r.getMessage() for r in caplog.records]
    assert [m.split(" |")[0] for m in messages] == [
        "progress: 0 done", "progress: 10 done", "progress: 25 done", "finished: 100/100 (100%)"]
    assert all(r.levelno == logging.INFO for r in caplog.records)
    assert "\r" not in "".join(messages)


def test_make_progress_choices() -> None:
    assert make_progress(None) is None
    assert make_progress(False) is None
    assert isinstance(make_progress(True, stream=io.StringIO()), LogProgress)

    def callback(completed: int, total: int | None, item_id: str) -> None:
        pass

    adapted = make_progress(callback)
    assert isinstance(adapted, CallbackProgress)
    assert adapted.fn is callback
    mine = LogProgress()
    assert make_progress(mine) is mine
    with pytest.raises(TypeError, match="progress must be"):
        make_progress(3)  # type: ignore[arg-type]


def _package_imports(package: Path) -> Iterator[tuple[str, str]]:
    """``(module file, imported name)`` for every import in ``package``, lazy ones included."""
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                yield from ((path.name, f"{module}.{alias.name}") for alias in node.names)
                yield path.name, module
            elif isinstance(node, ast.Import):
                yield from ((path.name, alias.name) for alias in node.names)


def test_the_engine_knows_no_display_and_no_command_line() -> None:
    # The displays are drawn only when a user asks for progress=True (make_progress loads them);
    # the engine, its kernel, admission and runs hand snapshots on and never draw.
    root = Path(trio_batch_llm.__file__).parent
    leaks = sorted(
        f"{package}/{file} imports {name}"
        for package in ("_engine", "_core", "_admission", "_runs")
        for file, name in _package_imports(root / package)
        if "_observe._display" in name or re.search(r"(^|\.)_cli(\.|$)", name)
    )
    assert leaks == []


# --------------------------------------------------------------------------
# The callback adapter (both backends)


class SlowSyncCallback:
    """A sync callback that blocks on a gate; records calls and the thread they ran in."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int | None, str]] = []
        self.threads: set[int] = set()
        self.entered = threading.Event()
        self.gate = threading.Event()

    def __call__(self, completed: int, total: int | None, item_id: str) -> None:
        self.threads.add(threading.get_ident())
        self.entered.set()
        self.gate.wait()
        self.calls.append((completed, total, item_id))


async def _wait_entered(callback: SlowSyncCallback) -> None:
    # Waits in a thread of its own (the default limiter), not on the event loop.
    await anyio.to_thread.run_sync(callback.entered.wait)


async def test_sync_callback_runs_in_a_thread() -> None:
    callback = SlowSyncCallback()
    callback.gate.set()
    progress = CallbackProgress(callback)
    await progress.on_item_async(1, 3, "a")
    assert callback.calls == [(1, 3, "a")]
    assert threading.get_ident() not in callback.threads
    assert progress.statistics().delivered == 1


async def test_sync_callback_is_coalesced_under_a_slow_callback() -> None:
    callback = SlowSyncCallback()
    progress = CallbackProgress(callback)
    async with anyio.create_task_group() as tg:
        tg.start_soon(progress.on_item_async, 1, 10, "item-1")
        await _wait_entered(callback)
        for n in range(2, 10):
            await progress.on_item_async(n, 10, f"item-{n}")  # returns at once: the thread is busy
        stats = progress.statistics()
        assert (stats.delivering, stats.pending, stats.coalesced, stats.delivered) == (True, True, 7, 0)
        callback.gate.set()
    assert callback.calls == [(1, 10, "item-1"), (9, 10, "item-9")]
    assert progress.statistics().delivered == 2
    assert not progress.statistics().pending


async def test_final_call_delivered_after_the_deliverer_is_cancelled() -> None:
    callback = SlowSyncCallback()
    progress = CallbackProgress(callback)
    async with anyio.create_task_group() as tg:
        tg.start_soon(progress.on_item_async, 1, 5, "item-1")
        await _wait_entered(callback)
        for n in range(2, 6):
            await progress.on_item_async(n, 5, f"item-{n}")
        tg.cancel_scope.cancel(reason="test")
        callback.gate.set()  # the running thread finishes; the pending call may be left behind
    await progress.aclose(DONE)
    assert callback.calls == [(1, 5, "item-1"), (5, 5, "item-5")]
    assert not progress.statistics().pending


async def test_aclose_delivers_what_on_item_recorded() -> None:
    callback = SlowSyncCallback()
    callback.gate.set()
    progress = CallbackProgress(callback)
    progress.on_item(1, None, "x")
    progress.on_item(2, None, "y")
    assert callback.calls == []  # on_item never calls the user
    await progress.aclose(DONE)
    await progress.aclose(DONE)  # nothing left: no second call
    assert callback.calls == [(2, None, "y")]
    assert progress.statistics().coalesced == 1


async def test_async_callback_is_awaited_on_the_loop() -> None:
    seen: list[tuple[int, int | None, str, int]] = []

    async def callback(completed: int, total: int | None, item_id: str) -> None:
        await anyio.lowlevel.checkpoint()
        seen.append((completed, total, item_id, threading.get_ident()))

    progress = CallbackProgress(callback)
    await progress.on_item_async(1, 2, "a")
    assert seen == [(1, 2, "a", threading.get_ident())]  # finished before on_item_async returned


async def test_async_callable_object_is_detected() -> None:
    class Callback:
        def __init__(self) -> None:
            self.calls: list[str] = []

        async def __call__(self, completed: int, total: int | None, item_id: str) -> None:
            await anyio.lowlevel.checkpoint()
            self.calls.append(item_id)

    callback = Callback()
    await CallbackProgress(callback).on_item_async(1, 1, "obj")
    assert callback.calls == ["obj"]


async def test_async_callback_is_coalesced_while_busy() -> None:
    release = anyio.Event()
    entered = anyio.Event()
    calls: list[int] = []

    async def callback(completed: int, total: int | None, item_id: str) -> None:
        entered.set()
        await release.wait()
        calls.append(completed)

    progress = CallbackProgress(callback)
    async with anyio.create_task_group() as tg:
        tg.start_soon(progress.on_item_async, 1, None, "a")
        await entered.wait()
        for n in range(2, 6):
            await progress.on_item_async(n, None, str(n))
        release.set()
    assert calls == [1, 5]


async def test_callback_error_propagates_and_later_calls_still_arrive() -> None:
    calls: list[int] = []

    def callback(completed: int, total: int | None, item_id: str) -> None:
        if completed == 1:
            raise RuntimeError("callback bug")
        calls.append(completed)

    progress = CallbackProgress(callback)
    with pytest.raises(RuntimeError, match="callback bug"):
        await progress.on_item_async(1, 2, "a")
    await progress.on_item_async(2, 2, "b")
    assert calls == [2]


async def test_renderers_ignore_items_and_aclose_draws_the_final_line() -> None:
    out = io.StringIO()
    bar = TerminalProgressBar(out, columns=200)
    await bar.on_item_async(1, 2, "a")
    await bar.aclose(DONE)
    assert out.getvalue() == f"\r{DONE_LINE}\x1b[K\n"
    assert isinstance(bar, Progress)


def test_every_count_on_the_line_groups_its_thousands() -> None:
    # As the summary and the "not run" count do: 1,234 failed, not 1234 failed.
    snap = ProgressSnapshot(completed=12_345, failed=1_234, in_flight=2_000, total=20_000, replayed=3_000,
                            waiting=1_500, rate=3.25, eta=None)
    line = format_progress_line(snap, bar_width=0)
    assert line.startswith("12,345/20,000 (61%) | 1,234 failed | 3,000 replayed | 2,000 in flight")
    assert "1,500 waiting" in line
    assert format_progress_line(ProgressSnapshot(completed=12_345, failed=0, in_flight=0, total=None),
                                bar_width=0).startswith("12,345 done")
