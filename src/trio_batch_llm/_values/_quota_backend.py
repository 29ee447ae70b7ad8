"""``RedisQuotaBackend``: the configuration value that makes quota scopes shared through Redis.

A value, like the rest of :class:`ProcessorConfig`: it holds a URL and knobs,
never a connection. Each :class:`~trio_batch_llm.ExecutorHost` that uses it opens
its own connection (see ``_admission/_redis_link.py``) in a task it owns, so one
backend object may serve many processors, hosts and event loops.

The URL's password is kept out of every repr, log line and error
(:attr:`RedisQuotaBackend.display_url`); only the client sees it. The URL is
parsed when the value is made (scheme, port, database number), so a typo is a
:class:`QuotaBackendURLError` then, not a traceback from the client later.
"""

from __future__ import annotations

import math
import urllib.parse
from typing import final

from ._errors import ConfigurationError, QuotaBackendError
from ._urls import redact_url

__all__ = ["QuotaBackendURLError", "RedisQuotaBackend"]

_SCHEMES = ("redis://", "rediss://", "unix://")


class QuotaBackendURLError(ConfigurationError, QuotaBackendError):
    """A quota backend URL that cannot be used as written: a bad config value (``ConfigurationError``)
    and a quota backend that cannot be used (``QuotaBackendError``); either ``except`` catches it."""


def _url_problem(url: str) -> str | None:
    """Why the client could not use ``url``, or ``None``; never quotes the URL's userinfo."""
    if not url.startswith(_SCHEMES):
        return "must be a redis://, rediss:// or unix:// URL"
    try:
        parts = urllib.parse.urlsplit(url)
        query = urllib.parse.parse_qs(parts.query)
    except ValueError as exc:  # an unbalanced IPv6 bracket; the message holds no part of the URL
        return f"cannot be parsed: {exc}"
    databases = query.get("db", [])
    if parts.scheme == "unix":
        if not parts.path:
            return "needs the socket path (unix:///path/to/redis.sock)"
    else:
        try:
            parts.port  # noqa: B018 - parsing the port is the check
        except ValueError:
            port = parts.netloc.rpartition("@")[2].rpartition(":")[2]
            return f"the port {port!r} is not a number from 0 to 65535"
        # The client reads the database from the path when the query names none, and silently
        # takes 0 for a path that is not a number: a typo would share limits in the wrong place.
        if not databases and parts.path.strip("/"):
            databases = [parts.path.replace("/", "")]
    for database in databases:
        if not (database.isascii() and database.isdigit()):
            return f"the database {database!r} is not a whole number >= 0"
    return None


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(name, value, "must be a finite number > 0")
    if not math.isfinite(value) or value <= 0:
        raise ConfigurationError(name, value, "must be a finite number > 0")
    return float(value)


