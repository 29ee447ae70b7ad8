"""The displays behind ``progress=True``: a terminal bar, a notebook display, or plain lines.

They are part of the library, not of the command line: a script or a
notebook that passes ``progress=True`` gets them. Every display draws
snapshots synchronously, on the thread that calls ``update`` (the engine's
one progress task), and ignores per-item calls. :func:`default_display`
picks one for a stream; :func:`make_progress` imports this module only when
it is asked for one.

- :class:`TerminalProgressBar`: one line redrawn in place, never wider than
  the terminal (its width is asked again at every draw, so a resized window
  is followed); drawn with rich when rich is there, else with plain text.
- :class:`~._notebook.NotebookProgress`: one output cell updated in place,
  in a Jupyter kernel.
- :class:`LogProgress`: a plain line every few seconds, for a stream that is
  no terminal (a CI log, a file). It goes through :mod:`logging` when your
  logging would show it, and straight to the stream otherwise, so
  ``progress=True`` shows something without any logging set up.
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import sys
from typing import IO, Any, Final, final

from ._progress_line import MIN_BAR_WIDTH, fit_progress_line, fit_progress_parts, format_progress_line
from ._snapshot import Progress, ProgressSnapshot

__all__ = [
    "MIN_BAR_WIDTH",
    "LogProgress",
    "TerminalProgressBar",
    "default_display",
    "fit_progress_line",
    "fit_progress_parts",
    "format_progress_line",
    "terminal_columns",
]

def terminal_columns(stream: object = None) -> int:
    """The width to draw in: ``COLUMNS`` if set, else the terminal ``stream`` is on, else
    :func:`shutil.get_terminal_size` (which falls back to 80)."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        columns = os.get_terminal_size(stream.fileno()).columns  # type: ignore[attr-defined]
    except (AttributeError, ValueError, OSError):  # no fileno, a closed stream, not a terminal
        columns = 0
    # A terminal that reports 0 columns (a pseudo-terminal nobody sized) is as good as none.
    return columns if columns > 0 else shutil.get_terminal_size().columns


def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def _load_rich() -> Any | None:
    """The few rich modules we use, or ``None`` when rich is not installed."""
    try:
        return (
            importlib.import_module("rich.console"),
            importlib.import_module("rich.live"),
            importlib.import_module("rich.progress_bar"),
            importlib.import_module("rich.table"),
            importlib.import_module("rich.text"),
        )
    except ImportError:
        return None


@final
class TerminalProgressBar(Progress):
    """A single-line bar redrawn in place, never wider than the terminal.

    ``columns`` fixes the width; by default it is asked at every draw
    (:func:`terminal_columns`). With ``use_rich=None`` it draws with rich when
    rich is installed and the stream is a terminal; rich runs with
    auto-refresh off, so it starts no thread: every draw happens in
    :meth:`update`, on the caller's thread. Otherwise it writes the plain line
    of :func:`fit_progress_line` after a ``\\r`` and erases to the end of the line.
    """

    def __init__(self, stream: IO[str] | None = None, *, bar_width: int = 30,
                 use_rich: bool | None = None, columns: int | None = None) -> None:
        self.stream: IO[str] = sys.stderr if stream is None else stream
        self.bar_width = bar_width
        self.columns = columns
        rich = _load_rich() if use_rich is not False and (use_rich or _isatty(self.stream)) else None
        if use_rich and rich is None:
            raise ImportError("use_rich=True needs the 'rich' package (pip install rich)")
        self._rich = rich
        self._live: Any = None
        self._closed = False

    @property
    def uses_rich(self) -> bool:
        return self._rich is not None

    def _columns(self) -> int:
        return self.columns if self.columns is not None else terminal_columns(self.stream)

    def update(self, snapshot: ProgressSnapshot) -> None:
        if self._closed:
            return
        if self._rich is not None:
            self._rich_draw(snapshot)
            return
        line = fit_progress_line(snapshot, self._columns(), bar_width=self.bar_width)
        self.stream.write(f"\r{line}\x1b[K")
        self.stream.flush()

    def close(self, final: ProgressSnapshot) -> None:
        if self._closed:
            return
        self.update(final)
        self._closed = True
        if self._live is not None:
            self._live.stop()
            self._live = None
            return
        self.stream.write("\n")
        self.stream.flush()

    def _rich_draw(self, snapshot: ProgressSnapshot) -> None:
        if self._rich is None:
            return
        console_mod, live_mod, bar_mod, table_mod, text_mod = self._rich
        columns = max(2, self._columns())
        room = columns - 1  # as for the plain line: the last column stays free
        width, line = fit_progress_parts(snapshot, columns, bar_width=self.bar_width)
        grid = table_mod.Table.grid(padding=(0, 1))
        text = text_mod.Text(line, no_wrap=True, overflow="ellipsis")
        if width:
            # The plain bar's brackets are room for two more cells: the same line, as wide.
            bar = bar_mod.ProgressBar(total=None if snapshot.total is None else max(snapshot.total, 1),
                                      completed=snapshot.completed, width=width + 2,
                                      animation_time=snapshot.elapsed)
            grid.add_row(bar, text)
        else:
            grid.add_row(text)
        if self._live is None:
            console = console_mod.Console(file=self.stream, width=room)
            self._live = live_mod.Live(grid, console=console, auto_refresh=False, transient=False,
                                       redirect_stdout=False, redirect_stderr=False)
            self._live.start(refresh=True)
        else:
            self._live.console.width = room  # follow a resized terminal
            self._live.update(grid, refresh=True)


