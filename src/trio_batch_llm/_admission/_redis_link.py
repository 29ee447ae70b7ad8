"""One host's connection to a Redis quota backend: the client's lifetime, round trips, the flusher.

coredis 6 clients are async context managers that own a task group, so the
client must be entered and left by one task: :meth:`RedisLink.serve` is that
task (a runtime task of the host, started with the first shared scope). Workers
run scripts through the open client; the serving task also sends the releases
that no admission round trip carried (:meth:`RedisLink.want_flush`), a few
milliseconds later so that several ride one round trip.

**Unreachable Redis.** A failed round trip is retried with a growing pause
until ``unreachable_timeout`` has passed since the first failure in a row; then
:class:`QuotaBackendError` names the URL (never its password). Nothing is
admitted while Redis cannot be asked: a shared limit that cannot be checked is
treated as exhausted. In a Redis Cluster, a scope's slot that is being
resharded (``TRYAGAIN``) or has no node (``CLUSTERDOWN``) counts as unreachable too.
"""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol, final

import anyio
import anyio.lowlevel

from .._values._errors import QuotaBackendError
from .._values._quota_backend import RedisQuotaBackend
from ._redis_lua import ACQUIRE_SCRIPT, AcquireReply, parse_reply


class SharedQuota(Protocol):
    """What the link's task asks of each scope's share (:class:`~._redis_quota.RedisSharedQuota`)."""

    @property
    def holds_spares(self) -> bool: ...

    @property
    def wants_refill(self) -> bool: ...

    async def flush_idle(self) -> None: ...

    async def hand_back(self) -> None: ...

__all__ = ["RedisLink"]

_FLUSH_DELAY: Final = 0.005  # seconds the flusher waits so that several releases share a round trip
_CLOSE_BOUND: Final = 5.0  # seconds a close spends handing back what this host holds
_FIRST_RETRY: Final = 0.05
_MAX_RETRY: Final = 1.0


def _redis_errors() -> tuple[type[Exception], ...]:
    import coredis.exceptions

    # A lost or refused connection, a round trip past command_timeout, a server still loading; in a
    # cluster, a slot that cannot be served yet: TRYAGAIN while it migrates (coredis retries for
    # ~0.4 s, then ClusterError), CLUSTERDOWN while a slot has no node.
    exceptions = coredis.exceptions
    return (exceptions.ConnectionError, TimeoutError, OSError, exceptions.ClusterError,
            exceptions.TryAgainError, exceptions.ClusterDownError)


def _seed_nodes(url: str) -> list[Any]:
    # coredis 6.9's RedisCluster.from_url names the URL's node in a form it deprecates itself: a
    # DeprecationWarning at every start, which ends the link where warnings are errors (pytest's
    # filterwarnings = error). Named as a TCPLocation, the seed is the same node without it.
    from coredis.connection import TCPLocation

    parsed = urllib.parse.urlsplit(url)
    return [] if parsed.hostname is None else [TCPLocation(parsed.hostname, parsed.port or 6379)]


