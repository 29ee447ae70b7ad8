"""The request rate discovered from 429s alone, once for every process sharing a Redis-backed scope.

:mod:`._discovery` learns a rate in one process; a scope shared through Redis
learns it in the quota script (:data:`DISCOVERY_LUA`, spliced into
:data:`~._redis_lua.ACQUIRE_SCRIPT`), by the same rules (see that module's
docstring), over the answers and 429s of every process, and paces every grant
by it. Each process then neither paces nor learns by its own
:class:`~._discovery.Discovery` (it is told ``shared``).

State, in the scope's ``{P}:st`` hash (absent until the first 429; rates in
requests per second, times on the script's clock):

    ``dact``    when the first 429 came: discovery is active (never ends while the keys live)
    ``dgen``    the generation: 429s that count (one per decrease or storm step) so far
    ``drate``   the rate in force (absent: none yet, only the storm's probes)
    ``dpeak``   the rate the last decrease came from
    ``dslope``  the growth back to ``dpeak``, per second; ``dpslope`` the growth past it
    ``dgrown``  when the rate last grew (or was set); ``dlim`` when the pace last held a grant back
    ``dtat``    the pace's theoretical arrival time (GCRA, :data:`~._limits.PACE_CREDIT` of credit)
    ``dans``    1: an answer that was not a 429 came since the last decrease
    ``dstorm``  1: nothing gets through, one probe at a time; ``dgap`` between probes when
                nobody said when to come back, ``dprobed`` when the last grant went
    ``dres``    when the last storm ended; ``dflow`` grants since then (or since ``dact``),
                ``dsvf`` answers that were not 429s since then
    ``ddec``    when the rate was last lowered

and two tallies, hashes of whole second -> count over the last 60 s (pruned by
the script when a new second starts, so at most 61 fields each, whatever the
rate): ``{P}:dga`` grants since the first 429, ``{P}:dsv`` answers that were
not 429s.

**Events** ride along with the next round trip, like ends and refunds, and
are applied in the order each process saw them, stamped with the round trip's
``now`` (late by the flush delay or a leader's poll: the rules only compare
times in seconds). Consecutive answers are sent as one (a count and the
highest generation among them): their growth is one step at one ``now`` either
way, and one of them from the current generation ends a storm as all would.
The first 429's *served before* is the script's own tally of answers over the
last window (every process's), not the calls that ended since this process
began; answers are tallied before the first 429 too (``{P}:dsv`` only). A scope
with no RPM or TPM limit asks Redis nothing for its admissions before then, so
its answers ask for a round trip of their own, at most once a second
(:data:`HEAR_EVERY`): that is also how such a process hears that another one's
429 began discovery. A round trip that failed re-sends its 429s (applying one twice is a
no-op: its generation is then old) and drops its answers (the cautious side:
no growth, no storm ended, less served).

**Grants.** While the pace is in force a grant waits until ``dtat - PACE_CREDIT``
and advances ``dtat`` by ``1/drate``; no spare units are leased once discovery
is active (a spare is used later, unpaced). In a storm one probe goes at a
time: with an RPM limit the ``req`` ZSET says whether a call is still open (its
unit scores ``hold`` plus a window after its grant, an ended one a window after
its end), so a probe waits for the answer of a call granted within the last
minute and still open (one open longer may belong to a process that died: it
does not hold the storm up; nor does a spare, handed back at once); without an
RPM limit nothing there knows, so probes go a gap apart, at least a second.
With no RPM or TPM limit a scope takes no round trip before its first 429;
from the reply that reports discovery active on, every admission asks Redis.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final, final

from .._values._config import RateLimitConfig
from ._discovery import _MIN_FIRST_ESTIMATE, _MIN_FLOWING_SHARE, _MIN_MEASURE_SPAN, _STORM_SHARE
from ._limits import PACE_CREDIT, WINDOW_SECONDS

__all__ = ["DISCOVERY_LUA", "HEAR_EVERY", "SharedDiscovery"]

HEAR_EVERY: Final = 1.0
"""Seconds: before discovery is active, an answer asks for a round trip if none came back for this long."""

_DISCOVERY_TEMPLATE: Final = r"""
-- discovery: the rate learnt from 429s alone, for every process (see _redis_discovery)
local ga, sv = KEYS[5], KEYS[6]
local d_on = ARGV[i] == '1'
local d_dec, d_floor, d_rec = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]) / 60, tonumber(ARGV[i + 3])
local d_probe, d_cap, d_first = tonumber(ARGV[i + 4]), math.huge, tonumber(ARGV[i + 6])
if ARGV[i + 5] ~= '' then d_cap = tonumber(ARGV[i + 5]) end
local d_credit, d_span = tonumber(ARGV[i + 7]), tonumber(ARGV[i + 8])
local d_flowing_full = @FLOWING_FULL@  -- seconds of a window that must have flowed to measure by its count
local d_flowing_least = @FLOWING_LEAST@  -- seconds that must have flowed for their rate to say anything
i = i + 9
local NEVER = -1e300
local d_names = {'dact', 'dgen', 'drate', 'dpeak', 'dslope', 'dpslope', 'dgrown', 'dlim', 'dtat', 'dans',
  'dstorm', 'dgap', 'dprobed', 'dres', 'dflow', 'ddec', 'dsvf'}
