"""``trio-batch-llm cache stats|clear CACHE``: what a response cache holds, and emptying it.

``CACHE`` is what ``run --cache`` takes: a SQLite file, a ``postgresql://`` or ``redis://``
URL, or nothing for the platform's default file. A SQLite file that does not exist is refused
(exit status 2) rather than created empty, as is a bad value. ``clear`` deletes every entry,
or with ``--older-than S`` those written more than ``S`` seconds ago, and says how many;
claims of runs in flight are left alone. A server that cannot be reached exits with status
69, any other failure (a wrong password, a backend that cannot answer yet) with 1; a URL's
password is shown as ``<redacted>``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from .._values._errors import DatabaseUnavailableError
from .._values._response_cache import ResponseCache, SqliteResponseCache
from ._args import add_backend_argument, positive_float
from ._cache_flags import PLATFORM_DEFAULT, cache_of, hide_secret
from ._command import EXIT_FAILED, EXIT_OK, EXIT_UNAVAILABLE, UsageError

__all__ = ["add_cache_parser", "cache_command"]


def add_cache_parser(sub: Any) -> None:
    """Add ``cache`` and its subcommands to the top-level subparsers ``sub``."""
    cache = sub.add_parser("cache", help="a response cache: stats, clear",
                           description="Look into a response cache (the --cache of `run`) or empty it.")
    group = cache.add_subparsers(dest="cache_command", required=True, metavar="COMMAND")
    for name, text in (("stats", "how many entries the cache holds, their size and age"),
                       ("clear", "delete the cache's entries (all, or those older than --older-than)")):
        command = group.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        command.add_argument("cache", nargs="?", default=PLATFORM_DEFAULT, metavar="PATH|URL",
                             help="a SQLite file, a postgresql:// or redis:// URL (default: the platform's "
                                  "default file)")
        add_backend_argument(command)
        if name == "stats":
            command.add_argument("--json", action="store_true", help="one JSON object instead of text")
        else:
            command.add_argument("--older-than", type=positive_float, metavar="S",
                                 help="only entries written more than S seconds ago")
        command.set_defaults(handler=_handler)


def _handler(args: argparse.Namespace, argv: Sequence[str]) -> int:
    return cache_command(args)


def _target(args: argparse.Namespace) -> ResponseCache:
    cache = cache_of(argparse.Namespace(cache=args.cache))
    assert cache is not None
    if isinstance(cache, SqliteResponseCache):
        path = Path(cache.path) if cache.path is not None else None
        if path is None:
            from .._cache._sqlite_schema import default_cache_path

            path = default_cache_path()
        if not path.is_file():
            raise UsageError(f"{path}: no such cache file" if not path.exists() else f"{path}: not a file")
    return cache


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


async def _stats(cache: ResponseCache, as_json: bool) -> None:
    from .._cache._open import open_cache

    async with open_cache(cache) as connection:
        stats = await connection.stats()
    if as_json:
        print(json.dumps({"cache": cache.display, "entries": stats.entries, "bytes": stats.bytes,
                          "oldest": stats.oldest, "newest": stats.newest}), flush=True)
        return
    size = "unknown" if stats.bytes is None else f"{stats.bytes:,} bytes (approximate)"
    print("\n".join([f"cache       {cache.display}", f"  entries   {stats.entries:,}", f"  size      {size}",
                     f"  oldest    {_when(stats.oldest)}", f"  newest    {_when(stats.newest)}"]), flush=True)


async def _clear(cache: ResponseCache, older_than: float | None) -> None:
    from .._cache._open import open_cache

    async with open_cache(cache) as connection:
        deleted = await connection.clear(older_than=older_than)
    which = "" if older_than is None else f" written more than {older_than:g} s ago"
    print(f"deleted {deleted:,} entries{which} from {cache.display}", flush=True)


def cache_command(args: argparse.Namespace) -> int:
    from ._render import refuse, say  # here, not at the top: the parser is built for every command's --help

    try:
        cache = _target(args)
    except UsageError as exc:
        return refuse(exc)
    try:
        if args.cache_command == "stats":
            anyio.run(_stats, cache, args.json, backend=args.backend)
        else:
            anyio.run(_clear, cache, args.older_than, backend=args.backend)
    except NotImplementedError as exc:
        say(f"error: {cache.display}: this backend cannot do that yet ({exc})")
        return EXIT_FAILED
    except Exception as exc:  # noqa: BLE001 - opening or reading it failed: said without secrets
        say(f"error: {cache.display}: {hide_secret(str(exc), cache) or type(exc).__name__}")
        return EXIT_UNAVAILABLE if isinstance(exc, DatabaseUnavailableError) else EXIT_FAILED
    return EXIT_OK