@final
class RedisLink:
    """The open connection of one host to one :class:`RedisQuotaBackend` (see the module docstring)."""

    __slots__ = (
        "_client", "_closing", "_flush_wanted", "_quotas", "_ready", "_script", "_stopped", "_unreachable",
        "backend", "clock", "failures", "round_trips", "script_clock",
    )

    def __init__(
        self, backend: RedisQuotaBackend, *, clock: Callable[[], float] | None = None,
        script_clock: Callable[[], float] | None = None,
    ) -> None:
        self.backend = backend
        self.clock = clock or anyio.current_time
        # Tests only: a fake "now" passed to the script instead of the server's TIME (see _redis_lua).
        self.script_clock = script_clock
        self._client: Any = None
        self._script: Any = None
        self._quotas: list[SharedQuota] = []
        self._ready = anyio.Event()
        self._stopped = anyio.Event()
        self._flush_wanted = anyio.Event()
        self._closing = False
        self._unreachable: tuple[type[Exception], ...] = ()
        self.round_trips = 0
        self.failures = 0

    def __repr__(self) -> str:
        return f"<RedisLink {self.backend.display_url} round_trips={self.round_trips}>"

    def add(self, quota: SharedQuota) -> None:
        self._quotas.append(quota)

    # -- the serving task ----------------------------------------------------

    async def serve(self) -> None:
        """Own the client until :meth:`aclose`; send releases nobody else carried."""
        try:
            import coredis
            import coredis.retry

            self._unreachable = _redis_errors()
            backend = self.backend
            kind = coredis.RedisCluster if backend.cluster else coredis.Redis
            url = backend.connection_url()
            options: dict[str, Any] = {}
            if backend.cluster and (seeds := _seed_nodes(url)):
                options["startup_nodes"] = seeds
            self._client = kind.from_url(
                url, connect_timeout=backend.connect_timeout, stream_timeout=backend.command_timeout,
                retry_policy=coredis.retry.NoRetryPolicy(), **options,
            )
            async with self._client:
                self._script = self._client.register_script(ACQUIRE_SCRIPT)
                self._ready.set()
                while not self._closing:
                    # Spares held by an idle process must go back after lease_seconds: wake for them too.
                    holding = any(quota.holds_spares for quota in self._quotas)
                    idle = backend.lease_seconds if holding else math.inf
                    with anyio.move_on_after(idle):
                        await self._flush_wanted.wait()
                    self._flush_wanted = anyio.Event()
                    if self.closing:
                        break
                    if not any(quota.wants_refill for quota in self._quotas):
                        await anyio.sleep(_FLUSH_DELAY)  # releases only: let a few more share the trip
                    for quota in list(self._quotas):
                        try:
                            await quota.flush_idle()
                        except QuotaBackendError:
                            pass  # kept for the next round trip; waiting admissions report it
                with anyio.CancelScope(shield=True) as shield:
                    shield.deadline = anyio.current_time() + _CLOSE_BOUND
                    for quota in list(self._quotas):
                        try:
                            await quota.hand_back()
                        except QuotaBackendError:
                            pass  # what it held expires in Redis on its own (max_call_seconds + a window)
        finally:
            self._closing = True
            self._ready.set()
            self._stopped.set()

    @property
    def closing(self) -> bool:
        return self._closing

    def want_flush(self) -> None:
        self._flush_wanted.set()

    async def aclose(self) -> None:
        """Stop serving: hand back spare units and buffered releases (bounded), close the client."""
        self._closing = True
        self._flush_wanted.set()
        with anyio.move_on_after(_CLOSE_BOUND + 1.0, shield=True):
            await self._stopped.wait()

    # -- round trips -------------------------------------------------------------

    async def run_script(self, keys: Sequence[str], args: Sequence[str | int | float]) -> AcquireReply:
        """One atomic script run, retried while Redis is unreachable (see the module docstring)."""
        backend = self.backend
        first_failure: float | None = None
        pause = _FIRST_RETRY
        while True:
            if not self._ready.is_set():
                with anyio.move_on_after(backend.unreachable_timeout):
                    await self._ready.wait()
            if self._closing and self._script is None:
                raise QuotaBackendError(f"the Redis quota backend {backend.display_url} is closed")
            if self._script is None:
                raise QuotaBackendError(
                    f"the Redis quota backend {backend.display_url} did not open within"
                    f" {backend.unreachable_timeout:g} s"
                )
            try:
                self.round_trips += 1
                raw = await self._script(keys=list(keys), args=list(args))
                return parse_reply(raw)
            except self._unreachable as exc:
                self.failures += 1
                now = anyio.current_time()
                if first_failure is None:
                    first_failure = now
                if now - first_failure >= backend.unreachable_timeout:
                    raise QuotaBackendError(
                        f"the Redis quota backend {backend.display_url} was unreachable for"
                        f" {backend.unreachable_timeout:g} s (unreachable_timeout); nothing was admitted"
                        f" meanwhile: {type(exc).__name__}"
                    ) from None
                await anyio.sleep(min(pause, max(0.0, first_failure + backend.unreachable_timeout - now)))
                pause = min(pause * 2, _MAX_RETRY)
