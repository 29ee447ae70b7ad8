"""One owner's use of one cache under a :data:`CacheMode`: look a key up, or claim it and settle it.

Single flight (``read-write`` mode): identical requests in flight at once are made once.

* **In this process.** Every gate over the same cache (the same file, server and
  table or namespace, or the same :class:`MemoryResponseCache`) in one event loop
  shares one in-flight map (a ``RunVar``), so two pools of one program do not
  duplicate a call. The first lookup of a missing key leads: it gets a
  :class:`Claim`; later lookups of that key wait for it. When the leader settles
  with an answer they get that answer (a hit); when it settles with ``None`` (it
  failed, or was cancelled) the first of them to run leads next, and the rest
  wait for that one.
* **Across processes.** The leader also claims the key on the connection for
  ``config.lease_seconds``. A process that finds it claimed polls ``get`` (20 ms,
  doubling to 500 ms) until the answer appears or the claim lapses (then it
  claims). The leader writes before it lets go, and re-reads after it claims,
  so a key is called once unless a call outlives the lease (then at most twice:
  the lease is not renewed, so choose ``lease_seconds`` above the longest call).

Other modes share nothing and wait for no one: ``read-only`` reads (a miss is made
by the caller, and nothing is written); ``write-only`` and ``refresh`` never read,
and so never take an answer from another caller either: each call is made and
written (the last write wins), which is what filling or refreshing a cache asks.

No task is started. A waiter's cancellation propagates untouched (it holds
nothing); a leader cancelled in :meth:`CacheGate.lookup` lets the next waiter
lead. :meth:`CacheGate.settle` wakes this process's waiters in a ``finally`` with
no await, so a caller that shields it with a bound (as it must, in its own
``finally``) never strands them; if the bound cuts the release short, the claim lapses.
"""

from __future__ import annotations

import itertools
import os
import secrets
import socket
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Final, final

import anyio
import anyio.lowlevel

from .._values._response_cache import CacheMode, MemoryResponseCache, ResponseCache, SqliteResponseCache
from ._connection import CacheConnection
from ._records import CachedAnswer, CacheKey

__all__ = ["CacheGate", "Claim", "GateStatistics", "cache_identity"]

_FIRST_POLL: Final = 0.02
_LONGEST_POLL: Final = 0.5
_RELEASE_BOUND: Final = 5.0
"""Seconds a leader cancelled inside ``lookup`` spends letting go of its claim (shielded)."""


@final
class _Flight:
    """One key's call in flight in this process: waiters wait on ``done``, then read ``answer``."""

    __slots__ = ("answer", "done")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.answer: CachedAnswer | None = None


_FLIGHTS: anyio.lowlevel.RunVar[dict[Hashable, dict[str, _Flight]]] = anyio.lowlevel.RunVar(
    "trio_batch_llm.cache_flights")
_holders = itertools.count(1)


def cache_identity(config: ResponseCache) -> Hashable:
    """What makes two cache values the same cache: a file, a server's table or namespace, a memory dict."""
    if isinstance(config, MemoryResponseCache):
        return ("memory", id(config.entries))
    if isinstance(config, SqliteResponseCache):
        from ._sqlite_schema import default_cache_path

        path = config.path if config.path is not None else default_cache_path()
        return ("sqlite", os.path.abspath(os.fspath(path)))
    return (type(config).__name__, config.display, getattr(config, "table", None),
            getattr(config, "namespace", None))


def _shared_flights(config: ResponseCache) -> dict[str, _Flight]:
    try:
        registry = _FLIGHTS.get()
    except LookupError:
        registry = {}
        _FLIGHTS.set(registry)
    return registry.setdefault(cache_identity(config), {})


@final
@dataclass(slots=True)
class Claim:
    """The caller makes the call for ``key`` and must :meth:`CacheGate.settle` it (in a ``finally``)."""

    key: CacheKey
    settled: bool = False
    holder: str | None = field(default=None, repr=False)
    """The connection claim's holder, when the key is claimed across processes."""
    flight: _Flight | None = field(default=None, repr=False, compare=False)
    """This process's flight that waiters wait on, when the mode has single flight."""


@final
@dataclass(frozen=True, slots=True)
class GateStatistics:
    """A gate's counts: ``hits`` read from the cache, ``shared`` answers taken from another caller's
    call (in this process or another), ``claims`` handed out (calls to make), ``waits`` for another
    caller, ``polls`` of a key another process held."""

    hits: int
    shared: int
    claims: int
    waits: int
    polls: int


