"""Issue 21: what ``progress=True`` shows, wherever it runs.

- In a terminal the bar fits its width and never wraps: checked in pseudo-terminals
  of 80 columns, drawn in this process and by a child process whose stderr is one.
- In a Jupyter kernel it is a display updated in place (a fake kernel stands in).
- Anywhere else (a pipe, a file, a notebook-like non-terminal) it is plain lines
  that show without any logging set up.
"""

from __future__ import annotations

import fcntl
import io
import logging
import os
import re
import struct
import subprocess
import sys
import termios
import types
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_batch_llm._observe._display import (
    LogProgress,
    TerminalProgressBar,
    default_display,
    fit_progress_line,
    format_progress_line,
)
from trio_batch_llm._observe._notebook import NotebookProgress, in_notebook
from trio_batch_llm._observe._progress import make_progress
from trio_batch_llm._observe._snapshot import ProgressSnapshot

WIDE = ProgressSnapshot(completed=123_456, failed=7_890, in_flight=512, total=1_000_000, replayed=4_321,
                        tokens_total=9_876_543_210, elapsed=3_600.0, rate=1_234.5, eta=7_654.0)
NO_TOTAL = ProgressSnapshot(completed=123_456, failed=7_890, in_flight=512, total=None, replayed=4_321,
                            tokens_total=9_876_543_210, elapsed=3_600.0, rate=1_234.5)
ANSI = re.compile(rb"\x1b(\[[0-9;?]*[A-Za-z]|\][^\x07]*\x07|[()][0-9A-Za-z])")


# --- fitting the line ---------------------------------------------------------------------


def test_a_wide_line_is_cut_to_the_columns_keeping_counts_failures_and_eta() -> None:
    full = format_progress_line(WIDE)
    assert len(full) > 100
    line = fit_progress_line(WIDE, 80)
    assert len(line) <= 79
    assert "123,456/1,000,000 (12%)" in line and "7,890 failed" in line and "ETA 2:07:34" in line
    assert line.startswith("[#")  # the bar is kept, narrower
    assert fit_progress_line(WIDE, 200) == full  # room enough: the whole line
    narrow = fit_progress_line(WIDE, 40)
    assert len(narrow) <= 39 and narrow.startswith("123,456/1,000,000 (12%)")  # the bar goes first


@given(
    columns=st.integers(min_value=1, max_value=240),
    completed=st.integers(min_value=0, max_value=10**12),
    total=st.none() | st.integers(min_value=0, max_value=10**12),
    tokens=st.integers(min_value=0, max_value=10**15),
    bar_width=st.integers(min_value=0, max_value=60),
)
def test_the_fitted_line_never_reaches_the_last_column(
    columns: int, completed: int, total: int | None, tokens: int, bar_width: int
) -> None:
    snap = ProgressSnapshot(completed=completed, failed=completed // 3, in_flight=99, total=total,
                            replayed=completed // 5, tokens_total=tokens, rate=123.4, eta=None)
    line = fit_progress_line(snap, columns, bar_width=bar_width)
    assert len(line) <= max(1, columns - 1)
    assert "\n" not in line and "\r" not in line


# --- terminals of 80 columns ----------------------------------------------------------------


def set_terminal_size(fd: int, columns: int, rows: int = 24) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


@pytest.fixture
def pty80(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, Any]]:
    monkeypatch.delenv("COLUMNS", raising=False)  # the terminal's own size decides
    master, slave = os.openpty()
    set_terminal_size(slave, 80)
    os.set_blocking(master, False)
    stream = os.fdopen(slave, "w", encoding="utf-8")
    try:
        yield master, stream
    finally:
        stream.close()
        os.close(master)


def read_available(master: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def screen_lines(data: bytes) -> list[str]:
    """What each redraw leaves on one terminal line: split at every carriage return and newline,
    escape sequences removed (cursor moves, colours, erase-to-end-of-line)."""
    text = ANSI.sub(b"", data).decode("utf-8", errors="replace")
    return [segment for segment in re.split(r"[\r\n]", text) if segment]


def snapshots() -> list[ProgressSnapshot]:
    return [WIDE, NO_TOTAL,
            ProgressSnapshot(completed=10**9, failed=10**8, in_flight=10**4, total=10**10,
                             tokens_total=10**14, rate=99_999.9, eta=10**7)]


@pytest.mark.parametrize("use_rich", [False, True], ids=["plain", "rich"])
def test_the_bar_fits_an_80_column_terminal(pty80: tuple[int, Any], use_rich: bool) -> None:
    master, stream = pty80
    bar = TerminalProgressBar(stream, use_rich=use_rich)
    assert bar.uses_rich is use_rich
    for snap in snapshots():
        bar.update(snap)
    bar.close(WIDE)
    lines = screen_lines(read_available(master))
    assert lines, "nothing was drawn"
    assert max(len(line) for line in lines) < 80, lines
    assert any("123,456/1,000,000" in line for line in lines)


def test_the_bar_follows_a_resized_terminal(pty80: tuple[int, Any]) -> None:
    master, stream = pty80
    bar = TerminalProgressBar(stream, use_rich=False)
    bar.update(WIDE)
    first = screen_lines(read_available(master))
    set_terminal_size(stream.fileno(), 50)
    bar.update(WIDE)
    second = screen_lines(read_available(master))
    assert max(map(len, first)) > 60 and max(map(len, second)) < 50


CHILD = """
import trio
from trio_batch_llm import FakeStrategy, ProcessorConfig, process_prompts

async def main():
    config = ProcessorConfig(concurrency=3, progress_interval=0.01)
    prompts = [f"p{i}" for i in range(30)]
    await process_prompts(FakeStrategy(latency=0.01), prompts, config=config, progress=True)

trio.run(main)
print("child done", flush=True)
"""


def test_progress_true_in_a_child_process_on_an_80_column_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    master, slave = os.openpty()
    set_terminal_size(slave, 80)
    try:
        child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=slave, stdout=slave, stderr=slave,
                                 env=env)
    finally:
        os.close(slave)
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed its side
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert child.wait(timeout=30) == 0
    finally:
        os.close(master)
        if child.poll() is None:
            child.kill()
    data = b"".join(chunks)
    lines = screen_lines(data)
    assert "child done" in lines, lines
    bar_lines = [line for line in lines if "/30 (" in line]
    assert bar_lines and any("30/30 (100%)" in line for line in bar_lines)
    assert "━".encode() in data  # rich drew it: rich is a dependency
    assert max(len(line) for line in lines) < 80, lines


