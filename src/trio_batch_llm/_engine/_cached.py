"""The response cache on the item path: an owner's lookup before admission, the write of a validated answer.

An owner (a processor's run, a pool, a run's drive segment) opens one connection with
:func:`open_item_cache` and closes it; :class:`ItemCache` is what the item path
(:mod:`._item`) asks. A hit costs no admission (no RPM/TPM unit, no slot, no breaker
turn), no call and no money: it becomes a result with ``cached=True``, ``attempts=0``
and an empty ``token_usage`` (the original call's usage is ``saved_usage``). A miss
holds a claim until the item ends: a validated success is written, anything else
(a failure, a stop, a cancellation) writes nothing.

A cache that fails in the middle of a run (its ``get`` or ``put`` raises) never fails
an item: one WARNING, and the owner goes on without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, Final, TypeVar, final

import anyio
import anyio.lowlevel

from .._artifacts._codec import OutputCodec, plain_json_problem
from .._cache._flight import CacheGate, Claim
from .._cache._key import request_key
from .._cache._open import open_cache
from .._cache._records import CachedAnswer, CacheKey
from .._observe._log import engine_logger
from .._values._details import DETAILS_METADATA_KEY, ResponseDetails
from .._values._errors import BatchLLMError, ConfigurationError
from .._values._results import WorkItemResult

if TYPE_CHECKING:
    from .._strategies._base import LLMCallStrategy
    from .._values._config import ProcessorConfig
    from .._values._requests import LLMWorkItem
    from ._item_run import ItemRun

__all__ = ["SETTLE_SECONDS", "ItemCache", "open_item_cache"]

TOutput = TypeVar("TOutput")

SETTLE_SECONDS: Final = 5.0
"""How long writing an answer (or letting a claim go) may take in a shielded cleanup: bounded, as every
cleanup is (CONTRACT); past it the entry is not written and the item's result stands."""

_UNKEPT_METADATA: Final = frozenset({"rate_limit"})
"""Metadata of a call that says nothing about its answer: not kept (a hit did not meet those limits)."""

_CODEC: Final = OutputCodec(codec_option=False)
"""Outputs are kept as a checkpoint keeps them: plain JSON, a pydantic model as its ``model_dump``."""


