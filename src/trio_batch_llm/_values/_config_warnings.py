"""Warnings for a ProcessorConfig that is valid but almost certainly not what was meant.

Each names the fields and values involved. They are ``UserWarning``s pointing at the
line that built the config, so ``-W error`` turns them into failures in a test suite.

The capacity warnings say that ``concurrency`` asks for more calls at once than the
process can carry: more sockets than its open-file limit leaves (checked when a config is
made), or more connections than a strategy's HTTP pool holds (checked when an owner first
uses the strategy, :func:`warn_if_pool_too_small`). Each is given once per process: a
config copied with ``dataclasses.replace`` (as the entry points do) or a strategy used by
one ``call()`` after another does not repeat it.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Final

__all__ = ["open_file_limit", "open_files", "warn_if_pool_too_small", "warn_if_suspicious"]

_STACKLEVEL = 4  # warn_if_suspicious <- __post_init__ <- __init__ <- the caller's line
_FILE_MARGIN: Final = 64
"""Files the process will open besides the calls' sockets (checkpoints, caches, logs, DNS, Redis)."""
_FEW_WORKERS: Final = 32
"""At or below this many workers the open files are not counted: no file limit in use is that small,
and every ``call()`` makes configs of one or five workers (a directory listing each would be waste)."""

_WARNED: set[tuple[object, ...]] = set()
"""The capacity warnings given in this process, by what they are about (not by their text)."""


def open_file_limit() -> int | None:
    """The soft RLIMIT_NOFILE of this process (``None`` where there is none to read)."""
    if sys.platform == "win32":
        return None
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def open_files() -> int | None:
    """How many files this process has open now (``None`` where the system does not list them)."""
    for table in ("/proc/self/fd", "/dev/fd"):
        try:
            return max(0, len(os.listdir(table)) - 1)  # less the listing's own descriptor
        except OSError:
            continue
    return None


def warn_if_suspicious(config: Any) -> None:
    workers = config.workers
    bound = config.max_provider_concurrency
    if bound is not None and bound > workers:
        _warn(f"max_provider_concurrency={bound} > workers={workers}: no more than {workers} calls run "
              "at once anyway; raise concurrency to get more")
    if workers <= _FEW_WORKERS:
        return
    limit = open_file_limit()
    if limit is None:
        return
    already = open_files() or 0
    room = limit - already - _FILE_MARGIN
    if workers > room and _first(("files", workers, limit)):
        _warn(f"concurrency={workers} needs about one open file per connection, and this process may open "
              f"{limit} (RLIMIT_NOFILE), {already} of them open already and {_FILE_MARGIN} kept for other "
              f"files: room for {max(room, 0)} connections; expect 'Too many open files'. Raise the limit "
              f"(ulimit -n {max(8192, 4 * workers)}, or resource.setrlimit) or lower concurrency")


def warn_if_pool_too_small(strategy: Any, concurrency: int) -> None:
    """Warn when ``strategy``'s HTTP connection pool holds fewer connections than ``concurrency``
    calls at once: the calls past it wait for a connection inside their attempt, on its timeout.

    Read once per owner and strategy (when the owner first uses it), never per call. A strategy
    says its pool through ``connection_limit`` (``None``: unknown, or sized by the engine)."""
    try:
        limit = getattr(strategy, "connection_limit", None)
    except Exception:  # noqa: BLE001 - a diagnostic: a strategy whose property fails is not warned about
        return
    if not isinstance(limit, int) or isinstance(limit, bool) or concurrency <= limit:
        return
    name = type(strategy).__name__
    if _first(("pool", name, id(strategy), concurrency, limit)):
        warnings.warn(
            f"concurrency={concurrency} but {name}'s HTTP connection pool holds {limit} connections: the "
            f"calls past {limit} wait for a connection inside their attempt, on attempt_timeout's time. "
            f"Give the strategy concurrency={concurrency} (or a client with Limits(max_connections="
            f"{concurrency})), or lower concurrency to {limit}",
            UserWarning,
            stacklevel=2,
        )


def _first(about: tuple[object, ...]) -> bool:
    """Whether the capacity warning ``about`` is new in this process (and remember it)."""
    if about in _WARNED:
        return False
    _WARNED.add(about)
    return True


def _warn(message: str) -> None:
    warnings.warn(message, UserWarning, stacklevel=_STACKLEVEL)
