"""Gemini context caching: the ``GeminiContextCache`` option and the cache one strategy lease owns.

The long shared prefix (the system instruction, the strategy's tools and any leading
``contents`` messages) is stored once as a ``cachedContents`` resource and every request
names it (``cachedContent``) instead of sending it again. The lease's ``prepare()``
finds it (same ``displayName``, same model, not expired) or creates it; every call
renews it first when less than half of its TTL is left (a PATCH of ``ttl``, made by
one caller while the others wait): no background task, so nothing outlives the lease.
An expired or vanished cache is created again. ``cleanup()`` deletes a cache this lease
created (one it found may be another process's, and its TTL ends it), bounded and shielded.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, final

import anyio
import anyio.lowlevel

from ..._values._categories import ErrorCategory
from ..._values._errors import ConfigurationError, ProviderError
from ..._values._prompts import check_prompt

if TYPE_CHECKING:  # the REST module imports httpx2, which `import trio_batch_llm` must not
    from ._rest import GeminiRest

__all__ = ["CacheHandle", "GeminiContextCache"]

_LOG = logging.getLogger("trio_batch_llm.gemini")
_DELETE_TIMEOUT: Final = 10.0
_MIN_TTL: Final = 60.0


@final
@dataclass(frozen=True, slots=True)
class GeminiContextCache:
    """Cache the shared prefix of every request of a :class:`GeminiStrategy` (Gemini's explicit caching).

    ``ttl``: seconds the cache lives without use; renewed while the batch runs.
    ``contents``: leading chat messages (OpenAI format) shared by every item, cached
    with the system prompt and the strategy's ``params["tools"]``. ``display_name``:
    the cache's name to find or create (default: a digest of model and prefix, so equal
    strategies share one). Gemini refuses a cache under its minimum size (1,024 tokens
    for Flash models, 4,096 for Pro); then ``prepare()`` fails with its message.
    """

    ttl: float = 3600.0
    contents: Sequence[Mapping[str, Any]] = field(default=())
    display_name: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.ttl, bool) or not isinstance(self.ttl, (int, float)) or not self.ttl >= _MIN_TTL:
            raise ConfigurationError("context_cache.ttl", self.ttl,
                                     f"must be at least {_MIN_TTL:.0f} seconds")
        if self.display_name is not None and (not isinstance(self.display_name, str)
                                              or not 0 < len(self.display_name) <= 128):
            raise ConfigurationError("context_cache.display_name", self.display_name,
                                     "must be a string of 1 to 128 characters")
        if self.contents:
            try:
                checked = check_prompt(list(self.contents), "context_cache.contents")
            except (TypeError, ValueError) as exc:
                raise ConfigurationError("context_cache.contents", "<messages>", str(exc)) from exc
            messages = [m for m in checked if isinstance(m, Mapping)]
            for message in messages:
                if message.get("role") not in ("user", "assistant"):
                    raise ConfigurationError("context_cache.contents", "<messages>",
                                             "holds user and assistant messages only (the system "
                                             "prompt goes in system_prompt=)")
            object.__setattr__(self, "contents", tuple(dict(m) for m in messages))


def cache_body(model: str, option: GeminiContextCache, prefix: Mapping[str, Any]) -> dict[str, Any]:
    """The ``cachedContents`` create body: ``prefix`` holds ``systemInstruction``/``contents``/``tools``/
    ``toolConfig`` (REST JSON) as requests would send them."""
    body: dict[str, Any] = {"model": f"models/{model}", **prefix}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    body["displayName"] = option.display_name or f"trio-batch-llm-{digest}"
    body["ttl"] = _duration(option.ttl)
    return body


def _duration(seconds: float) -> str:
    return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"


@final
class CacheHandle:
    """One cache, as one lease holds it: its name, when to renew, whether we created it."""

    def __init__(self, rest: GeminiRest, body: Mapping[str, Any], ttl: float,
                 now: Callable[[], float] = anyio.current_time) -> None:
        self._rest = rest
        self._body = dict(body)
        self._ttl = ttl
        self._now = now
        self._lock = anyio.Lock()
        self.name: str | None = None
        self.owned = False
        self.expires_at = 0.0
        self.renewals = 0

    async def open(self, client: Any) -> None:
        """Find the cache by display name (same model, not expired), else create it."""
        found = await self._find(client)
        if found is not None:
            self.name, self.owned = found, False
            await self._renew(client)
            return
        await self._create(client)

    async def _find(self, client: Any) -> str | None:
        token: str | None = None
        for _ in range(50):  # bounded: at most 50 pages of caches
            params: dict[str, str | int] = {"pageSize": 100}
            if token:
                params["pageToken"] = token
            listing, _, _ = await self._rest.call(client, "GET", "cachedContents", params=params)
            for cache in listing.get("cachedContents") or () if isinstance(listing, Mapping) else ():
                if (isinstance(cache, Mapping) and cache.get("displayName") == self._body["displayName"]
                        and cache.get("model") == self._body["model"] and isinstance(cache.get("name"), str)):
                    return str(cache["name"])
            token = listing.get("nextPageToken") if isinstance(listing, Mapping) else None
            if not token:
                return None
        return None

    async def _create(self, client: Any) -> None:
        started = self._now()
        created, _, _ = await self._rest.call(client, "POST", "cachedContents", self._body)
        name = created.get("name") if isinstance(created, Mapping) else None
        if not isinstance(name, str) or not name:
            raise ProviderError("Gemini created a cache but named none", category=ErrorCategory.PARSE)
        self.name, self.owned, self.expires_at = name, True, started + self._ttl
        _LOG.info("gemini context cache %s created (ttl %ss)", name, self._ttl)

    async def _renew(self, client: Any) -> None:
        started = self._now()
        await self._rest.call(client, "PATCH", str(self.name), {"ttl": self._body["ttl"]},
                              params={"updateMask": "ttl"})
        self.expires_at = started + self._ttl
        self.renewals += 1

    def fresh_name(self) -> str | None:
        """The cache's name while more than half its TTL is left; ``None``: :meth:`renewed_name` first."""
        return self.name if self._now() < self.expires_at - self._ttl / 2 else None

    async def renewed_name(self, client: Any) -> str:
        """The cache's name, renewed first when half its TTL is gone (created again if it vanished)."""
        async with self._lock:  # one caller renews; the others find it fresh
            if self._now() >= self.expires_at - self._ttl / 2 or self.name is None:
                try:
                    if self.name is None or self._now() >= self.expires_at:
                        raise _Gone
                    await self._renew(client)
                except (_Gone, ProviderError) as exc:
                    if isinstance(exc, ProviderError) and exc.status_code not in (403, 404):
                        raise
                    await self._create(client)  # expired or deleted under us: a new one, ours
            assert self.name is not None
            return self.name

    def forget(self, name: str) -> None:
        """Gemini says ``name`` is gone (expired early, deleted elsewhere): the next call creates another."""
        if self.name == name:
            self.expires_at = 0.0

    async def close(self, client: Any) -> None:
        """Delete the cache if this lease created it; bounded and shielded (a cancelled batch still
        deletes it). A delete that fails raises, and the handle keeps the name for a retry."""
        if not self.owned or self.name is None:
            await anyio.lowlevel.checkpoint()
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(_DELETE_TIMEOUT) as scope:
            try:
                await self._rest.call(client, "DELETE", self.name)
            except ProviderError as exc:
                if exc.status_code != 404:
                    raise
        await anyio.lowlevel.cancel_shielded_checkpoint()  # the shielded delete may end without one
        if scope.cancelled_caught:
            raise ProviderError(f"deleting the Gemini cache {self.name} took over {_DELETE_TIMEOUT:.0f} s; "
                                "it ends with its TTL", category=ErrorCategory.TIMEOUT)
        _LOG.info("gemini context cache %s deleted", self.name)
        self.name, self.owned = None, False


class _Gone(Exception):
    """The cache expired locally: create another."""
