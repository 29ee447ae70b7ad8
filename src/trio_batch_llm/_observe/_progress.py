"""Progress: what a run has done so far, and the ways of showing it.

The engine owns the driving. It keeps a :class:`ProgressTracker` (plain
counters, no clock of its own), and from its one owned progress task calls
``progress.update(tracker.snapshot(now))`` at most every ``progress_interval``.
When an item finishes a worker calls ``progress.on_item(...)`` (sync, O(1)) or
``await progress.on_item_async(...)``; at close, ``await progress.aclose(final)``.

Renderers (:class:`TerminalProgressBar`, :class:`LogProgress`) draw snapshots and
ignore per-item calls. :class:`CallbackProgress` adapts the user's per-item
callable ``(completed, total, item_id)`` and ignores snapshots. A synchronous
user callable runs in a worker thread behind a ``CapacityLimiter(1)``, never on
the event loop; calls arriving while it is busy are coalesced into one pending
call (the newest), and the newest call is always delivered in the end.
"""

from __future__ import annotations

import collections
import importlib
import inspect
import logging
import math
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import IO, Any, TypeAlias, final

import anyio
import anyio.lowlevel
import anyio.to_thread

__all__ = [
    "CallbackProgress",
    "CallbackProgressStatistics",
    "LogProgress",
    "Progress",
    "ProgressCallback",
    "ProgressSnapshot",
    "ProgressTracker",
    "TerminalProgressBar",
    "format_progress_line",
    "make_progress",
]

ProgressCallback: TypeAlias = Callable[[int, "int | None", str], "Awaitable[None] | None"]
"""The user's per-item callable ``(completed, total, item_id)``, sync or async."""

_ItemCall: TypeAlias = tuple[int, "int | None", str]


@final
@dataclass(frozen=True, slots=True)
class ProgressSnapshot:
    """The state of a run at one instant.

    ``completed`` counts items with a final result, failures and replays
    included; ``failed`` and ``replayed`` are parts of it. ``rate`` is live
    completions per second over a recent window (replays excluded, they cost
    nothing); ``eta`` is seconds left at that rate, ``None`` when unknown.
    """

    completed: int
    failed: int
    in_flight: int
    total: int | None
    replayed: int = 0
    tokens_total: int = 0
    elapsed: float = 0.0
    rate: float = 0.0
    eta: float | None = None

    @property
    def succeeded(self) -> int:
        return self.completed - self.failed

    @property
    def fraction(self) -> float | None:
        """Share of ``total`` completed, in ``[0, 1]``; ``None`` without a total."""
        if self.total is None:
            return None
        if self.total <= 0:
            return 1.0
        return min(1.0, max(0.0, self.completed / self.total))


class ProgressTracker:
    """Counters plus a windowed completion rate; synchronous, fed by the engine.

    Times are whatever clock the caller passes (``anyio.current_time()``), so
    a virtual clock gives exact rates in tests.
    """

    def __init__(self, *, start: float, total: int | None = None, window: float = 10.0) -> None:
        if window <= 0:
            raise ValueError(f"window={window!r}: must be > 0")
        self.total = total
        self.window = window
        self._start = start
        self.started = 0
        self.completed = 0
        self.failed = 0
        self.replayed = 0
        self.tokens_total = 0
        # (time, live completions) samples, thinned so the deque stays ~100 long.
        self._samples: collections.deque[tuple[float, int]] = collections.deque([(start, 0)])

    def item_started(self) -> None:
        self.started += 1

    def item_finished(self, *, success: bool, tokens: int = 0) -> None:
        self.completed += 1
        self.failed += not success
        self.tokens_total += tokens

    def item_replayed(self, *, success: bool) -> None:
        """An item answered from the artifact store: complete, but never started."""
        self.completed += 1
        self.replayed += 1
        self.failed += not success

    def snapshot(self, now: float) -> ProgressSnapshot:
        live = self.completed - self.replayed
        samples = self._samples
        if now - samples[-1][0] >= self.window / 100:
            samples.append((now, live))
        # Keep one sample at or before the window's start, so the rate spans the whole window.
        while len(samples) >= 2 and samples[1][0] <= now - self.window:
            samples.popleft()
        since, live_then = samples[0]
        rate = (live - live_then) / (now - since) if now > since else 0.0
        eta: float | None = None
        if self.total is not None:
            remaining = max(0, self.total - self.completed)
            eta = 0.0 if remaining == 0 else (remaining / rate if rate > 0 else None)
        return ProgressSnapshot(
            completed=self.completed,
            failed=self.failed,
            in_flight=max(0, self.started - live),
            total=self.total,
            replayed=self.replayed,
            tokens_total=self.tokens_total,
            elapsed=max(0.0, now - self._start),
            rate=rate,
            eta=eta,
        )


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


