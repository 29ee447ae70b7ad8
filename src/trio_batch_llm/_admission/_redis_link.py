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

**Renewals.** A scope that bounds calls in flight across processes
(:mod:`._redis_inflight`) holds leases that expire unless renewed: the serving
task runs a child task that renews them every third of ``in_flight_expiry``,
and ends it when it stops serving, so no renewal outlives the host.

**Refused.** The serving task's first round trip is a ``PING``; a server that
refuses the client (a wrong or missing password, a database it does not have)
will not change its mind, so that ends the link at once, with no retry: every
admission, the waiting ones and later ones, then raises :class:`QuotaBackendError`
naming the URL and the server's reason (never the password). No call is admitted.
"""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, Protocol, final

import anyio
import anyio.lowlevel

from .._values._errors import QuotaBackendError
from .._values._quota_backend import RedisQuotaBackend
from .._values._urls import REDACTED, redact_urls
from ._redis_lua import ACQUIRE_SCRIPT, AcquireReply, parse_reply


class SharedQuota(Protocol):
    """What the link's task asks of each scope's share (:class:`~._redis_quota.RedisSharedQuota`)."""

    @property
    def holds_spares(self) -> bool: ...

    @property
    def wants_refill(self) -> bool: ...

    async def flush_idle(self) -> None: ...

    async def hand_back(self) -> None: ...


class Renewer(Protocol):
    """What the link's renewal task asks of a scope's leases (:class:`~._redis_inflight.SharedInFlight`)."""

    async def renew(self) -> None: ...

__all__ = ["RedisLink", "check_backend", "refusal_message"]

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


def _refusals() -> tuple[tuple[type[Exception], ...], tuple[type[Exception], ...]]:
    """``(at the handshake, at any round trip)``: the server answered, and said no; a retry cannot
    change that. At the handshake any error answer (AUTH, SELECT of a database it lacks); later only
    the ones about this client's rights, so that a script's own error is not mistaken for one."""
    import coredis.exceptions

    exceptions = coredis.exceptions
    return (exceptions.ResponseError,), (exceptions.AuthenticationError, exceptions.AuthorizationError)


def _scrubbed(text: str, url: str) -> str:
    """``text`` (a client's error message) without any URL's userinfo or the password of ``url``."""
    text = redact_urls(text)
    try:
        password = urllib.parse.urlsplit(url).password
    except ValueError:
        password = None
    for secret in {password, urllib.parse.unquote(password or "")} - {None, ""}:
        assert secret is not None
        text = text.replace(secret, REDACTED)
    return text


def refusal_message(backend: RedisQuotaBackend, exc: BaseException) -> str:
    """What a refused (or unusable) backend says: its URL without the password, and the reason."""
    reason = _scrubbed(str(exc), backend.connection_url()).rstrip(".")
    hint = " (check the password in the URL)" if "Authentication" in type(exc).__name__ else ""
    return (f"the Redis quota backend {backend.display_url} refused this client: "
            f"{type(exc).__name__}: {reason}{hint}; nothing was admitted")


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
        "_client", "_closing", "_denials", "_down_since", "_flush_wanted", "_quotas", "_ready", "_refusals",
        "_refused",
        "_renewers", "_script", "_scripts", "_stopped", "_unreachable", "backend", "clock", "failures",
        "round_trips", "script_clock",
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
        self._renewers: list[Renewer] = []
        self._scripts: dict[str, Any] = {}  # other scripts' sources -> their registered coredis Script
        self._ready = anyio.Event()
        self._stopped = anyio.Event()
        self._flush_wanted = anyio.Event()
        self._closing = False
        # coredis is imported here, not in the serving task: a first import can block the event loop
        # for a second on a busy machine, which must not count against the admissions' wait below.
        self._unreachable = _redis_errors()
        self._refusals, self._denials = _refusals()
        self._refused: str | None = None  # why the server refused this client (then the link is over)
        self._down_since: float | None = None  # the first failed round trip of a run of them (progress)
        self.round_trips = 0
        self.failures = 0

    def __repr__(self) -> str:
        return f"<RedisLink {self.backend.display_url} round_trips={self.round_trips}>"

    def add(self, quota: SharedQuota) -> None:
        self._quotas.append(quota)

    def add_renewer(self, renewer: Renewer) -> None:
        self._renewers.append(renewer)

    # -- the serving task ----------------------------------------------------

    async def serve(self) -> None:
        """Own the client until :meth:`aclose`; send releases nobody else carried."""
        try:
            import coredis
            import coredis.retry

            backend = self.backend
            kind = coredis.RedisCluster if backend.cluster else coredis.Redis
            url = backend.connection_url()
            options: dict[str, Any] = {}
            try:
                if backend.cluster and (seeds := _seed_nodes(url)):
                    options["startup_nodes"] = seeds
                self._client = kind.from_url(
                    url, connect_timeout=backend.connect_timeout, stream_timeout=backend.command_timeout,
                    retry_policy=coredis.retry.NoRetryPolicy(), **options,
                )
            except (ValueError, TypeError) as exc:  # a query option the client cannot read
                self._refused = refusal_message(backend, exc)
                await anyio.lowlevel.checkpoint()
                return
            async with self._client:
                if not await self._handshake():
                    return
                self._script = self._client.register_script(ACQUIRE_SCRIPT)
                self._ready.set()
                async with anyio.create_task_group() as renewals:
                    renewals.start_soon(self._renew_leases, name="renew Redis in-flight leases")
                    await self._serve_releases()
                    renewals.cancel_scope.cancel(reason="the Redis quota link is closing")
        finally:
            self._closing = True
            self._ready.set()
            self._stopped.set()

    async def _serve_releases(self) -> None:
        """Send the releases nobody else carried until the link closes; then hand back (bounded)."""
        backend = self.backend
        await anyio.lowlevel.checkpoint_if_cancelled()
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

    async def _renew_leases(self) -> None:
        """Renew every scope's in-flight leases, every third of their expiry (never when none are held)."""
        period = self.backend.in_flight_expiry / 3
        while True:
            await anyio.sleep(period)
            for renewer in list(self._renewers):
                try:
                    await renewer.renew()
                except QuotaBackendError:
                    pass  # tried again at the next period; a lease lost meanwhile is logged when seen

    async def _handshake(self) -> bool:
        """A first round trip (``PING``): ``False`` when the server refused this client (recorded).

        An unreachable server is not decided here: the admissions retry it for ``unreachable_timeout``.
        """
        try:
            await self._client.ping()
        except self._unreachable:
            await anyio.lowlevel.checkpoint()
        except self._refusals as exc:
            self._refused = refusal_message(self.backend, exc)
            await anyio.lowlevel.checkpoint()
            return False
        return True

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def unreachable(self) -> bool:
        """Whether round trips wait for the server: the link is still connecting, or its last round trip
        could not reach the server (and none has since). Progress says so instead of "in flight"."""
        return (not self._ready.is_set() and self._refused is None) or self._down_since is not None

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
        return parse_reply(await self._retried(lambda: self._script(keys=list(keys), args=list(args))))

    async def run_source(self, source: str, keys: Sequence[str], args: Sequence[str | int | float]) -> Any:
        """One atomic run of another script (its source, registered on first use), retried as
        :meth:`run_script`; the reply as the client read it."""

        def trip() -> Awaitable[Any]:
            script = self._scripts.get(source)
            if script is None:
                script = self._scripts[source] = self._client.register_script(source)
            return script(keys=list(keys), args=list(args))  # type: ignore[no-any-return]

        return await self._retried(trip)

    async def ping(self) -> None:
        """One ``PING``, retried while Redis is unreachable: :class:`QuotaBackendError` if it never answers
        or refuses this client (the command line's check before a run)."""
        await self._retried(lambda: self._client.ping())

    async def _retried(self, trip: Callable[[], Awaitable[Any]]) -> Any:
        backend = self.backend
        first_failure: float | None = None
        pause = _FIRST_RETRY
        while True:
            if not self._ready.is_set():
                # The serving task's handshake is one round trip: it may take a connect and a command.
                bound = backend.unreachable_timeout + backend.connect_timeout + backend.command_timeout
                with anyio.move_on_after(bound):
                    await self._ready.wait()
            if self._refused is not None:
                raise QuotaBackendError(self._refused)
            if self._closing and self._script is None:
                raise QuotaBackendError(f"the Redis quota backend {backend.display_url} is closed")
            if self._script is None:
                raise QuotaBackendError(
                    f"the Redis quota backend {backend.display_url} did not open within"
                    f" {backend.unreachable_timeout:g} s"
                )
            try:
                self.round_trips += 1
                reply = await trip()
            except self._denials as exc:  # e.g. the password changed since the link opened
                self._refused = refusal_message(backend, exc)
                raise QuotaBackendError(self._refused) from None
            except self._unreachable as exc:
                self.failures += 1
                now = anyio.current_time()
                if first_failure is None:
                    first_failure = now
                if self._down_since is None:
                    self._down_since = now
                if self._closing:  # a close hands back within _CLOSE_BOUND; it does not wait out the outage
                    raise QuotaBackendError(
                        f"the Redis quota backend {backend.display_url} was unreachable as the link closed:"
                        f" {type(exc).__name__}"
                    ) from None
                if now - first_failure >= backend.unreachable_timeout:
                    raise QuotaBackendError(
                        f"the Redis quota backend {backend.display_url} was unreachable for"
                        f" {backend.unreachable_timeout:g} s (unreachable_timeout); nothing was admitted"
                        f" meanwhile: {type(exc).__name__}"
                    ) from None
                await anyio.sleep(min(pause, max(0.0, first_failure + backend.unreachable_timeout - now)))
                pause = min(pause * 2, _MAX_RETRY)
            else:
                self._down_since = None
                return reply


async def check_backend(backend: RedisQuotaBackend) -> None:
    """Open a link, ``PING`` (retried for ``unreachable_timeout``), close it: :class:`QuotaBackendError`
    if the server refuses this client or never answers. What the command line checks before a run."""
    link = RedisLink(backend)
    async with anyio.create_task_group() as tg:
        tg.start_soon(link.serve)
        try:
            await link.ping()
        finally:
            await link.aclose()