local D = {}
if d_on then
  local got = redis.call('HMGET', st, unpack(d_names))
  for k = 1, #d_names do D[d_names[k]] = tonumber(got[k]) end
end
for _, name in ipairs({'dgen', 'dpeak', 'dslope', 'dpslope', 'dans', 'dstorm', 'dgap', 'dflow', 'dsvf'}) do
  D[name] = D[name] or 0
end
for _, name in ipairs({'dgrown', 'dlim', 'dtat', 'dprobed', 'dres', 'ddec'}) do D[name] = D[name] or NEVER end

local function d_count(key)  -- events in the last 60 s; drops older seconds
  local all, total = redis.call('HGETALL', key), 0
  for k = 1, #all, 2 do
    if tonumber(all[k]) + 60 <= now then redis.call('HDEL', key, all[k])
    else total = total + tonumber(all[k + 1]) end
  end
  return total
end
local function d_add(key, count)
  if redis.call('HINCRBY', key, tostring(math.floor(now)), count) == count then d_count(key) end
end

local function d_answered(count, gen)
  d_add(sv, count)
  if not D.dact then return end
  if gen >= D.dgen then
    if D.dstorm == 1 then D.dres, D.dflow, D.dsvf = now, 0, 0 end  -- calls flow again: measure from here
    D.dans, D.dstorm, D.dgap = 1, 0, 0
  end
  D.dsvf = D.dsvf + count
  local rate = D.drate
  if rate == nil then return end
  if D.dlim >= D.dgrown then
    -- back to the peak within the recovery time, then beyond it only slowly
    local elapsed, peak = now - D.dgrown, D.dpeak
    if rate < peak then
      local to_peak = 0
      if D.dslope > 0 then to_peak = (peak - rate) / D.dslope end
      if elapsed <= to_peak then rate = rate + D.dslope * elapsed
      else rate = peak + D.dpslope * (elapsed - to_peak) end
    else
      rate = rate + D.dpslope * elapsed
    end
    D.drate = math.min(d_cap, rate)
  end
  D.dgrown = now
end

local function d_limited(gen, asked)
  if not D.dact then
    -- the first: measuring begins, one call at a time goes; what got through sets the first pace
    D.dact, D.dgen, D.dstorm, D.dflow, D.dsvf = now, D.dgen + 1, 1, 0, 0
    local served = d_count(sv)
    if served >= d_first then
      D.drate = math.max(d_floor, math.min(d_cap, served / 60))
      D.dpeak = D.drate
      D.dslope = d_probe * D.drate / 60
      D.dpslope = D.dslope
      D.dgrown = now
    end
    return
  end
  if gen < D.dgen then return end  -- admitted before the last decrease: that storm is answered
  D.dgen = D.dgen + 1
  if D.dans == 0 then
    D.dstorm = 1
    if not asked then D.dgap = math.min(60, math.max(1, 2 * D.dgap)) end
    return
  end
  -- BEGIN decrease rule (as _discovery.Discovery.rate_limited: keep the two in step)
  local full = now - D.dact >= 60
  if D.drate ~= nil and now - D.ddec < d_rec then
    -- within the climb back from the last decrease, only a window serving well below the rate counts
    if not (full and d_count(sv) / 60 < d_dec * D.drate) then return end
  end
  D.dans, D.ddec = 0, now
  -- the rate admitted since calls last flowed (the first 429 or the storm's end), within a window
  local flowing = now - math.max(D.dact, D.dres)
  local current
  if flowing < 60 then current = D.dflow / math.max(d_span, flowing) else current = d_count(ga) / 60 end
  if D.drate ~= nil and D.drate < current then current = D.drate end
  current = math.min(d_cap, current)
  local peak = current
  if full then  -- what a whole window served is about the limit: down from it, back up to it
    local served = math.max(d_floor, d_count(sv) / 60)
    current = math.min(current, served)
    peak = math.min(d_cap, served)
    if d_flowing_least <= flowing and flowing < d_flowing_full then  -- a storm took part: back to what flowed
      peak = math.min(d_cap, math.max(peak, D.dsvf / math.max(d_span, flowing)))
    end
  end
  D.drate = math.max(d_floor, d_dec * current)
  D.dpeak = math.max(peak, D.drate)
  D.dslope = (D.dpeak - D.drate) / d_rec
  D.dpslope = d_probe * D.dpeak / 60
  D.dgrown = now
  -- END decrease rule
end

n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  local kind, a, b = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]); i = i + 3
  if kind == 'a' then d_answered(a, b) else d_limited(a, b == 1) end
end

