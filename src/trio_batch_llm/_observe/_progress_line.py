"""The progress line: a snapshot as one line of plain text, at full length or fitted to a width.

Every display draws this line (the terminal bar, the notebook display, the
log lines), so its wording lives here, in one place.
"""

from __future__ import annotations

import math
from typing import Final

from ._snapshot import ProgressSnapshot

__all__ = ["MIN_BAR_WIDTH", "duration", "fit_progress_line", "fit_progress_parts", "format_progress_line"]

MIN_BAR_WIDTH: Final = 10
"""A bar narrower than this says nothing; the counters get the room instead."""


def duration(seconds: float) -> str:
    """``m:ss`` (``h:mm:ss`` from an hour), rounded up."""
    return _duration(seconds)


def _duration(seconds: float) -> str:
    whole = math.ceil(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


# Parts after the head, each with its rank: the lowest rank is left out first when space is short.
_RANK_FAILED, _RANK_ETA, _RANK_RATE, _RANK_IN_FLIGHT, _RANK_REPLAYED, _RANK_TOKENS = 6, 5, 4, 3, 2, 1
_RANK_THROTTLED = 7  # why nothing moves: kept longest


def _head(snapshot: ProgressSnapshot) -> str:
    fraction = snapshot.fraction
    if fraction is None:
        return f"{snapshot.completed:,} done"
    return f"{snapshot.completed:,}/{snapshot.total:,} ({math.floor(fraction * 100)}%)"


def _parts(snapshot: ProgressSnapshot) -> list[tuple[int, str]]:
    parts = [(_RANK_FAILED, f"{snapshot.failed:,} failed")]
    if snapshot.not_run:  # a stop kept them from starting: the summary's "not run", not failures
        parts.append((_RANK_FAILED, f"{snapshot.not_run:,} not run"))
    if snapshot.replayed:
        parts.append((_RANK_REPLAYED, f"{snapshot.replayed:,} replayed"))
    parts.append((_RANK_IN_FLIGHT, f"{snapshot.in_flight:,} in flight"))
    if snapshot.waiting_for:  # why nothing moves, as throttled says it: kept longest
        count = f"{snapshot.waiting:,} " if snapshot.waiting else ""
        parts.append((_RANK_THROTTLED, f"{count}waiting for {snapshot.waiting_for}"))
    elif snapshot.waiting:
        parts.append((_RANK_IN_FLIGHT, f"{snapshot.waiting:,} waiting"))
    if snapshot.throttled:
        parts.append((_RANK_THROTTLED, f"throttled: {snapshot.throttled}"))
    parts.append((_RANK_RATE, f"{snapshot.rate:.1f} items/s"))
    if snapshot.total is not None and not snapshot.not_run:  # after a stop the rest will not run
        parts.append((_RANK_ETA, "ETA --:--" if snapshot.eta is None else f"ETA {_duration(snapshot.eta)}"))
    parts.append((_RANK_TOKENS, f"{snapshot.tokens_total:,} tokens"))
    return parts


def _bar(fraction: float, width: int) -> str:
    filled = math.floor(fraction * width)
    return f"[{'#' * filled}{'-' * (width - filled)}] "


def format_progress_line(snapshot: ProgressSnapshot, *, bar_width: int = 30) -> str:
    """One plain-text line, at full length; ``bar_width=0`` leaves the bar out.

    ``[######------] 50/100 (50%) | 2 failed | 5 in flight | 3.2 items/s | ETA 0:16 | 1,234 tokens``
    Throttled: ``... | 0 in flight | 16 waiting | throttled: cooling down 0:42 | ...``.
    Redis down: ``... | 0 in flight | 16 waiting for the quota backend | ...``.
    Without a total: ``50 done | 2 failed | ...`` and no bar or ETA.
    After a stop: ``... | 0 failed | 1,084 not run | 0 in flight | ...`` and no ETA.
    """
    text = " | ".join([_head(snapshot), *(part for _, part in _parts(snapshot))])
    fraction = snapshot.fraction
    if fraction is None or bar_width <= 0:
        return text
    return _bar(fraction, bar_width) + text


def fit_progress_line(snapshot: ProgressSnapshot, columns: int, *, bar_width: int = 30) -> str:
    """:func:`format_progress_line` cut to at most ``columns - 1`` characters, so it never wraps.

    The last column stays free: some terminals wrap as soon as it is written.
    Space is given up in this order: the bar narrows to :data:`MIN_BAR_WIDTH`;
    the least useful parts go (tokens, replayed, in flight, rate), keeping the
    counts, the failures and the ETA; then the bar goes, then the rest of the
    parts; a line still too long is cut with ``…``.
    """
    width, text = fit_progress_parts(snapshot, columns, bar_width=bar_width)
    fraction = snapshot.fraction
    return text if width == 0 or fraction is None else _bar(fraction, width) + text


def fit_progress_parts(snapshot: ProgressSnapshot, columns: int, *, bar_width: int = 30) -> tuple[int, str]:
    """``(bar width, text)`` of :func:`fit_progress_line`: a bar of that many cells (0: none),
    drawn in ``bar width + 3`` columns with its brackets and a space, then the text."""
    room = max(1, columns - 1)
    head = _head(snapshot)
    kept = _parts(snapshot)
    can_bar = snapshot.fraction is not None and bar_width > 0

    def text() -> str:
        return " | ".join([head, *(part for _, part in kept)])

    while True:
        line = text()
        if can_bar:
            width = min(bar_width, room - len(line) - 3)  # "[" + bar + "] "
            if width >= min(MIN_BAR_WIDTH, bar_width):
                return width, line
        elif len(line) <= room:
            return 0, line
        droppable = [part for part in kept if part[0] < _RANK_ETA]
        if not droppable:
            break
        kept.remove(min(droppable, key=lambda part: part[0]))
    while kept and len(text()) > room:
        kept.remove(min(kept, key=lambda part: part[0]))
    line = text()
    return 0, line if len(line) <= room else line[: room - 1] + "…"
