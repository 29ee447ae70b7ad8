"""Warnings for a ProcessorConfig that is valid but almost certainly not what was meant.

Each names the fields and values involved. They are ``UserWarning``s pointing at the
line that built the config, so ``-W error`` turns them into failures in a test suite.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

__all__ = ["open_file_limit", "warn_if_suspicious"]

_STACKLEVEL = 4  # warn_if_suspicious <- __post_init__ <- __init__ <- the caller's line


def open_file_limit() -> int | None:
    """The soft RLIMIT_NOFILE of this process (``None`` where there is none to read)."""
    if sys.platform == "win32":
        return None
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def warn_if_suspicious(config: Any) -> None:
    workers = config.workers
    bound = config.max_provider_concurrency
    if bound is not None and bound > workers:
        _warn(f"max_provider_concurrency={bound} > workers={workers}: no more than {workers} calls run "
              "at once anyway; raise concurrency to get more")
    limit = open_file_limit()
    if limit is not None and workers * 2 > limit:
        _warn(f"concurrency={workers} needs about one open file per connection and this process may open "
              f"{limit} (RLIMIT_NOFILE): expect 'Too many open files'; raise the limit (ulimit -n) or "
              "lower concurrency")


def _warn(message: str) -> None:
    warnings.warn(message, UserWarning, stacklevel=_STACKLEVEL)
