"""A host's quota scopes, one per ``strategy.quota_scope()`` key, and their totals."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, final

import anyio.lowlevel

from .._values._config import ProcessorConfig
from .._values._errors import AdmissionClosedError
from .._values._quota_backend import RedisQuotaBackend
from .._values._quota_reports import QuotaScopeStatistics
from ._scope import QuotaScope

if TYPE_CHECKING:
    from ._redis_link import RedisLink

__all__ = ["QuotaRegistry", "QuotaRegistryStatistics"]


@final
@dataclass(frozen=True, slots=True)
class QuotaRegistryStatistics:
    """Totals over every scope of a registry."""

    scopes: int
    in_flight: int
    waiting: int
    admitted_total: int
    rate_limits_reported: int
    closed: bool


class _ByIdentity:
    """Stands in for an unhashable scope key: such keys share a scope only with themselves."""

    __slots__ = ("key",)

    def __init__(self, key: object) -> None:
        self.key = key

    def __hash__(self) -> int:
        return id(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ByIdentity) and other.key is self.key


@final
class QuotaRegistry:
    """One host's quota scopes, created on first use and keyed by ``strategy.quota_scope()``.

    The first config seen for a key sizes its scope; later configs for the
    same key share it unchanged (the quota belongs to the provider, not to a
    batch). :meth:`close` closes every scope and refuses new ones.

    With a ``backend`` (a :class:`RedisQuotaBackend`), every scope's RPM, TPM
    and cooldown are shared through it; the connection is opened by a task
    started with ``spawn`` at the first scope, and closed by :meth:`aclose`.
    """

    __slots__ = ("_backend", "_clock", "_closed", "_link", "_scopes", "_spawn")

    def __init__(
        self, *, clock: Callable[[], float] | None = None, backend: RedisQuotaBackend | None = None,
        spawn: Callable[[Callable[[], Awaitable[None]]], None] | None = None,
    ) -> None:
        if backend is not None and spawn is None:
            raise ValueError("a registry with a quota backend needs spawn= to own its connection task")
        self._clock = clock
        self._scopes: dict[object, QuotaScope] = {}
        self._closed = False
        self._backend = backend
        self._spawn = spawn
        self._link: RedisLink | None = None

    def scope_for(self, key: object, config: ProcessorConfig) -> QuotaScope:
        try:
            scope = self._scopes.get(key)
        except TypeError:
            key = _ByIdentity(key)
            scope = self._scopes.get(key)
        if scope is None:
            if self._closed:
                raise AdmissionClosedError("quota registry is closed")
            name = key.key if isinstance(key, _ByIdentity) else key
            scope = self._new_scope(name, config)
            self._scopes[key] = scope
        return scope

    def _new_scope(self, name: object, config: ProcessorConfig) -> QuotaScope:
        backend = self._backend
        if backend is None:
            return QuotaScope.from_config(config, clock=self._clock, name=f"{name!r}")
        from ._redis_link import RedisLink
        from ._redis_quota import RedisSharedQuota, scope_key

        link = self._link
        if link is None:
            assert self._spawn is not None
            link = self._link = RedisLink(backend, clock=self._clock)
            self._spawn(link.serve)
        shared = RedisSharedQuota(
            link, scope_key(backend.namespace, name),
            requests_per_minute=config.max_requests_per_minute,
            tokens_per_minute=config.max_tokens_per_minute, rate_limit=config.rate_limit,
        )
        shared.pacing_margin = config.rate_limit.pacing_margin
        scope = QuotaScope.from_config(config, clock=self._clock, name=f"{name!r}", shared=shared)
        shared.on_cooldown = scope.join_cooldown
        return scope

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close every scope (waking their waiters into AdmissionClosedError). Idempotent."""
        self._closed = True
        for scope in self._scopes.values():
            scope.close()

    async def aclose(self) -> None:
        """:meth:`close`, then hand back what the shared backend holds and close its connection (bounded)."""
        self.close()
        link = self._link
        if link is not None:
            await link.aclose()
        else:
            await anyio.lowlevel.checkpoint()

    def scope_statistics(self) -> list[tuple[object, QuotaScopeStatistics]]:
        return [
            (key.key if isinstance(key, _ByIdentity) else key, scope.statistics())
            for key, scope in self._scopes.items()
        ]

    def statistics(self) -> QuotaRegistryStatistics:
        stats = [scope.statistics() for scope in self._scopes.values()]
        return QuotaRegistryStatistics(
            scopes=len(stats),
            in_flight=sum(s.in_flight for s in stats),
            waiting=sum(s.waiting for s in stats),
            admitted_total=sum(s.admitted_total for s in stats),
            rate_limits_reported=sum(s.rate_limits_reported for s in stats),
            closed=self._closed,
        )
