"""Calls in flight across processes: a scope's leases in Redis, bounded by ``max_in_flight``.

Each scope with a bound keeps four more keys under its hash tag (one Redis
Cluster slot, beside the keys of :mod:`._redis_lua`):

    {P}:lea  ZSET  lease id -> when the lease expires (server clock)
    {P}:lwq  ZSET  waiting process id -> its place in line (a sequence number)
    {P}:lwa  ZSET  waiting process id -> when its place expires
    {P}:lst  HASH  ``seq`` (the line's counter)

**A lease per call.** A call admitted in a scope with a bound holds one lease
from before its request until its end; the release (success, failure,
cancellation, never started) is synchronous and buffered, and rides on the next
round trip: the local leader's, or the link's flusher task a few milliseconds
later (a task the host owns, not the cancelled worker: a shielded, bounded
cleanup). Every script run first removes the leases whose expiry has passed, so
a process killed with ``kill -9`` gives its slots back within
``in_flight_expiry`` seconds; a living process renews its leases every third of
that from the link's own task (:meth:`RedisLink.serve`), which ends with the host.

**Lease ids are chosen here** (this process's id and a counter) and sent with
the request: a round trip cut short (cancelled, timed out) may have applied, so
every id it asked for is released afterwards; a release of an id never granted
removes nothing.

**Waiting: a line in Redis, polled.** One waiter per process (the leader of its
:class:`~._redis_line.WaitingLine`) asks for as many leases as this process has waiters. A
process that gets none takes a place at the back of the line; free slots go
first to the processes ahead in line (each holds one back for itself), and a
process granted some but not all goes to the back again, so slots go round the
waiting processes in turn rather than to whoever releases and asks first. The
leader polls with a growing, jittered pause (``_POLL_FIRST`` to ``_POLL_MAX``)
and at once when a call of its own ends; no pub/sub connection, so the only cost
of waiting is a few short round trips per second per waiting process. A place
not refreshed for ``_PLACE_SECONDS`` (a dead process) is dropped.
"""

from __future__ import annotations

import math
import random
import secrets
from typing import TYPE_CHECKING, Final, NamedTuple, final

import anyio.lowlevel

from .._observe._log import admission_logger
from ._redis_line import WaitingLine, Want
from ._redis_lua import SCRIPT_NOW, reply_text

if TYPE_CHECKING:
    from ._redis_link import RedisLink

__all__ = ["INFLIGHT_SCRIPT", "InFlightReply", "SharedInFlight", "parse_inflight_reply"]

_POLL_FIRST: Final = 0.01  # seconds: a blocked leader's first pause; it doubles up to _POLL_MAX
_POLL_MAX: Final = 0.25
_PLACE_SECONDS: Final = 5.0  # a place in line not refreshed this long belongs to a dead process

