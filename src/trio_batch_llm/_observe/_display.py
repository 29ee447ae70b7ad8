"""The displays behind ``progress=True``: a terminal bar, or log lines where there is no terminal.

They are part of the library, not of the command line: a script or a
notebook that passes ``progress=True`` gets them. Both draw snapshots
synchronously, on the thread that calls ``update`` (the engine's one
progress task), and ignore per-item calls. :func:`default_display` picks one for a stream;
:func:`make_progress` imports this module only when it is asked for one.
"""

from __future__ import annotations

import importlib
import logging
import math
import sys
from typing import IO, Any, final

from ._snapshot import Progress, ProgressSnapshot

__all__ = ["LogProgress", "TerminalProgressBar", "default_display", "format_progress_line"]


def _duration(seconds: float) -> str:
    whole = math.ceil(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_progress_line(snapshot: ProgressSnapshot, *, bar_width: int = 30) -> str:
    """One plain-text line; ``bar_width=0`` leaves the bar out.

    ``[######------] 50/100 (50%) | 2 failed | 5 in flight | 3.2 items/s | ETA 0:16 | 1,234 tokens``
    Without a total: ``50 done | 2 failed | ...`` and no bar or ETA.
    """
    parts: list[str] = []
    fraction = snapshot.fraction
    if fraction is None:
        head = f"{snapshot.completed} done"
    else:
        head = f"{snapshot.completed}/{snapshot.total} ({math.floor(fraction * 100)}%)"
        if bar_width > 0:
            filled = math.floor(fraction * bar_width)
            head = f"[{'#' * filled}{'-' * (bar_width - filled)}] {head}"
    parts.append(head)
    parts.append(f"{snapshot.failed} failed")
    if snapshot.replayed:
        parts.append(f"{snapshot.replayed} replayed")
    parts.append(f"{snapshot.in_flight} in flight")
    parts.append(f"{snapshot.rate:.1f} items/s")
    if snapshot.total is not None:
        parts.append("ETA --:--" if snapshot.eta is None else f"ETA {_duration(snapshot.eta)}")
    parts.append(f"{snapshot.tokens_total:,} tokens")
    return " | ".join(parts)


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
    """A single-line bar redrawn in place with ``\\r`` and erase-to-end-of-line.

    With ``use_rich=None`` it draws with ``rich`` when rich is installed and the
    stream is a terminal; rich runs with auto-refresh off, so it starts no
    thread: every draw happens in :meth:`update`, on the caller's thread.
    """

    def __init__(self, stream: IO[str] | None = None, *, bar_width: int = 30,
                 use_rich: bool | None = None) -> None:
        self.stream: IO[str] = sys.stderr if stream is None else stream
        self.bar_width = bar_width
        rich = _load_rich() if use_rich is not False and (use_rich or _isatty(self.stream)) else None
        if use_rich and rich is None:
            raise ImportError("use_rich=True needs the 'rich' package (pip install trio-batch-llm[progress])")
        self._rich = rich
        self._live: Any = None
        self._closed = False

    @property
    def uses_rich(self) -> bool:
        return self._rich is not None

    def update(self, snapshot: ProgressSnapshot) -> None:
        if self._closed:
            return
        if self._rich is not None:
            self._rich_draw(snapshot)
            return
        self.stream.write(f"\r{format_progress_line(snapshot, bar_width=self.bar_width)}\x1b[K")
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
        grid = table_mod.Table.grid(padding=(0, 1))
        bar = bar_mod.ProgressBar(total=None if snapshot.total is None else max(snapshot.total, 1),
                                  completed=snapshot.completed, width=self.bar_width,
                                  animation_time=snapshot.elapsed)
        text = text_mod.Text(format_progress_line(snapshot, bar_width=0), no_wrap=True, overflow="ellipsis")
        grid.add_row(bar, text)
        if self._live is None:
            console = console_mod.Console(file=self.stream)
            self._live = live_mod.Live(grid, console=console, auto_refresh=False, transient=False,
                                       redirect_stdout=False, redirect_stderr=False)
            self._live.start(refresh=True)
        else:
            self._live.update(grid, refresh=True)


@final
class LogProgress(Progress):
    """One INFO line per ``min_interval`` seconds of run time, and one at close.

    For streams that are not terminals (CI logs, files): no carriage returns.
    The interval is measured on ``snapshot.elapsed``, not a clock of its own.
    """

    def __init__(self, logger: logging.Logger | None = None, *, level: int = logging.INFO,
                 min_interval: float = 10.0) -> None:
        self.logger = logger if logger is not None else logging.getLogger("trio_batch_llm.progress")
        self.level = level
        self.min_interval = min_interval
        self._last_logged: float | None = None
        self._closed = False

    def update(self, snapshot: ProgressSnapshot) -> None:
        if self._closed:
            return
        if self._last_logged is not None and snapshot.elapsed - self._last_logged < self.min_interval:
            return
        self._last_logged = snapshot.elapsed
        self.logger.log(self.level, "progress: %s", format_progress_line(snapshot, bar_width=0))

    def close(self, final: ProgressSnapshot) -> None:
        if self._closed:
            return
        self._closed = True
        self.logger.log(self.level, "finished: %s", format_progress_line(final, bar_width=0))


def default_display(stream: IO[str] | None = None) -> Progress:
    """What ``progress=True`` shows: a :class:`TerminalProgressBar` when ``stream`` (default
    ``sys.stderr``) is a terminal, else :class:`LogProgress`."""
    target = sys.stderr if stream is None else stream
    return TerminalProgressBar(target) if _isatty(target) else LogProgress()
