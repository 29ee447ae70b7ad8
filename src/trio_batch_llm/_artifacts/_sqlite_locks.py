"""Waiting for another connection's SQLite lock, with one bound, where SQLite itself gives up at once.

A connection's busy timeout makes most lock waits wait; not all. Where waiting
could deadlock, SQLite returns ``SQLITE_BUSY`` at once without calling its
busy handler. The case that bites a database shared by processes:
``PRAGMA journal_mode=WAL`` on a file still in rollback mode while another
connection holds its write lock, which is exactly what every other process
sees while the first one turns a fresh file into a WAL database. (A read
transaction upgrading to a write is another; the stores here only ever write
inside ``BEGIN IMMEDIATE``, which takes the write lock first.)

So each step that takes a lock runs through :func:`retry_busy`: on
``SQLITE_BUSY`` it sleeps briefly and tries again, with the connection's own
busy timeout cut to the time left, until ``bound`` seconds after the first
try. Only then does the ``SQLITE_BUSY`` reach the caller, who names the
database and the bound (:func:`busy_message`). Blocking by design: these run
in the stores' worker threads.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Callable
from typing import Final, TypeVar

from .._values._errors import ConfigurationError

__all__ = ["busy_message", "check_busy_timeout", "is_busy", "retry_busy", "set_busy_timeout"]

T = TypeVar("T")

_SQLITE_BUSY: Final = 5
_MAX_MILLISECONDS: Final = 2**31 - 1  # sqlite3_busy_timeout() takes a C int
_FIRST_PAUSE: Final = 0.001
_LONGEST_PAUSE: Final = 0.05


def check_busy_timeout(value: object) -> float:
    """``value`` as seconds: a real number, finite and >= 0; else :class:`ConfigurationError`."""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        seconds = math.nan
    if isinstance(value, (bool, str, bytes)) or not math.isfinite(seconds) or seconds < 0:
        raise ConfigurationError("busy_timeout", value, "must be a finite number of seconds >= 0")
    return seconds


def set_busy_timeout(conn: sqlite3.Connection, seconds: float) -> None:
    conn.execute(f"PRAGMA busy_timeout={min(_MAX_MILLISECONDS, max(0, int(seconds * 1000)))}")


def is_busy(exc: BaseException) -> bool:
    """``SQLITE_BUSY`` or one of its extended codes (recovery, snapshot, timeout)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.OperationalError) and isinstance(code, int) and code & 0xFF == _SQLITE_BUSY


def retry_busy(conn: sqlite3.Connection, bound: float, step: Callable[[], T]) -> T:
    """``step()``, tried again on ``SQLITE_BUSY`` until ``bound`` seconds have passed; see the module
    docstring. ``step`` must be safe to repeat after a ``SQLITE_BUSY`` (a lock it did not get)."""
    deadline = time.monotonic() + bound
    pause = _FIRST_PAUSE
    shortened = False
    try:
        while True:
            try:
                return step()
            except sqlite3.OperationalError as exc:
                remaining = deadline - time.monotonic()
                if not is_busy(exc) or remaining <= 0:
                    raise
            time.sleep(min(pause, remaining))
            pause = min(2 * pause, _LONGEST_PAUSE)
            # The next try's own wait, if SQLite waits at all this time, ends at the bound too.
            set_busy_timeout(conn, deadline - time.monotonic())
            shortened = True
    finally:
        if shortened:
            set_busy_timeout(conn, bound)


def busy_message(bound: float) -> str:
    return (
        f"the database stayed locked by another connection for longer than busy_timeout={bound:g} s "
        "(another process holds its write lock)"
    )