# ARGV: now ('' = the server's TIME), limit, expiry, place seconds, process id, want (>0: ask for the
# next `want` ids below; 0: leave the line; -1: keep the place, refresh it), then counted lists:
# releases, renewals, wanted ids.
_INFLIGHT_TEMPLATE: Final = r"""
local leases, line, alive, st = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
-- @now@
local limit, expiry, place = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local me, want = ARGV[5], tonumber(ARGV[6])
local i = 7

local n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do redis.call('ZREM', leases, ARGV[i]); i = i + 1 end
-- a lease past its expiry is gone, renewed late or not: its process is taken for dead
redis.call('ZREMRANGEBYSCORE', leases, '-inf', now)
local lost = {}
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  if redis.call('ZSCORE', leases, ARGV[i]) then
    redis.call('ZADD', leases, now + expiry, ARGV[i])
  else
    lost[#lost + 1] = ARGV[i]
  end
  i = i + 1
end

local dead = redis.call('ZRANGEBYSCORE', alive, '-inf', now)
for _, id in ipairs(dead) do redis.call('ZREM', line, id) end
if #dead > 0 then redis.call('ZREMRANGEBYSCORE', alive, '-inf', now) end

local granted = {}
if want == 0 then
  redis.call('ZREM', line, me)
  redis.call('ZREM', alive, me)
elseif want < 0 then
  if redis.call('ZSCORE', line, me) then redis.call('ZADD', alive, now + place, me) end
else
  local rank = redis.call('ZRANK', line, me)
  local ahead = rank
  if not ahead then ahead = redis.call('ZCARD', line) end
  local free = limit - redis.call('ZCARD', leases) - ahead
  local count = math.max(0, math.min(want, free))
  n = tonumber(ARGV[i]); i = i + 1
  for k = 1, count do
    redis.call('ZADD', leases, now + expiry, ARGV[i + k - 1])
    granted[#granted + 1] = ARGV[i + k - 1]
  end
  if count == want then
    redis.call('ZREM', line, me)
    redis.call('ZREM', alive, me)
  else
    if count > 0 or not rank then
      redis.call('ZADD', line, redis.call('HINCRBY', st, 'seq', 1), me)  -- to the back of the line
    end
    redis.call('ZADD', alive, now + place, me)
  end
end

local ttl = math.ceil((expiry + place + 60) * 1000)
for _, key in ipairs({leases, line, alive, st}) do redis.call('PEXPIRE', key, ttl) end
local reply = {string.format('%.6f', now), tostring(#lost)}
for _, id in ipairs(lost) do reply[#reply + 1] = id end
for _, id in ipairs(granted) do reply[#reply + 1] = id end
return reply
"""
INFLIGHT_SCRIPT: Final = _INFLIGHT_TEMPLATE.replace("-- @now@\n", SCRIPT_NOW)


class InFlightReply(NamedTuple):
    now: float
    lost: list[str]
    """Renewed leases Redis no longer held: they had expired (this process was silent too long)."""
    granted: list[str]
    """The wanted ids granted, a prefix of those sent, in order."""


def parse_inflight_reply(raw: object) -> InFlightReply:
    if not isinstance(raw, list) or len(raw) < 2:
        raise ValueError(f"unexpected reply from the in-flight script: {raw!r}")
    fields = [reply_text(value) for value in raw]
    lost = int(fields[1])
    return InFlightReply(float(fields[0]), fields[2:2 + lost], fields[2 + lost:])


