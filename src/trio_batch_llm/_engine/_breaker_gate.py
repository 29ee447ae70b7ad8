"""A quota scope's circuit breaker as the item path uses it: wait at its gate, report outcomes.

:class:`~._breaker.CircuitBreaker` decides; this wakes the items waiting at the gate
when an outcome changes what they may do, and says once when the scope was retired
(``on_retire``). One per (owner, quota scope): an owner is a processor or a pool.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias, final

import anyio

from .._values._breaker_config import CircuitBreakerConfig
from ._breaker import GO, PROBE, CircuitBreaker

if TYPE_CHECKING:
    from ._classify import Classification

__all__ = ["BreakerGate", "Breakers", "OnRetire", "Retirement", "scope_label", "tell_gate"]

logger = logging.getLogger("trio_batch_llm.engine")


def scope_label(name: object) -> str:
    """A quota scope's name (a key's repr) as a message shows it: without a key's fingerprint hash."""
    return _HASH.sub("", str(name)) if name else "default"


_HASH = re.compile(r", '[0-9a-f]{16,}'")


@final
@dataclass(frozen=True, slots=True)
class Retirement:
    """A scope the breaker retired: why (``reason`` names the cause and the first error), and the
    item whose failure opened the breaker."""

    scope: str
    reason: str
    first_error: str
    item_id: str | None


@final
class BreakerGate:
    """The gate of one scope: :meth:`enter` before an attempt (``None``: retired), then exactly one
    of :meth:`answered`, :meth:`failed` or :meth:`released` for it."""

    __slots__ = ("_changed", "_on_retire", "clock", "core", "retirement", "scope")

    def __init__(self, config: CircuitBreakerConfig, scope: str, *,
                 on_retire: Callable[[Retirement], None] | None = None,
                 clock: Callable[[], float] = anyio.current_time) -> None:
        self.core = CircuitBreaker(config)
        self.scope = scope
        self.retirement: Retirement | None = None
        self._on_retire = on_retire
        self.clock = clock
        self._changed: anyio.Event | None = None  # made only when someone waits: none on the hot path

    def try_enter(self) -> bool | None:
        """Without waiting: ``False`` to go, ``True`` to go as the probe, ``None`` to :meth:`enter`."""
        gate = self.core.gate(self.clock())
        if gate is GO:
            return False
        return True if gate is PROBE else None

    async def enter(self) -> bool | None:
        """Wait until an attempt may start: ``False`` to go, ``True`` to go as the probe, ``None``
        when the scope is retired. A cancellation while waiting leaves nothing counted."""
        core = self.core
        while True:
            gate = core.gate(self.clock())
            if gate is GO:
                return False  # noqa: ASYNC910 - the caller's admission and call checkpoint
            if gate is PROBE:
                return True  # noqa: ASYNC910 - as above
            if gate.kind == "retired":
                return None  # noqa: ASYNC910 - as above
            changed = self._changed
            if changed is None:
                changed = self._changed = anyio.Event()
            with anyio.move_on_at(gate.until):
                await changed.wait()

    def answered(self, *, probe: bool) -> None:
        """The attempt reached the endpoint (an answer, or a failure that is not endpoint-unusable)."""
        if self.core.answered(probe=probe):
            logger.info("circuit breaker of quota scope %s closed: the endpoint answered", self.scope)
        self._wake()

    def failed(self, cause: str, error: str, item_id: str, *, probe: bool) -> None:
        """The attempt failed with an endpoint-unusable error (``cause``: what it said of the endpoint)."""
        core = self.core
        if core.failed(self.clock(), error, item_id, probe=probe, cause=cause):
            trip = core.trip
            assert trip is not None
            if core.state == "retired":
                self._retire()
            elif not probe:
                logger.warning(
                    "circuit breaker of quota scope %s opened: %s, %d attempts in a row (first: %s); "
                    "one probe in %g s", self.scope, trip.cause, trip.failures, trip.first_error,
                    core.config.pause)
        self._wake()

    def released(self, *, probe: bool) -> None:
        """The attempt ended without an outcome (cut short, or its admission was refused)."""
        self.core.released(probe=probe)
        self._wake()

    def _retire(self) -> None:
        core = self.core
        trip = core.trip
        assert trip is not None
        config = core.config
        probes = f"{config.probes} probe{'s' if config.probes != 1 else ''}"
        reason = (f"provider retired: {trip.cause} (quota scope {self.scope}: {trip.failures} attempts in a "
                  f"row failed, then {probes} after {config.pause:g} s); first error: {trip.first_error}")
        self.retirement = retirement = Retirement(self.scope, reason, trip.first_error, trip.item_id)
        logger.error("%s", reason)
        if self._on_retire is not None:
            self._on_retire(retirement)

    def retire_now(self, retirement: Retirement) -> None:
        """Retire the scope at once (a batch-stopping error, :meth:`Breakers.stop_batch`): nothing goes
        again, and the items waiting at the gate end (the owner was told already)."""
        if self.retirement is None:
            self.retirement = retirement
        self.core.state = "retired"
        self._wake()

    def _wake(self) -> None:
        changed = self._changed
        if changed is not None:
            self._changed = None
            changed.set()


