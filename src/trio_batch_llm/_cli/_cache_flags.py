"""``--cache``, ``--cache-mode``, ``--cache-ttl``, ``--cache-no-request``: the response cache of ``run``
and ``runs start``, checked before anything runs.

``--cache`` takes a SQLite file path, a ``postgresql://`` or a ``redis://`` URL, or nothing: the
platform's default file (``SqliteResponseCache(path=None)``). Every problem is a
:class:`UsageError` naming the flag, with a URL's password replaced by ``<redacted>``: the value
is parsed and its path checked while the command is planned, and :func:`check_cache` opens the
cache once before the first call (as ``--quota`` is pinged), so an unreachable server or a wrong
password is exit status 2, not a run of failed lookups.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Final
from urllib.parse import unquote, urlsplit

import anyio.lowlevel

from .._values._errors import ConfigurationError
from .._values._response_cache import (
    CACHE_MODES,
    CacheMode,
    ResponseCache,
    SqliteResponseCache,
    as_response_cache,
    check_cache_mode,
)
from .._values._urls import REDACTED, redact_url, redact_urls
from ._args import positive_float
from ._command import UsageError

__all__ = ["CACHE_FLAGS", "CacheCheckError", "add_cache_arguments", "cache_mode_of", "cache_of",
           "check_cache", "check_cache_path", "hide_secret"]

CACHE_FLAGS: Final = {"cache_mode": "--cache-mode", "cache_ttl": "--cache-ttl",
                      "cache_no_request": "--cache-no-request"}
"""The flags that only mean something beside ``--cache``."""


class _PlatformDefault(str):
    """``--cache`` given without a value: the platform's default file (a ``str`` so argparse shows it)."""

    __slots__ = ()


PLATFORM_DEFAULT: Final = _PlatformDefault("<platform cache folder>")


class CacheCheckError(Exception):
    """The cache could not be opened before the run (the message has no password in it)."""


def add_cache_arguments(parser: argparse.ArgumentParser) -> None:
    """The response-cache flags ``run`` and ``runs start`` share."""
    group = parser.add_argument_group(
        "response cache (answers kept across runs, keyed by provider, model, the whole request and "
        "the row's \"sample\")")
    group.add_argument("--cache", nargs="?", const=PLATFORM_DEFAULT, metavar="PATH|URL",
                       help="answer repeated requests from this cache: a SQLite file, a postgresql:// or a "
                            "redis:// URL; without a value, response-cache.sqlite3 in the platform's "
                            "cache folder (put a bare --cache after INPUT, or it takes INPUT as its path). "
                            "It stores prompts and answers (files 0600)")
    group.add_argument("--cache-mode", choices=CACHE_MODES, metavar="|".join(CACHE_MODES),
                       help="read-write (the default): use hits, store misses; read-only: never store; "
                            "write-only: never use hits (fill the cache); refresh: never use hits, "
                            "overwrite what is stored")
    group.add_argument("--cache-ttl", type=positive_float, metavar="S",
                       help="serve an entry for S seconds after it was stored (default: until evicted "
                            "or cleared)")
    group.add_argument("--cache-no-request", action="store_true", default=None,
                       help="store only each request's key (a SHA-256), not the prompt and parameters; "
                            "answers are still stored")


def cache_of(args: argparse.Namespace) -> ResponseCache | None:
    """The :class:`ResponseCache` the flags name, or ``None``; :class:`UsageError` naming the flag."""
    given = getattr(args, "cache", None)
    if given is None:
        for name, flag in CACHE_FLAGS.items():
            if getattr(args, name, None) is not None:
                raise UsageError(f"{flag} needs --cache (PATH, postgresql://..., redis://..., or no value "
                                 "for the platform's default file)")
        return None
    settings = {"ttl": getattr(args, "cache_ttl", None),
                "store_request": not getattr(args, "cache_no_request", None)}
    try:
        if isinstance(given, _PlatformDefault):
            return SqliteResponseCache(None, **settings)  # type: ignore[arg-type]
        cache = as_response_cache(given, name="--cache")
        assert cache is not None  # a str is never None
        return dataclasses.replace(cache, **settings)  # type: ignore[arg-type]
    except ConfigurationError as exc:
        shown = redact_url(exc.value) if isinstance(exc.value, str) else exc.value
        flag = {"ttl": "--cache-ttl", "cache": "--cache", "--cache": "--cache"}.get(exc.field, "--cache")
        raise UsageError(f"{flag} {shown}: {redact_urls(exc.problem)}") from None


def cache_mode_of(args: argparse.Namespace) -> CacheMode:
    """``--cache-mode``, ``read-write`` when not given (argparse has checked the choice)."""
    return check_cache_mode(getattr(args, "cache_mode", None) or "read-write", name="--cache-mode")


def check_cache_path(cache: ResponseCache | None, *, source: Path, out: Path | None) -> None:
    """A SQLite ``--cache`` file must be creatable and be neither the input nor the checkpoint:
    SQLite would refuse either as "not a database" only after the run began."""
    if not isinstance(cache, SqliteResponseCache) or cache.path is None:
        return
    path = Path(cache.path)
    if path.exists() and not path.is_file():
        raise UsageError(f"--cache {path}: not a regular file")
    if not path.parent.is_dir():
        raise UsageError(f"--cache {path}: the directory {path.parent} does not exist")
    for other, what in ((source, "the input file"), (out, "the --out checkpoint")):
        if other is not None and path.exists() and other.exists() and path.samefile(other):
            raise UsageError(f"--cache {path} is {what}; choose another path for the cache")


async def check_cache(cache: ResponseCache | None) -> None:
    """Open ``cache`` once and close it before the run starts: a server that cannot be reached, a
    wrong password or a file that is not a cache is :class:`CacheCheckError`, said without secrets."""
    if cache is None:
        await anyio.lowlevel.checkpoint()
        return
    from .._cache._open import open_cache

    try:
        async with open_cache(cache):
            pass
    except Exception as exc:  # noqa: BLE001 - any failure to open is the flag's problem, said plainly
        problem = hide_secret(str(exc), cache) or type(exc).__name__
        raise CacheCheckError(f"--cache {cache.display}: cannot open it: {problem}") from None


def hide_secret(text: str, cache: ResponseCache) -> str:
    """``text`` with every URL redacted and the cache URL's password, however a driver quoted it, too."""
    text = redact_urls(text)
    url = getattr(cache, "url", None)
    if isinstance(url, str):
        try:
            password = urlsplit(url).password
        except ValueError:
            password = None
        for secret in {password, unquote(password or "")} - {None, ""}:
            assert secret is not None
            text = text.replace(secret, REDACTED)
    return text

