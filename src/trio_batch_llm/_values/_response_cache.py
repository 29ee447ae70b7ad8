"""Response-cache values: where a cache lives and how it behaves, never a connection.

A response cache maps the content of a request (provider, model, the whole request, a
sample index) to a validated answer, shared by runs, processes and machines. Like
:class:`RedisQuotaBackend`, these are configuration values: they hold a path or a URL
and knobs; each owner opens its own connection (``_cache/``) for as long as it runs.

``ProcessorConfig(cache=...)`` takes one of them, or a string: a ``postgresql://`` or
``redis://`` URL, or a SQLite file path (:func:`as_response_cache`). A URL's password
is kept out of every repr, log line and error.

A cache stores prompts and answers. Files are created ``0600``; ``store_request=False``
keeps only the key's digest, not the request it was made from.
"""

from __future__ import annotations

import math
import os
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final, Literal, TypeGuard, get_args

from ._errors import ConfigurationError
from ._urls import redact_url

__all__ = [
    "CACHE_MODES",
    "CacheMode",
    "MemoryResponseCache",
    "PostgresResponseCache",
    "RedisResponseCache",
    "ResponseCache",
    "SqliteResponseCache",
    "as_response_cache",
]

CacheMode = Literal["read-write", "read-only", "write-only", "refresh"]
"""How an owner uses its cache: ``read-write`` (the default) reads a hit and writes a miss's answer;
``read-only`` never writes; ``write-only`` never reads (it fills the cache); ``refresh`` never reads
and overwrites what it makes."""
CACHE_MODES: Final[tuple[str, ...]] = get_args(CacheMode)

DEFAULT_LEASE_SECONDS: Final = 60.0
"""How long a key claimed by one process stays claimed without renewal (a holder that died lets go)."""


def _ttl(value: object) -> float | None:
    """``value`` as a TTL in seconds, or ``None``."""
    if value is None:
        return None
    if not _finite_positive(value):
        raise ConfigurationError(
            "ttl", value, "must be a finite number of seconds > 0, or None (keep forever)")
    return float(value)


def _finite_positive(value: object) -> TypeGuard[float]:
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and math.isfinite(value) and value > 0)