OnRetire: TypeAlias = Callable[[Retirement], None]


@final
class Breakers:
    """An owner's circuit breakers (a processor's, a pool's): one per quota scope, whichever
    strategy uses it; none when the config turns them off."""

    __slots__ = ("_clock", "_config", "_gates", "_on_retire", "stopped")

    def __init__(self, config: CircuitBreakerConfig | None, on_retire: OnRetire | None,
                 clock: Callable[[], float]) -> None:
        self._config = config
        self._on_retire = on_retire
        self._clock = clock
        self._gates: dict[int, tuple[object, BreakerGate]] = {}
        self.stopped: Retirement | None = None
        """Set by a batch-stopping error (:meth:`stop_batch`): no attempt of this owner starts again."""

    def stop_batch(self, scope: object, reason: str, first_error: str, item_id: str) -> None:
        """A failure said no later call can succeed (``ProviderError(stops_batch=...)``): retire this
        owner's every scope at once, with or without breakers, and tell the owner (the first stop wins).

        Calls in flight finish, as at a breaker's retirement; items waiting at a gate end now."""
        if self.stopped is not None:
            return
        self.stopped = retirement = Retirement(scope_label(getattr(scope, "name", None)), reason, first_error,
                                               item_id)
        logger.error("%s", reason)
        for _, gate in self._gates.values():
            gate.retire_now(retirement)
        if self._on_retire is not None:
            self._on_retire(retirement)

    def of(self, scope: object) -> BreakerGate | None:
        config = self._config
        if config is None:
            return None
        known = self._gates.get(id(scope))
        if known is not None and known[0] is scope:
            return known[1]
        gate = BreakerGate(config, scope_label(getattr(scope, "name", None)), on_retire=self._on_retire,
                           clock=self._clock)
        if self.stopped is not None:
            gate.retire_now(self.stopped)
        self._gates[id(scope)] = (scope, gate)
        return gate


def tell_gate(gate: BreakerGate | None, probe: bool, item_id: str = "", verdict: Classification | None = None,
              exc: BaseException | None = None, *, cut: bool = False) -> None:
    """Tell ``gate``, which let an attempt go (``probe``: as its probe), how it ended: ``cut`` without
    an outcome, else by ``verdict`` (``None``: it answered)."""
    if gate is None:
        return
    if cut:
        gate.released(probe=probe)
    elif verdict is not None and verdict.unusable_because is not None:
        gate.failed(verdict.unusable_because, f"{type(exc).__name__}: {exc}", item_id, probe=probe)
    else:
        gate.answered(probe=probe)