PROGRESS_LOGGER: Final = "trio_batch_llm.progress"


@final
class LogProgress(Progress):
    """A plain line per ``min_interval`` seconds of run time, and one at close.

    For streams that are not terminals (CI logs, files): no carriage returns,
    no escape sequences. Each line goes through ``logger`` (default
    ``trio_batch_llm.progress``, at ``level``) when logging would show it,
    that is when the logger is enabled for ``level`` and has a handler
    somewhere up its hierarchy; otherwise it is written to ``stream``
    (default ``sys.stderr`` at the time of writing) as
    ``trio-batch-llm progress: ...``. The interval is measured on
    ``snapshot.elapsed``, not a clock of its own.
    """

    def __init__(self, logger: logging.Logger | None = None, *, level: int = logging.INFO,
                 min_interval: float = 10.0, stream: IO[str] | None = None) -> None:
        self.logger = logger if logger is not None else logging.getLogger(PROGRESS_LOGGER)
        self.level = level
        self.min_interval = min_interval
        self.stream = stream
        self._last_logged: float | None = None
        self._closed = False

    def _emit(self, label: str, snapshot: ProgressSnapshot) -> None:
        line = format_progress_line(snapshot, bar_width=0)
        if self.logger.isEnabledFor(self.level) and self.logger.hasHandlers():
            self.logger.log(self.level, "%s: %s", label, line)
            return
        stream = self.stream if self.stream is not None else sys.stderr
        stream.write(f"trio-batch-llm {label}: {line}\n")
        stream.flush()

    def update(self, snapshot: ProgressSnapshot) -> None:
        if self._closed:
            return
        if self._last_logged is not None and snapshot.elapsed - self._last_logged < self.min_interval:
            return
        self._last_logged = snapshot.elapsed
        self._emit("progress", snapshot)

    def close(self, final: ProgressSnapshot) -> None:
        if self._closed:
            return
        self._closed = True
        self._emit("finished", final)


def default_display(stream: IO[str] | None = None) -> Progress:
    """What ``progress=True`` shows: a :class:`~._notebook.NotebookProgress` in a Jupyter
    kernel, a :class:`TerminalProgressBar` when ``stream`` (default ``sys.stderr``) is a
    terminal, else :class:`LogProgress` lines on that stream."""
    from ._notebook import NotebookProgress, in_notebook

    target = sys.stderr if stream is None else stream
    if stream is None and in_notebook():
        return NotebookProgress()
    return TerminalProgressBar(target) if _isatty(target) else LogProgress(stream=stream)