@final
class SharedInFlight(WaitingLine[str]):
    """One scope's bound on calls in flight in every process together (see the module docstring).

    Its waiters wait for a lease id in a :class:`~._redis_line.WaitingLine`."""

    __slots__ = (
        "_held", "_in_line", "_keys", "_next", "_releases", "expiry", "limit", "lost", "me", "name",
        "round_trips",
    )

    def __init__(self, link: RedisLink, name: str, limit: int, expiry: float) -> None:
        super().__init__(link, _POLL_FIRST, _POLL_MAX)
        self.name = name
        self.limit = limit
        self.expiry = expiry
        self._keys = [f"{{{name}}}:{key}" for key in ("lea", "lwq", "lwa", "lst")]
        self.me = secrets.token_hex(8)  # this process's id in the line, and its lease ids' prefix
        self._next = 0
        self._held: set[str] = set()  # leases granted here and not yet released: what renewal renews
        self._releases: list[str] = []
        self._in_line = False  # whether Redis may hold a place in line for this process
        self.round_trips = 0
        self.lost = 0
        link.add(self)
        link.add_renewer(self)

    def __repr__(self) -> str:
        return f"<SharedInFlight {self.name} held={len(self._held)}/{self.limit} waiting={len(self._queue)}>"

    # -- acquiring ---------------------------------------------------------------

    async def acquire(self) -> str:
        """Wait, in line with this process's other waiters and with the other processes, for a lease."""
        return await self._wait_in_line(Want())

    def _line_empty(self) -> None:
        if self._in_line:
            self._link.want_flush()  # nobody here waits any more: the flusher leaves the line

    async def _ask(self) -> float:
        wants = list(self._queue)
        ids = [self._new_id() for _ in wants]
        reply = await self._round_trip(len(wants), ids)
        for want, lease in zip(wants, reply.granted, strict=False):
            if not self._hand(want, lease):
                self.release(lease)
        return math.inf

    def _paused(self, pause: float) -> float:
        return pause * random.uniform(0.5, 1.0)  # jittered, so that waiting processes do not ask in step

    def _give_back(self, grant: str) -> None:
        self.release(grant)

    def _new_id(self) -> str:
        self._next += 1
        return f"{self.me}:{self._next}"

    async def _round_trip(self, want: int, ids: list[str], renew: bool = False) -> InFlightReply:
        releases, self._releases = self._releases, []
        renewals = sorted(self._held) if renew else []
        script_clock = self._link.script_clock
        args: list[str | int | float] = [
            "" if script_clock is None else repr(script_clock()), self.limit, repr(self.expiry),
            repr(_PLACE_SECONDS), self.me, want, len(releases), *releases, len(renewals), *renewals,
            len(ids), *ids,
        ]
        self.round_trips += 1
        try:
            raw = await self._link.run_source(INFLIGHT_SCRIPT, self._keys, args)
        except BaseException:
            # Not known to have applied: release again what was released, and every id asked for
            # (a ZREM of an id never granted removes nothing). The flusher sends them.
            self._releases[:0] = [*releases, *ids]
            if want != 0:
                self._in_line = True
            self._link.want_flush()
            raise
        reply = parse_inflight_reply(raw)
        if want > 0:
            self._in_line = len(reply.granted) < want
            self._held.update(reply.granted)
        elif want == 0:
            self._in_line = False
        # A lease released while this renewal was on its way is gone for that reason: not lost.
        lost = [lease for lease in reply.lost if lease in self._held]
        self._held.difference_update(lost)
        if lost:
            self.lost += len(lost)
            admission_logger.warning(
                "quota scope %s: %d call(s) in flight lost their lease in Redis (this process did not "
                "renew it within in_flight_expiry=%g s); other processes may use those slots meanwhile",
                self.name, len(lost), self.expiry, extra={"scope": self.name, "lost_leases": len(lost)},
            )
        return reply

    # -- releasing (synchronous: from the Admission's release methods) -----------

    def release(self, lease: str) -> None:
        """The call is over (or never started): its slot goes back with the next round trip."""
        self._held.discard(lease)
        self._releases.append(lease)
        self._kick()  # the leader carries it, and may take the slot for a waiter here

    # -- the link's task ---------------------------------------------------------------

    @property
    def holds_spares(self) -> bool:
        return False

    @property
    def wants_refill(self) -> bool:
        return False

    async def flush_idle(self) -> None:
        """Send buffered releases, and leave the line if nobody here waits, unless a leader will."""
        if self._leader:
            await anyio.lowlevel.checkpoint()
            return
        if self._releases or self._in_line:
            await self._round_trip(-1 if self._queue else 0, [])
        else:
            await anyio.lowlevel.checkpoint()

    async def renew(self) -> None:
        """Push back the expiry of every lease held here, and refresh the place in line."""
        if self._held or self._in_line or self._releases:
            await self._round_trip(-1, [], renew=True)
        else:
            await anyio.lowlevel.checkpoint()

    async def hand_back(self) -> None:
        """At close: release every lease still held here and leave the line."""
        self.closed = True
        self._releases += sorted(self._held)
        self._held.clear()
        if self._releases or self._in_line:
            await self._round_trip(0, [])
        else:
            await anyio.lowlevel.checkpoint()

    def close(self) -> None:
        self._close_line()

    @property
    def pending(self) -> bool:
        """Whether releases made here have not all been sent yet."""
        return bool(self._releases)

    def statistics(self) -> tuple[int, int]:
        """``(leases held here, waiting here)``."""
        return len(self._held), len(self._queue)


def renew_every(expiry: float) -> float:
    """Seconds between renewals: a third of the expiry, so two renewals may fail before a lease is lost."""
    return expiry / 3