class Progress:
    """What the engine drives. Every method has a do-nothing default.

    - ``update(snapshot)``: sync and cheap; from the engine's progress task,
      at most every ``progress_interval``.
    - ``on_item(completed, total, item_id)``: sync, O(1), never blocks; when an item finishes.
    - ``await on_item_async(...)``: the same, and delivers it if that takes awaiting.
    - ``close(final)`` / ``await aclose(final)``: last draw and last delivery; idempotent.
    """

    def update(self, snapshot: ProgressSnapshot) -> None:
        """Show ``snapshot``."""

    def on_item(self, completed: int, total: int | None, item_id: str) -> None:
        """Note that ``item_id`` finished, ``completed`` of ``total`` so far."""

    async def on_item_async(self, completed: int, total: int | None, item_id: str) -> None:
        self.on_item(completed, total, item_id)
        await anyio.lowlevel.checkpoint()

    def close(self, final: ProgressSnapshot) -> None:
        """Show ``final`` and stop."""

    async def aclose(self, final: ProgressSnapshot) -> None:
        self.close(final)
        await anyio.lowlevel.checkpoint()


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


@final
@dataclass(frozen=True, slots=True)
class CallbackProgressStatistics:
    delivered: int
    """Calls the user callable has received."""
    coalesced: int
    """Calls replaced by a newer one before they could be delivered."""
    pending: bool
    delivering: bool


def _is_async_callable(fn: object) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    # An object whose class defines ``async def __call__``.
    return not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__)


@final
class CallbackProgress(Progress):
    """Adapts the user's per-item callable ``(completed, total, item_id)``.

    One delivery runs at a time. ``on_item_async`` delivers when nothing is
    being delivered: an async callable is awaited in the caller's task; a sync
    one runs in a worker thread behind ``limiter`` (an owned
    ``CapacityLimiter(1)`` unless the engine passes its own), and the caller
    waits for that thread, so no thread outlives the call. A call that arrives
    while a delivery is running becomes the single pending call (replacing an
    older pending one) and returns at once; the running delivery delivers it
    next, so the newest call is always delivered. A delivery interrupted by
    cancellation before the callable started keeps its call pending;
    :meth:`aclose` delivers whatever is still pending.

    An exception from the callable propagates to the task delivering it.
    """

    def __init__(self, fn: ProgressCallback, *, limiter: anyio.CapacityLimiter | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"progress callback must be callable, not {type(fn).__name__}")
        self.fn = fn
        self._is_async = _is_async_callable(fn)
        self._limiter = limiter
        self._pending: _ItemCall | None = None
        self._delivering = False
        self._idle: anyio.Event | None = None
        self._delivered = 0
        self._coalesced = 0

    def statistics(self) -> CallbackProgressStatistics:
        return CallbackProgressStatistics(self._delivered, self._coalesced,
                                          self._pending is not None, self._delivering)

    def on_item(self, completed: int, total: int | None, item_id: str) -> None:
        if self._pending is not None:
            self._coalesced += 1
        self._pending = (completed, total, item_id)

    async def on_item_async(self, completed: int, total: int | None, item_id: str) -> None:
        self.on_item(completed, total, item_id)
        if self._delivering or self._pending is None:
            await anyio.lowlevel.checkpoint()
            return
        await self._drain(self._take_pending())

    async def aclose(self, final: ProgressSnapshot) -> None:
        # Let a delivery running in another task finish first: it may leave a
        # pending call behind (if it was cancelled), which is delivered here.
        while self._delivering and self._idle is not None:
            await self._idle.wait()
        if self._pending is None:
            await anyio.lowlevel.checkpoint()
            return
        await self._drain(self._take_pending())

    def _take_pending(self) -> _ItemCall:
        call, self._pending = self._pending, None
        assert call is not None
        return call

    async def _drain(self, call: _ItemCall) -> None:
        """Deliver ``call``, then whatever became pending meanwhile, newest only."""
        self._delivering = True
        self._idle = anyio.Event()
        try:
            await self._deliver(call)
            while self._pending is not None:
                await self._deliver(self._take_pending())
        finally:
            self._delivering = False
            self._idle.set()

    async def _deliver(self, call: _ItemCall) -> None:
        started = False

        def in_thread() -> object:
            nonlocal started
            started = True
            return self.fn(*call)

        try:
            if self._is_async:
                started = True
                await self.fn(*call)  # type: ignore[misc]
            else:
                if self._limiter is None:
                    self._limiter = anyio.CapacityLimiter(1)
                result = await anyio.to_thread.run_sync(in_thread, limiter=self._limiter)
                if inspect.isawaitable(result):  # a sync-looking callable that returned a coroutine
                    await result
        except BaseException:
            if not started and self._pending is None:
                self._pending = call  # never lose the newest call to a cancellation before it ran
            raise
        self._delivered += 1


def make_progress(progress: bool | ProgressCallback | Progress | None, *,
                  stream: IO[str] | None = None) -> Progress | None:
    """The engine's ``progress=`` argument as a :class:`Progress`, or ``None`` for none.

    ``True``: a :class:`TerminalProgressBar` when ``stream`` (default
    ``sys.stderr``) is a terminal, else :class:`LogProgress`. A callable:
    :class:`CallbackProgress`. A :class:`Progress`: itself. ``False``/``None``: ``None``.
    """
    if progress is None or progress is False:
        return None
    if progress is True:
        target = sys.stderr if stream is None else stream
        return TerminalProgressBar(target) if _isatty(target) else LogProgress()
    if isinstance(progress, Progress):
        return progress
    if callable(progress):
        return CallbackProgress(progress)
    raise TypeError(f"progress must be a bool, a callable or a Progress, not {type(progress).__name__}")
