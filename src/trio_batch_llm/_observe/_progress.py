"""Progress as the engine keeps it: the tracker, the user's callback adapted, ``progress=`` resolved.

The engine owns the driving. It keeps a :class:`ProgressTracker` (plain
counters, no clock of its own), and from its one owned progress task calls
``progress.update(tracker.snapshot(now))`` at most every ``progress_interval``.
When an item finishes a worker calls ``progress.on_item(...)`` (sync, O(1)) or
``await progress.on_item_async(...)``; at close, ``await progress.aclose(final)``.

:class:`CallbackProgress` adapts the user's per-item callable
``(completed, total, item_id)`` and ignores snapshots. A synchronous user
callable runs in a worker thread behind a ``CapacityLimiter(1)``, never on the
event loop; calls arriving while it is busy are coalesced into one pending
call (the newest), and the newest call is always delivered in the end.
:func:`make_progress` turns the engine's ``progress=`` argument into a
:class:`Progress`; the displays that ``progress=True`` shows are in
:mod:`._display`, loaded only then.
"""

from __future__ import annotations

import collections
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Final, TypeAlias, final

import anyio
import anyio.lowlevel
import anyio.to_thread

from ._callables import is_async_callable
from ._progress_line import duration
from ._snapshot import Progress, ProgressSnapshot, estimate_eta

if TYPE_CHECKING:
    from .._values._quota_reports import QuotaScopeStatistics

__all__ = [
    "QUOTA_BACKEND",
    "CallbackProgress",
    "CallbackProgressStatistics",
    "ProgressCallback",
    "ProgressTracker",
    "make_progress",
]

ProgressCallback: TypeAlias = Callable[[int, "int | None", str], "Awaitable[None] | None"]
"""The user's per-item callable ``(completed, total, item_id)``, sync or async."""

_ItemCall: TypeAlias = tuple[int, "int | None", str]


REFUSING_SHOWN_AFTER: Final = 10.0
"""Seconds of nothing but 429s before progress calls a scope throttled (a lone 429 is no news)."""

ScopeStatistics: TypeAlias = Callable[[], "list[QuotaScopeStatistics]"]

QUOTA_BACKEND: Final = "the quota backend"
"""What items wait for while the shared quota backend (Redis) cannot be reached: ``waiting_for``."""


def throttle_note(scopes: list[QuotaScopeStatistics]) -> str:
    """Why the provider holds the run back, from its scopes' statistics (``""``: it does not)."""
    cooling = max((s.cooldown_remaining for s in scopes), default=0.0)
    if cooling > 0:
        return f"cooling down {duration(cooling)}"
    refusing = max((s.refusing_for for s in scopes), default=0.0)
    if refusing >= REFUSING_SHOWN_AFTER:
        return f"every call refused for {duration(refusing)}"
    return ""


class ProgressTracker:
    """Counters plus a windowed completion rate; synchronous, fed by the engine.

    Times are whatever clock the caller passes (``anyio.current_time()``), so
    a virtual clock gives exact rates in tests. ``scopes``, when given, reads the
    run's quota scopes: calls in flight, items waiting, and whether it is throttled
    or waits for the shared quota backend.
    """

    def __init__(self, *, start: float, total: int | None = None, window: float = 10.0,
                 scopes: ScopeStatistics | None = None) -> None:
        if window <= 0:
            raise ValueError(f"window={window!r}: must be > 0")
        self.scopes = scopes
        self.total = total
        self.window = window
        self._start = start
        self.started = 0
        self._ended = 0  # started items with their result
        self.completed = 0
        self.failed = 0
        self.not_run = 0
        self.replayed = 0
        self.tokens_total = 0
        # (time, live completions) samples, thinned so the deque stays ~100 long.
        self._samples: collections.deque[tuple[float, int]] = collections.deque([(start, 0)])

    def item_started(self) -> None:
        self.started += 1

    def item_finished(self, *, success: bool, tokens: int = 0, not_run: bool = False,
                      started: bool = True) -> None:
        """An item's result. ``not_run``: a stop kept it from its first call (no progress, no
        failure); ``started=False``: it never reached :meth:`item_started` (a stop took it from
        the queue)."""
        self._ended += started
        if not_run:
            self.not_run += 1
        else:
            self.completed += 1
            self.failed += not success
        self.tokens_total += tokens

    def item_replayed(self, *, success: bool) -> None:
        """An item answered from the artifact store: complete, but never started."""
        self.completed += 1
        self.replayed += 1
        self.failed += not success

    def snapshot(self, now: float) -> ProgressSnapshot:
        # Items that ran to their end: replays cost nothing, not-run items never ran.
        live = self.completed - self.replayed
        samples = self._samples
        if now - samples[-1][0] >= self.window / 100:
            samples.append((now, live))
        # Keep one sample at or before the window's start, so the rate spans the whole window.
        while len(samples) >= 2 and samples[1][0] <= now - self.window:
            samples.popleft()
        since, live_then = samples[0]
        rate = (live - live_then) / (now - since) if now > since else 0.0
        eta = estimate_eta(self.total, self.completed, self.not_run, rate)
        active = max(0, self.started - self._ended)
        in_flight, waiting, throttled, waiting_for = active, 0, "", ""
        if self.scopes is not None and (scopes := self.scopes()):
            # A call holds its scope's slot: items waiting on a cooldown or a backoff hold none, and
            # one that holds a slot while the shared quota backend grants its share has no call yet.
            in_flight = min(active, sum(stats.in_flight - stats.backend_waiting for stats in scopes))
            waiting, throttled = active - in_flight, throttle_note(scopes)
            if any(stats.backend_unreachable and stats.backend_waiting for stats in scopes):
                waiting_for = QUOTA_BACKEND
        return ProgressSnapshot(
            completed=self.completed,
            failed=self.failed,
            in_flight=in_flight,
            waiting=waiting,
            throttled=throttled,
            total=self.total,
            replayed=self.replayed,
            tokens_total=self.tokens_total,
            elapsed=max(0.0, now - self._start),
            rate=rate,
            eta=eta,
            not_run=self.not_run,
            waiting_for=waiting_for,
        )


@final
@dataclass(frozen=True, slots=True)
class CallbackProgressStatistics:
    delivered: int
    """Calls the user callable has received."""
    coalesced: int
    """Calls replaced by a newer one before they could be delivered."""
    pending: bool
    delivering: bool


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
        self._is_async = is_async_callable(fn)
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

    ``True``: the default display for ``stream`` (default ``sys.stderr``): a
    terminal bar, or log lines when it is not a terminal. A callable:
    :class:`CallbackProgress`. A :class:`Progress`: itself. ``False``/``None``: ``None``.
    """
    if progress is None or progress is False:
        return None
    if progress is True:
        from ._display import default_display  # the displays load only when one is shown

        return default_display(stream)
    if isinstance(progress, Progress):
        return progress
    if callable(progress):
        return CallbackProgress(progress)
    raise TypeError(f"progress must be a bool, a callable or a Progress, not {type(progress).__name__}")
