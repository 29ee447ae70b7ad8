"""``RedisCacheConnection``: the response cache in Redis (coredis), shared by processes on any machine.

**Keys** (``ns`` is ``config.namespace``): ``ns:e:<digest>`` holds the entry (the answer
as JSON: output, usage, metadata, model, created_at), written by one ``SET`` (so an
entry is whole or absent) with ``PX`` = the TTL when there is one, so Redis drops it
by itself; ``ns:r:<digest>`` holds the request (canonical JSON) only when
``store_request=True``, written *before* the entry with the same expiry (a writer
killed between the two leaves a request without an answer, never an answer cut in
half); ``ns:c:<digest>`` is the single-flight claim: ``SET ... NX PX <lease>`` in
effect (a tiny script, so that its own holder may renew it in the same round trip),
released only by its holder (another script: compare, then delete). A holder that
dies lets go when its claim's ``PX`` runs out. Each key names one digest, so a
Redis Cluster (``cluster=True``) spreads them over its slots; no command touches two keys.

Size: Redis bounds memory itself; give the server a ``maxmemory`` and an LRU policy
(``allkeys-lru``, or ``volatile-lru`` with a TTL) to keep the cache under a size.

**Lifetime.** A coredis 6 client owns a task group, which must be entered and left by
one task, nested like a context manager; a connection's owner (a processor, a pool, a
run's driver) opens and closes it wherever its own structure says. So each connection
runs its client in an event loop of its own, in a thread (an anyio blocking portal):
:meth:`open` starts it and enters the client there, :meth:`aclose` leaves it and stops
the loop, and each call is handed to that loop while the caller waits in its own (woken
through its loop's thread-safe handle, no thread per call). Any task, under Trio or
asyncio, may call; a caller cancelled mid-call cancels its round trip there too.

**Errors**, as the PostgreSQL cache's: :class:`DatabaseUnavailableError` when Redis
cannot be reached (refused, reset, a command past its timeout, a cluster slot without
a node), :class:`ArtifactStoreError` when it refuses this client (a wrong password, a
database it does not have); both name the URL without its password. :meth:`open`
pings first, so either is raised before any work starts. A call that fails because
the connection was lost is tried once more on a new connection (every call is
idempotent: a read, an overwrite, a claim its holder may renew, a release).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from typing import Any, Final, TypeVar, final

import anyio
import anyio.lowlevel
import anyio.to_thread
from anyio.from_thread import BlockingPortal, start_blocking_portal

from .._admission._redis_link import _redis_errors, _refusals, _scrubbed, _seed_nodes
from .._backends import capture_loop_handle
from .._core._cleanup import CloseOnce
from .._values._errors import ArtifactStoreError, DatabaseUnavailableError
from .._values._response_cache import RedisResponseCache
from ._answer_json import answer_from_json, answer_to_json
from ._connection import CacheConnection
from ._records import CachedAnswer, CacheKey

__all__ = ["RedisCacheConnection"]

CONNECT_TIMEOUT: Final = 5.0
COMMAND_TIMEOUT: Final = 10.0

# KEYS[1] the claim; ARGV holder, lease in ms. Taken when free (or expired: Redis dropped it) or
# renewed when this holder has it: SET NX PX, plus the renewal, in one atomic round trip.
CLAIM_SCRIPT: Final = """
local held = redis.call('GET', KEYS[1])
if held == false or held == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
# KEYS[1] the claim; ARGV holder. Deleted only while this holder has it.
RELEASE_SCRIPT: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

R = TypeVar("R")


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


@final
class _Client:
    """The half that lives in the connection's own event loop: the coredis client and its round trips."""

    def __init__(self, config: RedisResponseCache, connect_timeout: float, command_timeout: float) -> None:
        import coredis
        import coredis.retry

        self.config = config
        self.location = f"the Redis response cache {config.display}"
        kind = coredis.RedisCluster if config.cluster else coredis.Redis
        options: dict[str, Any] = {}
        if config.cluster and (seeds := _seed_nodes(config.url)):
            options["startup_nodes"] = seeds
        try:
            self.redis: Any = kind.from_url(config.url, connect_timeout=connect_timeout,
                                            stream_timeout=command_timeout,
                                            retry_policy=coredis.retry.NoRetryPolicy(), **options)
        except (ValueError, TypeError) as exc:  # a query option the client cannot read
            raise ArtifactStoreError(f"{self.location}: opening failed: {_scrubbed(str(exc), config.url)}") \
                from None
        self.unreachable = _redis_errors()
        self.refused_at_start, self.denials = _refusals()
        self.claim_script = self.redis.register_script(CLAIM_SCRIPT)
        self.release_script = self.redis.register_script(RELEASE_SCRIPT)

    async def ping(self) -> None:
        """The first round trip: a refusal or an unreachable server is raised (once, no retry)."""
        try:
            await self.redis.ping()
        except self.unreachable as exc:
            raise DatabaseUnavailableError(_message(self.location, "opening", exc, self.config.url)) from None
        except self.refused_at_start as exc:
            raise ArtifactStoreError(_message(self.location, "opening", exc, self.config.url)) from None

    async def trip(self, doing: str, trip: Callable[[], Awaitable[R]]) -> R:
        """``trip()``, tried once more after a lost connection; errors as the module docstring says."""
        url = self.config.url
        for attempt in (1, 2):
            try:
                return await trip()
            except self.denials as exc:
                raise ArtifactStoreError(_message(self.location, doing, exc, url)) from None
            except self.unreachable as exc:
                if attempt == 2:
                    raise DatabaseUnavailableError(_message(self.location, doing, exc, url)) from None
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