local d_granted = 0
local function d_ready()  -- when the pace and the storm let the next grant go (nil: now)
  if not D.dact then return nil end
  local ready = NEVER
  if D.drate then
    ready = D.dtat - d_credit
    if ready > now then D.dlim = now end
  end
  if D.dstorm == 1 then
    local probe
    if limit > 0 then  -- calls still open, admitted within the last minute (see the docstring)
      local since = string.format('(%.17g', now + window + math.max(0, hold - 60))
      local open = redis.call('ZCOUNT', req, since, '+inf')
      if open > 0 then probe = now + 1 else probe = D.dprobed + D.dgap end
    else
      probe = D.dprobed + math.max(D.dgap, 1)
    end
    if probe > ready then ready = probe end
  end
  if ready > now then return ready end
  return nil
end
local function d_commit()
  if not D.dact then return end
  d_granted = d_granted + 1
  D.dflow = D.dflow + 1
  D.dprobed = now
  if D.drate then D.dtat = math.max(D.dtat, now) + 1 / D.drate end
end
local function d_finish()  -- saves the state; returns the generation and the rate for the reply
  if not D.dact then return '0', '' end
  if d_granted > 0 then d_add(ga, d_granted) end
  local fields = {}
  for _, name in ipairs(d_names) do
    if D[name] ~= nil then
      fields[#fields + 1] = name
      fields[#fields + 1] = string.format('%.17g', D[name])
    end
  end
  redis.call('HSET', st, unpack(fields))
  local rate = ''
  if D.drate then rate = string.format('%.17g', D.drate) end
  return tostring(D.dgen), rate
end
"""
# The same constants for both rule books.
DISCOVERY_LUA: Final = _DISCOVERY_TEMPLATE.replace(
    "@FLOWING_FULL@", repr((1.0 - _STORM_SHARE) * WINDOW_SECONDS)).replace(
    "@FLOWING_LEAST@", repr(_MIN_FLOWING_SHARE * WINDOW_SECONDS))

Event = tuple[str, int, int]  # ("a", answers, highest generation) or ("r", generation, asked: 0/1)


@final
class SharedDiscovery:
    """One process's side of the shared discovery: its events until the next round trip, the last reply.

    ``kick`` asks for a round trip soon: a 429 at once (it must reach every
    process), answers only as :data:`HEAR_EVERY` says (otherwise they wait
    for the next round trip). ``clock`` is the link's.
    """

    __slots__ = ("_clock", "_events", "_heard_at", "_kick", "_settings", "enabled", "generation", "rate")

    def __init__(self, config: RateLimitConfig | None, requests_per_minute: float | None,
                 kick: Callable[[], None], clock: Callable[[], float]) -> None:
        config = config or RateLimitConfig()
        self.enabled = config.learn_limits
        cap = "" if requests_per_minute is None else repr(requests_per_minute / WINDOW_SECONDS)
        self._settings: list[str | int | float] = [
            "1" if self.enabled else "0", repr(config.discovery_decrease), repr(config.discovery_min_rpm),
            repr(config.discovery_recovery_seconds), repr(config.discovery_probe), cap, _MIN_FIRST_ESTIMATE,
            repr(PACE_CREDIT), repr(_MIN_MEASURE_SPAN),
        ]
        self._kick = kick
        self._clock = clock
        self._heard_at = -math.inf  # when the last reply came back
        self._events: list[Event] = []
        self.generation = 0  # the discovery generation of the last reply (0: not active)
        self.rate: float | None = None  # the shared rate in force, requests per second

    @property
    def active(self) -> bool:
        """Whether the last reply said discovery is active (then every admission asks Redis)."""
        return self.generation > 0

    @property
    def buffered(self) -> bool:
        return bool(self._events)

    def answered(self, generation: int) -> None:
        """An answer that was not a 429, to a call granted in ``generation``."""
        if not self.enabled:
            return
        events = self._events
        if events and events[-1][0] == "a":
            _, count, highest = events[-1]
            events[-1] = ("a", count + 1, max(highest, generation))
        else:
            events.append(("a", 1, generation))
        if not self.active and self._clock() >= self._heard_at + HEAR_EVERY:
            self._kick()

    def rate_limited(self, generation: int, asked_to_wait: bool) -> None:
        """A 429 that reported no budget, to a call granted in ``generation``."""
        if self.enabled:
            self._events.append(("r", generation, int(asked_to_wait)))
            self._kick()

    def take(self) -> tuple[list[str | int | float], list[Event]]:
        """The script's arguments for the next round trip, and the events they carry."""
        events, self._events = self._events, []
        args = [*self._settings, len(events)]
        for event in events:
            args += event
        return args, events

    def give_back(self, events: list[Event]) -> None:
        """A round trip that may not have applied: its 429s go again, its answers are dropped."""
        self._events[:0] = [event for event in events if event[0] == "r"]

    def read(self, generation: int, rate: float | None) -> None:
        self.generation, self.rate = generation, rate
        self._heard_at = self._clock()
