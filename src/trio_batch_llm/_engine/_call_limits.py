"""The limits that concurrent ``call()``s on one strategy share within an event loop.

Each ``call()`` runs in its own short-lived :class:`~._pool.LLMCallPool`, whose
host would give it a quota scope of its own: ``gather()`` of ten calls with
``concurrency=4`` would put forty requests in flight. Instead every ``call()``
borrows one :class:`~trio_batch_llm._admission.QuotaScope` per strategy and
per set of limits (concurrency, RPM, TPM, rate-limit policy) from the running
event loop's :class:`CallLimits`:

- held per event loop (:class:`~.._core._per_loop.PerLoop`), so two loops never share (an anyio primitive
  bound to a loop must not be touched from another);
- keyed weakly by the strategy: the scope lives as long as the strategy, so
  sequential calls also remember a cooldown, and dropping the strategy drops
  it; strategies whose ``quota_scope()`` keys are equal (and not the strategy
  itself) share one scope, as they do inside a processor;
- a scope owns no task and needs no close (:class:`QuotaScope` is a plain
  state machine woken by the releases themselves), so nothing here has to be
  owned, cancelled or cleaned up.

Calls with different limits on one strategy do not share: each set of limits
is its own scope (the docs say so). A strategy that cannot be weakly
referenced is not shared, as before.
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable
from typing import Any, final

from .._admission import QuotaScope
from .._core._per_loop import PerLoop
from .._observe._log import FailureLog
from .._strategies._base import LLMCallStrategy
from .._values._config import ProcessorConfig

__all__ = ["CallLimits", "SharedLimits", "call_limits"]


@final
class SharedLimits:
    """What the ``call()``s of one strategy and one set of limits share: the scope, the failure log."""

    __slots__ = ("__weakref__", "failures", "scope")

    def __init__(self, scope: QuotaScope) -> None:
        self.scope = scope
        self.failures = FailureLog("strategy's call()s", quiet=True)  # each caller holds its failure


def _limits_of(config: ProcessorConfig) -> Hashable:
    return (config.provider_concurrency, config.max_requests_per_minute, config.max_tokens_per_minute,
            config.rate_limit)


@final
class CallLimits:
    """One event loop's shared ``call()`` limits (see the module docstring)."""

    __slots__ = ("_by_key", "_by_strategy")

    def __init__(self) -> None:
        self._by_strategy: weakref.WeakKeyDictionary[LLMCallStrategy[Any], dict[Hashable, SharedLimits]] = (
            weakref.WeakKeyDictionary()
        )
        self._by_key: weakref.WeakValueDictionary[Hashable, SharedLimits] = weakref.WeakValueDictionary()

    def shared(self, strategy: LLMCallStrategy[Any], config: ProcessorConfig) -> SharedLimits | None:
        """The limits ``strategy``'s calls under ``config`` share; ``None`` when they cannot be shared."""
        try:
            limits = _limits_of(config)
            hash(limits)
            per_strategy = self._by_strategy.get(strategy)
            if per_strategy is None:
                per_strategy = self._by_strategy[strategy] = {}
        except TypeError:  # an unhashable limit, or a strategy without weak references
            return None
        shared = per_strategy.get(limits)
        if shared is not None:
            return shared
        key = strategy.quota_scope()
        by_key: Hashable | None = None
        if key is not strategy:
            try:
                hash(key)
            except TypeError:  # an unhashable key shares a scope only with itself: with this strategy
                pass
            else:
                by_key = (key, limits)
                shared = self._by_key.get(by_key)
        if shared is None:
            shared = SharedLimits(QuotaScope.from_config(config, name=f"{key!r} (call)"))
            if by_key is not None:
                self._by_key[by_key] = shared
        per_strategy[limits] = shared
        return shared

    def statistics(self) -> int:
        """How many strategies have shared limits in this loop (for tests)."""
        return len(self._by_strategy)


_CALL_LIMITS: PerLoop[CallLimits] = PerLoop("trio_batch_llm.call_limits", CallLimits)


def call_limits() -> CallLimits:
    """The running event loop's shared ``call()`` limits (created on first use)."""
    return _CALL_LIMITS.get()