@final
class RedisCacheConnection(CacheConnection):
    """One owner's connection to a :class:`RedisResponseCache` (see the module docstring)."""

    def __init__(self, config: RedisResponseCache, client: _Client, portal: BlockingPortal, stack: ExitStack,
                 clock: Callable[[], float]) -> None:
        self._config = config
        self._client = client
        self._portal = portal
        self._stack = stack
        self._clock = clock
        self._namespace = config.namespace
        self.location = client.location
        self._close_once = CloseOnce()

    def __repr__(self) -> str:
        return f"<RedisCacheConnection {self.location}>"

    @classmethod
    async def open(cls, config: RedisResponseCache, *, clock: Callable[[], float] = time.time,
                   connect_timeout: float = CONNECT_TIMEOUT,
                   command_timeout: float = COMMAND_TIMEOUT) -> RedisCacheConnection:
        """Start the connection's loop, connect and ``PING``: a server that cannot be reached or refuses
        this client raises here, before any work starts. ``clock`` (Unix seconds) decides TTLs."""

        def start() -> tuple[_Client, BlockingPortal, ExitStack]:
            stack = ExitStack()
            try:
                portal = stack.enter_context(start_blocking_portal("asyncio"))
                client = portal.call(_make_client, config, connect_timeout, command_timeout)
                stack.enter_context(portal.wrap_async_context_manager(client.redis))
                portal.call(client.ping)
            except BaseException:
                stack.close()
                raise
            return client, portal, stack

        client, portal, stack = await anyio.to_thread.run_sync(start)
        return cls(config, client, portal, stack, clock)

    async def _call(self, doing: str, trip: Callable[[], Awaitable[R]]) -> R:
        """``trip`` in the connection's loop; this task waits without a thread (woken through its loop's
        handle). Cancelled, it cancels the round trip there too (a ``SET`` is whole or not done)."""
        if self._close_once.closed:
            await anyio.lowlevel.checkpoint()
            raise ArtifactStoreError(f"{self.location}: the cache connection is closed")
        handle = capture_loop_handle()
        done = anyio.Event()
        future = self._portal.start_task_soon(self._client.trip, doing, trip)
        future.add_done_callback(lambda _: handle.run_sync_soon(done.set))
        try:
            await done.wait()
        except BaseException:
            future.cancel()
            raise
        return future.result()

    def _key(self, kind: str, digest: str) -> str:
        return f"{self._namespace}:{kind}:{digest}"

    async def get(self, key: CacheKey) -> CachedAnswer | None:
        redis = self._client.redis
        raw = await self._call("reading an entry", lambda: redis.get(self._key("e", key.digest)))
        if raw is None:
            return None
        answer = answer_from_json(raw)
        ttl = self._config.ttl
        if answer is None or (ttl is not None and answer.created_at + ttl <= self._clock()):
            return None  # PX drops it soon; a clock running ahead of the writer's sees it expired first
        return answer

    async def put(self, key: CacheKey, answer: CachedAnswer) -> None:
        now = self._clock()
        if not answer.created_at:
            answer = dataclasses.replace(answer, created_at=now)
        text = answer_to_json(answer)
        ttl = self._config.ttl
        px: int | None = None
        if ttl is not None:
            left = answer.created_at + ttl - now
            if left <= 0:
                await anyio.lowlevel.checkpoint()
                return  # expired before it was written: it would be a miss anyway
            px = _ms(left)
        redis = self._client.redis
        if self._config.store_request:
            request = json.dumps(dict(key.request), separators=(",", ":"), ensure_ascii=False, default=str)
            where = self._key("r", key.digest)
            await self._call("writing a request", lambda: redis.set(where, request, px=px))
        await self._call("writing an entry", lambda: redis.set(self._key("e", key.digest), text, px=px))

    async def claim(self, key: CacheKey, holder: str, seconds: float) -> bool:
        script = self._client.claim_script
        taken: object = await self._call("claiming a key", lambda: script(keys=[self._key("c", key.digest)],
                                                                  args=[holder, _ms(seconds)]))
        return bool(taken)

    async def release(self, key: CacheKey, holder: str) -> None:
        script = self._client.release_script
        await self._call("releasing a key", lambda: script(keys=[self._key("c", key.digest)], args=[holder]))

    async def aclose(self) -> None:
        # Leaves the client in its loop (closing its connections), then stops the loop's thread.
        await self._close_once(lambda: anyio.to_thread.run_sync(self._stack.close))


def _make_client(config: RedisResponseCache, connect_timeout: float, command_timeout: float) -> _Client:
    return _Client(config, connect_timeout, command_timeout)


def _message(location: str, doing: str, exc: BaseException, url: str) -> str:
    reason = _scrubbed(str(exc), url).rstrip(".") or type(exc).__name__
    hint = " (check the password in the URL)" if "Authentication" in type(exc).__name__ else ""
    return f"{location}: {doing} failed: {type(exc).__name__}: {reason}{hint}"