def _positive(name: str, value: object) -> float:
    if not _finite_positive(value):
        raise ConfigurationError(name, value, "must be a finite number > 0")
    return float(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseCache:
    """What every response cache has: the entry lifetime, whether requests are stored, the key lease.

    Use one of :class:`SqliteResponseCache`, :class:`PostgresResponseCache`,
    :class:`RedisResponseCache` or :class:`MemoryResponseCache`.
    """

    ttl: float | None = None
    """Seconds an entry is served after it was written; ``None``: until evicted or cleared."""
    store_request: bool = True
    """Keep the request (messages, params) beside the answer; ``False``: only the key's digest."""
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    """How long a process's claim on a key (single flight) lasts without renewal."""

    def __post_init__(self) -> None:
        if type(self) is ResponseCache:
            raise TypeError("ResponseCache is a base: use SqliteResponseCache, PostgresResponseCache, "
                            "RedisResponseCache or MemoryResponseCache")
        object.__setattr__(self, "ttl", _ttl(self.ttl))
        object.__setattr__(self, "lease_seconds", _positive("lease_seconds", self.lease_seconds))
        if not isinstance(self.store_request, bool):
            raise ConfigurationError("store_request", self.store_request, "must be True or False")

    @property
    def display(self) -> str:
        """Where the cache lives, with any password hidden: the only form ever shown."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class SqliteResponseCache(ResponseCache):
    """A cache in one SQLite file, shared by the processes of one machine.

    ``path=None``: ``response-cache.sqlite3`` in the platform's cache folder
    (``$XDG_CACHE_HOME/trio-batch-llm``, ``~/Library/Caches/trio-batch-llm``, ``%LOCALAPPDATA%``).
    ``max_bytes``: the size the file is kept near, least recently used entries evicted first
    after a write takes its pages in use past it, down to 90 % (approximate: the last entry
    written and the ``-wal`` file come on top; ``None``: no bound).
    """

    path: str | os.PathLike[str] | None = None
    _: KW_ONLY
    max_bytes: int | None = 1 << 30

    def __post_init__(self) -> None:
        ResponseCache.__post_init__(self)
        if self.path is not None and not isinstance(self.path, (str, os.PathLike)):
            raise ConfigurationError("path", self.path,
                                     "must be a file path, or None (the platform's cache folder)")
        if self.path is not None and not str(self.path):
            raise ConfigurationError("path", self.path, "must not be empty")
        m = self.max_bytes
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 4096):
            raise ConfigurationError("max_bytes", m, "must be a whole number of bytes >= 4096, or None")

    @property
    def display(self) -> str:
        return str(self.path) if self.path is not None else "<platform cache folder>"


@dataclass(frozen=True, slots=True)
class _URLCache(ResponseCache):
    url: str

    _SCHEMES: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        ResponseCache.__post_init__(self)
        if not isinstance(self.url, str) or not self.url.startswith(self._SCHEMES):
            shown = redact_url(self.url) if isinstance(self.url, str) else self.url
            raise ConfigurationError("cache", shown, f"must be a {' or '.join(self._SCHEMES)} URL")

    @property
    def display(self) -> str:
        return redact_url(self.url)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.display!r}, ttl={self.ttl!r}, "
                f"store_request={self.store_request!r})")


@dataclass(frozen=True, slots=True, repr=False)
class PostgresResponseCache(_URLCache):
    """A cache in a PostgreSQL table (created when missing), shared by processes on any machine."""

    _SCHEMES: ClassVar[tuple[str, ...]] = ("postgresql://", "postgres://")
    _: KW_ONLY
    table: str = "trio_batch_llm_response_cache"


@dataclass(frozen=True, slots=True, repr=False)
class RedisResponseCache(_URLCache):
    """A cache in Redis (one key per entry, expiring by ``ttl``), shared by processes on any machine.
    ``cluster=True``: a Redis Cluster, the URL naming one seed node."""

    _SCHEMES: ClassVar[tuple[str, ...]] = ("redis://", "rediss://", "unix://")
    _: KW_ONLY
    namespace: str = "trio-batch-llm:cache"
    cluster: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryResponseCache(ResponseCache):
    """A cache in this process's memory (tests, notebooks): shared by every owner given this value."""

    entries: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def display(self) -> str:
        return "<memory>"


def as_response_cache(value: object, *, name: str = "cache") -> ResponseCache | None:
    """``value`` as a :class:`ResponseCache`: a cache as is, a ``postgresql://``/``redis://`` URL, or a
    SQLite file path (``str`` or ``Path``); ``None`` stays ``None``. A ``ConfigurationError`` names
    ``name`` and the value (a URL's password hidden) otherwise."""
    if value is None or isinstance(value, ResponseCache):
        return value
    if isinstance(value, str):
        if value.startswith(("postgresql://", "postgres://")):
            return PostgresResponseCache(value)
        if value.startswith(("redis://", "rediss://", "unix://")):
            return RedisResponseCache(value)
        if "://" in value:
            raise ConfigurationError(name, redact_url(value),
                                     "must be a SQLite file path, a postgresql:// URL or a redis:// URL")
        if not value:
            raise ConfigurationError(name, value, "must not be empty")
        return SqliteResponseCache(value)
    if isinstance(value, Path | os.PathLike):
        return SqliteResponseCache(value)
    raise ConfigurationError(name, value, "must be a ResponseCache, a SQLite file path, a postgresql:// "
                                          "or redis:// URL, or None")


def check_cache_mode(mode: object, *, name: str = "cache_mode") -> CacheMode:
    """``mode`` if it is one of :data:`CACHE_MODES`, else a ``ConfigurationError`` naming them."""
    if not isinstance(mode, str) or mode not in CACHE_MODES:
        raise ConfigurationError(name, mode, f"must be one of {', '.join(CACHE_MODES)}")
    return mode  # type: ignore[return-value]