@final
class RedisQuotaBackend:
    """Share every quota scope's RPM, TPM, cooldown through one Redis server (or cluster).

    Processes whose configs name the same Redis and whose strategies return
    equal ``quota_scope()`` keys admit against one limit::

        config = ProcessorConfig(max_requests_per_minute=500,
                                 quota_backend=RedisQuotaBackend("redis://redis.internal:6379/0"))

    Knobs (keyword-only):

    - ``namespace``: the prefix of every key (two deployments on one Redis keep apart).
    - ``unreachable_timeout``: how long an admission waits for an unreachable
      Redis (retrying) before it raises :class:`QuotaBackendError`. Nothing is
      admitted meanwhile: no shared quota, no call.
    - ``connect_timeout`` / ``command_timeout``: one connection attempt / one round trip.
    - ``max_call_seconds``: how long a call still in flight keeps counting
      against the RPM limit before Redis assumes its process died (its unit is
      then freed a window later). Set it above your longest call.
    - ``max_lease``: spare request units a busy process may hold ahead of
      demand, so most admissions need no round trip (only when there is an RPM
      limit and no TPM limit; at most a twentieth of the limit; spares count
      against the limit while held and go back after ``lease_seconds``).
    - ``cluster``: connect with ``coredis.RedisCluster`` (the URL names one seed node).
    - ``max_in_flight``: at most this many calls in flight in each scope, counting every process
      together (``None``: no shared bound; each process keeps its own ``concurrency``). Each call
      holds a lease in Redis that expires ``in_flight_expiry`` seconds after its last renewal (every
      third of that, by the process holding it), so a killed process's slots come back by then.
    """

    __slots__ = (
        "_url", "cluster", "command_timeout", "connect_timeout", "in_flight_expiry", "lease_seconds",
        "max_call_seconds", "max_in_flight", "max_lease", "namespace", "unreachable_timeout",
    )

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "trio-batch-llm",
        unreachable_timeout: float = 30.0,
        connect_timeout: float = 2.0,
        command_timeout: float = 5.0,
        max_call_seconds: float = 600.0,
        max_lease: int = 1024,
        lease_seconds: float = 1.0,
        cluster: bool = False,
        max_in_flight: int | None = None,
        in_flight_expiry: float = 30.0,
    ) -> None:
        problem = _url_problem(url) if isinstance(url, str) else _url_problem("")
        if problem is not None:
            shown = redact_url(url) if isinstance(url, str) else url
            raise QuotaBackendURLError("quota_backend", shown, problem)
        if not isinstance(namespace, str) or not namespace or "{" in namespace or "}" in namespace:
            raise ConfigurationError("namespace", namespace, "must be a non-empty string without braces")
        if isinstance(max_lease, bool) or not isinstance(max_lease, int) or max_lease < 0:
            raise ConfigurationError("max_lease", max_lease, "must be a whole number >= 0")
        if max_in_flight is not None and (
                isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1):
            raise ConfigurationError("max_in_flight", max_in_flight, "must be a whole number >= 1, or None")
        self._url = url
        self.namespace = namespace
        self.unreachable_timeout = _positive("unreachable_timeout", unreachable_timeout)
        self.connect_timeout = _positive("connect_timeout", connect_timeout)
        self.command_timeout = _positive("command_timeout", command_timeout)
        self.max_call_seconds = _positive("max_call_seconds", max_call_seconds)
        self.lease_seconds = _positive("lease_seconds", lease_seconds)
        self.max_lease = max_lease
        self.cluster = bool(cluster)
        self.max_in_flight = max_in_flight
        self.in_flight_expiry = _positive("in_flight_expiry", in_flight_expiry)

    @property
    def display_url(self) -> str:
        """The URL with any password replaced by ``<redacted>``: the only form ever shown."""
        return redact_url(self._url)

    def connection_url(self) -> str:
        """The URL as given, password included: for the Redis client only, never for display."""
        return self._url

    def __repr__(self) -> str:
        bound = "" if self.max_in_flight is None else f", max_in_flight={self.max_in_flight}"
        return f"RedisQuotaBackend({self.display_url!r}, namespace={self.namespace!r}{bound})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RedisQuotaBackend) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[object, ...]:
        return (self._url, self.namespace, self.unreachable_timeout, self.connect_timeout,
                self.command_timeout, self.max_call_seconds, self.max_lease, self.lease_seconds, self.cluster,
                self.max_in_flight, self.in_flight_expiry)

    def __reduce__(self) -> tuple[object, ...]:
        # Picklable for multiprocessing; the URL travels as given (the child needs the password).
        return (_rebuild, (self._url, self.namespace, self.unreachable_timeout, self.connect_timeout,
                           self.command_timeout, self.max_call_seconds, self.max_lease, self.lease_seconds,
                           self.cluster, self.max_in_flight, self.in_flight_expiry))


def _rebuild(url: str, namespace: str, unreachable: float, connect: float, command: float, hold: float,
             lease: int, lease_seconds: float, cluster: bool, max_in_flight: int | None = None,
             in_flight_expiry: float = 30.0) -> RedisQuotaBackend:
    return RedisQuotaBackend(url, namespace=namespace, unreachable_timeout=unreachable,
                             connect_timeout=connect, command_timeout=command, max_call_seconds=hold,
                             max_lease=lease, lease_seconds=lease_seconds, cluster=cluster,
                             max_in_flight=max_in_flight, in_flight_expiry=in_flight_expiry)