class CacheGate:
    """Lookups and writes of one owner (a processor, a pool, a run's driver) through one connection.

    ``isolated=True``: a gate that shares no in-flight map with the other gates of
    this event loop, as if in another process (tests of cross-process single flight).
    """

    def __init__(self, connection: CacheConnection, config: ResponseCache, mode: CacheMode, *,
                 isolated: bool = False) -> None:
        self.connection = connection
        self.config = config
        self.mode = mode
        self.reads = mode in ("read-write", "read-only")
        self.writes = mode != "read-only"
        self.single_flight = mode == "read-write"
        self._flights: dict[str, _Flight] | None = {} if isolated else None
        self._holder = f"{socket.gethostname()}:{os.getpid()}:{next(_holders)}:{secrets.token_hex(4)}"
        self._hits = self._shared = self._claims = self._waits = self._polls = 0

    def statistics(self) -> GateStatistics:
        return GateStatistics(self._hits, self._shared, self._claims, self._waits, self._polls)

    def _flight_map(self) -> dict[str, _Flight]:
        if self._flights is None:
            self._flights = _shared_flights(self.config)  # in the event loop: the RunVar is per loop
        return self._flights

    async def lookup(self, key: CacheKey) -> CachedAnswer | Claim:
        """A hit (when the mode reads), or a :class:`Claim`: make the call, then settle it."""
        if self.reads:
            found = await self.connection.get(key)
            if found is not None:
                self._hits += 1
                return found
        else:
            await anyio.lowlevel.checkpoint()
        if not self.single_flight:
            self._claims += 1
            return Claim(key)
        flights = self._flight_map()
        while (flight := flights.get(key.digest)) is not None:
            self._waits += 1
            await flight.done.wait()
            if flight.answer is not None:
                self._shared += 1
                return flight.answer
            # Its leader failed: the first waiter to get here leads next; the others wait for it.
        flight = _Flight()
        flights[key.digest] = flight
        try:
            found = await self._lead_across(key)
        except BaseException:
            self._land(key.digest, flight, None)
            raise
        if found is not None:
            self._land(key.digest, flight, found)
            return found
        self._claims += 1
        return Claim(key, holder=self._holder, flight=flight)

    async def _lead_across(self, key: CacheKey) -> CachedAnswer | None:
        """Claim ``key`` on the connection (``None``), or the answer another process wrote meanwhile."""
        pause = _FIRST_POLL
        while not await self.connection.claim(key, self._holder, self.config.lease_seconds):
            self._polls += 1
            await anyio.sleep(pause)
            pause = min(2 * pause, _LONGEST_POLL)
            found = await self.connection.get(key)
            if found is not None:
                self._shared += 1
                return found
        try:
            # Written between our miss and our claim (its writer let go after writing)?
            found = await self.connection.get(key)
        except BaseException:
            with anyio.CancelScope(shield=True) as scope:
                scope.deadline = anyio.current_time() + _RELEASE_BOUND
                await self.connection.release(key, self._holder)
            raise
        if found is not None:
            await self.connection.release(key, self._holder)
            self._hits += 1
        return found

    def _land(self, digest: str, flight: _Flight, answer: CachedAnswer | None) -> None:
        """Synchronously: end ``flight`` with ``answer`` and wake its waiters."""
        flight.answer = answer
        flights = self._flight_map()
        if flights.get(digest) is flight:
            del flights[digest]
        flight.done.set()

    async def settle(self, claim: Claim, answer: CachedAnswer | None) -> None:
        """The claimed call ended: ``answer`` (a validated success) is written when the mode writes;
        ``None`` (a failure, a cancellation) writes nothing. Call it exactly once per claim."""
        if claim.settled:
            await anyio.lowlevel.checkpoint()
            return
        claim.settled = True
        try:
            if answer is not None and self.writes:
                await self.connection.put(claim.key, answer)
            else:  # nothing to write: still a checkpoint on every path (the release below may not run)
                await anyio.lowlevel.checkpoint()
        finally:
            if claim.flight is not None:
                # Synchronous, so it happens even when a bound cut the write short: waiters get the
                # answer (or lead next). After the write: a later lookup of this key reads it.
                self._land(claim.key.digest, claim.flight, answer)
            if claim.holder is not None:
                # After the write too: a process polling this key reads the answer once it may claim.
                await self.connection.release(claim.key, claim.holder)