@final
class ItemCache:
    """One owner's response cache as the item path uses it: keys, lookups, writes, and the failure rule."""

    __slots__ = ("_display", "_off", "_refusals", "_stack", "_unkeyed", "gate")

    def __init__(self, gate: CacheGate, *, cache_refusals: bool = False,
                 stack: AsyncExitStack | None = None) -> None:
        self.gate = gate
        self._display = gate.config.display
        self._refusals = cache_refusals
        self._off = False
        self._unkeyed: set[str] = set()
        """What was said once already: strategy types not cacheable, an undecodable answer."""
        self._stack = stack
        """What closes the connection (``None``: closed, or not this object's to close)."""

    async def aclose(self) -> None:
        """Close the owner's connection (bounded, shielded: ``_cache._open.open_cache``). Idempotent."""
        stack, self._stack = self._stack, None
        if stack is None:
            await anyio.lowlevel.checkpoint()
            return
        await stack.aclose()

    @property
    def active(self) -> bool:
        """Whether the cache is still used (a cache that failed mid-run is not)."""
        return not self._off

    def key(self, item: LLMWorkItem[Any]) -> CacheKey | None:
        """``item``'s key, or ``None``: its strategy's requests are not cacheable (said once per strategy
        type), or the cache is off. Such an item runs as it would without a cache."""
        if self._off:
            return None
        strategy = item.strategy
        try:
            material = strategy.cache_key_material(item.request)
        except Exception as exc:  # noqa: BLE001 - the strategy's hook: its item runs uncached, not failed
            self._not_keyed(strategy, f"its cache_key_material() raised {type(exc).__name__}")
            return None
        if material is None:
            self._not_keyed(strategy, "its cache_key_material() is None: it names no model_name")
            return None
        return request_key(material, item.sample)

    def _not_keyed(self, strategy: LLMCallStrategy[Any], why: str) -> None:
        name = type(strategy).__qualname__
        if name in self._unkeyed:
            return
        self._unkeyed.add(name)
        engine_logger.warning(
            "response cache %s: the strategy %s is not cacheable (%s); its items run without the cache",
            self._display, name, why, extra={"strategy": name, "cache": self._display},
        )

    async def look_up(self, run: ItemRun[TOutput], clock: Callable[[], float]
                      ) -> WorkItemResult[TOutput] | None:
        """Stage 0 of the item path: the cache's answer as ``run``'s result, or ``None``: make the call
        (a miss holds ``run.claim`` until the item ends; an item not cacheable, a failed cache: none)."""
        key = self.key(run.item)
        if key is None:
            return None  # noqa: ASYNC910 - drive() goes on to the call, which checkpoints
        found = await self.lookup(key)
        if found is None:
            return None  # the cache failed (said once): the item runs as without one
        if isinstance(found, Claim):
            run.looked_up(key.digest, found)
            return None
        run.looked_up(key.digest, None)
        try:
            return self.hit(run, key, found, clock())
        except Exception as exc:  # noqa: BLE001 - the strategy's decode_output: ask the provider instead
            self.undecodable(run.item.item_id, exc)
            return None

    async def lookup(self, key: CacheKey) -> CachedAnswer | Claim | None:
        """A hit, a :class:`Claim` (make the call, then :meth:`settle`), or ``None``: the cache failed."""
        try:
            return await self.gate.lookup(key)
        except Exception as exc:  # noqa: BLE001 - a cache that fails never fails an item (module docstring)
            self._failed("read", exc)
            return None  # noqa: ASYNC910 - the failed lookup awaited its backend

    async def settle(self, claim: Claim, answer: CachedAnswer | None) -> None:  # noqa: ASYNC910 - shielded
        """Settle ``claim`` once, shielded and bounded: ``answer`` is written (as the mode allows) or,
        ``None``, nothing is and the claim is let go."""
        with anyio.CancelScope(shield=True) as scope:
            scope.deadline = anyio.current_time() + SETTLE_SECONDS
            try:
                await self.gate.settle(claim, answer)
            except Exception as exc:  # noqa: BLE001 - as in lookup(): the item's result stands
                self._failed("write", exc)
        if scope.cancelled_caught and answer is not None:
            self._failed("write", TimeoutError(f"no answer within {SETTLE_SECONDS} s"))

    def undecodable(self, item_id: str, exc: Exception) -> None:
        """A hit's stored output did not decode (``decode_output`` raised): the item asks the provider,
        and nothing it answers is written over the entry (it holds no claim). One WARNING per owner."""
        if "\x00decode" in self._unkeyed:
            return
        self._unkeyed.add("\x00decode")
        engine_logger.warning(
            "response cache %s: a cached answer could not be decoded (item %r, %s); such items are "
            "asked again", self._display, item_id, type(exc).__name__,
            extra={"cache": self._display, "item_id": item_id, "error_type": type(exc).__name__},
        )

    def _failed(self, what: str, exc: Exception) -> None:
        if self._off:
            return
        self._off = True
        # The type only: a driver's message may carry the URL (and its password) or user data.
        engine_logger.warning(
            "response cache %s failed to %s (%s); this run goes on without the cache",
            self._display, what, type(exc).__name__,
            extra={"cache": self._display, "error_type": type(exc).__name__},
        )

    def answer(self, strategy: LLMCallStrategy[Any], output: object, usage: Mapping[str, int],
               meta: object) -> CachedAnswer | None:
        """What the cache keeps of a validated success, or ``None``: not kept (a refusal, unless
        ``cache_refusals``; an output a checkpoint could not keep faithfully)."""
        metadata = dict(meta) if isinstance(meta, Mapping) else {}
        details = metadata.pop(DETAILS_METADATA_KEY, None)
        if isinstance(details, ResponseDetails):
            if details.refusal and not self._refusals:
                return None
            metadata[DETAILS_METADATA_KEY] = details.to_dict()
        try:
            stored = _CODEC.encode(output, replay=strategy.decode_output)
        except ValueError:
            return None  # like an output a store refuses: this answer is asked again next time
        kept = {name: value for name, value in metadata.items()
                if name not in _UNKEPT_METADATA and type(name) is str and plain_json_problem(value) is None}
        model = kept.get("model")
        return CachedAnswer(
            output=stored,
            usage=dict(usage),
            metadata=kept,
            model=model if isinstance(model, str) else strategy.model_name,
            created_at=time.time(),
        )

    @staticmethod
    def hit(run: ItemRun[Any], key: CacheKey, answer: CachedAnswer, now: float) -> WorkItemResult[Any]:
        """The result of ``run``'s item answered by the cache: no attempt, no tokens spent, no cost.

        The stored output goes through the strategy's ``decode_output``, as a resume's does."""
        item = run.item
        metadata = dict(answer.metadata)
        raw = metadata.pop(DETAILS_METADATA_KEY, None)
        details = ResponseDetails.from_dict(raw) if isinstance(raw, Mapping) else None
        if answer.model is not None:
            metadata.setdefault("model", answer.model)
        output = answer.output
        if output is not None:
            output = item.strategy.decode_output(output)
        return WorkItemResult(
            item_id=item.item_id,
            success=True,
            output=output,
            attempts=0,
            token_usage={},
            timing=run.settle(now),
            context=item.context,
            metadata=metadata,
            details=details,
            cached=True,
            cache_key=key.digest,
            saved_usage=dict(answer.usage),
        )


async def open_item_cache(config: ProcessorConfig) -> ItemCache | None:
    """The owner's :class:`ItemCache` for ``config.cache`` (``None`` without one); the owner closes it
    (:meth:`ItemCache.aclose`). A cache that cannot be opened is an error here, before any item runs:
    a :class:`ConfigurationError` naming the cache (its display form: never a password) and the
    error's type."""
    cache = config.response_cache
    if cache is None:
        return None  # noqa: ASYNC910 - no cache: the owner's open goes on (and checkpoints) as before
    stack = AsyncExitStack()
    try:
        connection = await stack.enter_async_context(open_cache(cache))
    except BatchLLMError:
        raise
    except Exception as exc:
        raise ConfigurationError("cache", cache.display,
                                 f"could not be opened ({type(exc).__name__})") from exc
    gate = CacheGate(connection, cache, config.cache_mode)
    return ItemCache(gate, cache_refusals=config.cache_refusals, stack=stack)