# --- notebooks ----------------------------------------------------------------------------------


class FakeHandle:
    def __init__(self, shown: list[Any]) -> None:
        self.shown = shown

    def update(self, obj: Any) -> None:
        self.shown.append(obj)


@pytest.fixture
def fake_kernel(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """An ``IPython`` module in ``sys.modules`` whose shell is a kernel's, and whose
    ``IPython.display.display`` records what it is given."""
    shown: list[Any] = []

    class ZMQInteractiveShell:
        kernel = object()

    def display(obj: Any, *, display_id: bool = False) -> FakeHandle:
        assert display_id is True
        shown.append(obj)
        return FakeHandle(shown)

    ipython = types.ModuleType("IPython")
    ipython.get_ipython = lambda: ZMQInteractiveShell()  # type: ignore[attr-defined]
    ipython_display = types.ModuleType("IPython.display")
    ipython_display.display = display  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setitem(sys.modules, "IPython.display", ipython_display)
    return shown


def test_in_a_notebook_progress_is_one_display_updated_in_place(fake_kernel: list[Any]) -> None:
    assert in_notebook()
    progress = make_progress(True)
    assert isinstance(progress, NotebookProgress)
    half = ProgressSnapshot(completed=50, failed=2, in_flight=5, total=100, rate=3.2, eta=15.6)
    progress.update(half)
    progress.close(ProgressSnapshot(completed=100, failed=2, in_flight=0, total=100, eta=0.0))
    progress.update(half)  # after close: nothing
    assert len(fake_kernel) == 2  # one display(...), then one update(...)
    first, last = fake_kernel
    assert "<progress style='width:20em' value='50' max='100'>" in first._repr_html_()
    assert repr(first).startswith("50/100 (50%) | 2 failed")
    assert "100/100 (100%)" in repr(last)
    assert "value='100' max='100'" in last._repr_html_()


def test_html_of_the_notebook_display_is_escaped(fake_kernel: list[Any]) -> None:
    progress = NotebookProgress()
    progress.update(NO_TOTAL)
    html = fake_kernel[0]._repr_html_()
    assert "<progress style='width:20em'></progress>" in html  # no total: an indeterminate bar
    assert "<code>123,456 done | 7,890 failed" in html


def test_a_terminal_ipython_is_no_notebook(monkeypatch: pytest.MonkeyPatch) -> None:
    class TerminalInteractiveShell:
        pass

    ipython = types.ModuleType("IPython")
    ipython.get_ipython = lambda: TerminalInteractiveShell()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    assert not in_notebook()
    monkeypatch.setattr(ipython, "get_ipython", lambda: None)  # IPython imported, no shell running
    assert not in_notebook()


def test_a_notebook_like_stream_that_is_no_terminal_gets_plain_lines() -> None:
    class KernelStream(io.StringIO):  # what ipykernel's OutStream looks like to us
        def isatty(self) -> bool:
            return False

    stream = KernelStream()
    progress = default_display(stream)
    assert isinstance(progress, LogProgress)
    progress.update(WIDE)
    progress.close(WIDE)
    lines = stream.getvalue().splitlines()
    assert lines == [f"trio-batch-llm progress: {format_progress_line(WIDE, bar_width=0)}",
                     f"trio-batch-llm finished: {format_progress_line(WIDE, bar_width=0)}"]


# --- no terminal: lines that show without any logging set up -----------------------------------------


def test_log_lines_go_to_logging_only_when_logging_would_show_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream = io.StringIO()
    logger = logging.getLogger("trio_batch_llm.progress")
    assert not logger.isEnabledFor(logging.INFO)  # nobody configured it: INFO would be dropped
    LogProgress(stream=stream).close(WIDE)
    assert stream.getvalue().startswith("trio-batch-llm finished: 123,456/1,000,000 (12%)")
    assert caplog.records == []

    caplog.set_level(logging.INFO, logger="trio_batch_llm.progress")  # now logging shows INFO
    stream = io.StringIO()
    LogProgress(stream=stream).close(WIDE)
    assert stream.getvalue() == ""
    messages = [r.getMessage()[:48] for r in caplog.records]
    assert messages == ["finished: 123,456/1,000,000 (12%) | 7,890 failed"]


def test_progress_true_with_stderr_piped_shows_lines_without_logging_configured() -> None:
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=30,
                           check=False)
    assert child.returncode == 0, child.stderr
    lines = child.stderr.splitlines()
    assert lines and lines[-1].startswith("trio-batch-llm finished: 30/30 (100%) | 0 failed"), child.stderr
    assert "\r" not in child.stderr and "\x1b" not in child.stderr
