"""The one atomic Lua script behind a Redis-backed quota scope, and how its reply is read.

Each scope keeps six keys, all under one hash tag so a Redis Cluster puts them
in one slot (a script may touch only keys of one slot):

    {P}:req   ZSET  request units: member = unit id, score = when it stops counting
    {P}:tok   ZSET  token entries: member = entry id, score = when it leaves the window
    {P}:amt   HASH  token entry id -> tokens it charges now
    {P}:st    HASH  ``id`` (unit counter), ``tok`` (tokens charged in the window), ``cool``
                    (the shared cooldown's end), ``gen`` (cooldowns started), ``rc``/``rm``/``rr``
                    (the provider's reported request budget: ceiling, its answer's mark, reset),
                    ``tc`` (tokens charged since the scope began: reservations and debts, never
                    lowered), ``kc``/``km``/``kr`` (the reported token budget, as ``rc``/``rm``/``rr``),
                    ``d...`` (the discovered rate: :mod:`._redis_discovery`)
    {P}:dga, {P}:dsv  HASH  second -> grants, answers (:mod:`._redis_discovery`)

**Reported budgets.** A unit's id is the scope's grant counter just after it
(its *mark*, as in :mod:`._pacing`). An answer to the call with mark ``m``
saying ``left`` requests remain until ``reset`` lets the counter reach
``m + left - margin`` until then, whichever process sent the calls: calls
granted after that one, anywhere, are already counted.

The reported token budget works the same way on ``tc``: a call's token mark is
``tc`` just after its reservation (the reply gives it with the unit id), and an
answer saying ``left`` tokens remain lets ``tc`` reach ``mark + left - margin``
until its reset. ``tc`` counts what was reserved and what was owed beyond it,
and a refund or a call that used less never lowers it: the strict side, as the
request counter, which refunds do not lower either. A call with no estimate
(0 tokens) counts as 1 against that ceiling, so it waits too once it is reached.

A request unit counts as :class:`~._limits.RequestRateCore` counts it: from its
admission until a window after its call *ended*. A call still open counts
until ``admitted + hold + window`` (``hold``: the backend's ``max_call_seconds``),
so a process that dies with calls in flight frees their units after that, not never.

**Time** is the Redis server's (``TIME``), read once per script run: every
process on every machine then agrees on one clock and no skew between hosts
can open a window early. ``ARGV[1]`` may pass ``now`` instead; only the tests'
fake clocks use that, and a deployment must not mix the two.

**Idempotent settlement.** A round trip that fails after Redis ran it leaves us
not knowing whether it applied, so what is re-sent must not loosen anything when
applied twice: an end re-stamps the unit (``ZADD`` at now + window, later and so
stricter), a refund removes it (``ZREM``), a token settlement *sets* the entry to
``min(current, actual)`` and a debt is an entry named after its reservation (``NX``).
"""

from __future__ import annotations

from typing import Final, NamedTuple

from ._redis_discovery import DISCOVERY_LUA

__all__ = ["ACQUIRE_SCRIPT", "SCRIPT_NOW", "AcquireReply", "parse_reply", "reply_text"]

SCRIPT_NOW: Final = r"""local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
"""
"""How every script of a shared scope reads the time (``-- @now@`` in a template; see **Time** above).

The server's ``TIME``, once per run, so that every process on every machine measures windows,
leases and cooldowns on one clock; ``ARGV[1]`` set (not ``''``) is a test's fake clock instead."""

_TEMPLATE: Final = r"""
local req, tok, amt, st = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
-- @now@
local limit, window, hold = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local tpm, spare, cool = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local i = 8

-- 1. settle what this process reported since its last round trip
local n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do redis.call('ZADD', req, now + window, ARGV[i]); i = i + 1 end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do redis.call('ZREM', req, ARGV[i]); i = i + 1 end

local total = tonumber(redis.call('HGET', st, 'tok') or '0')
if tpm > 0 then
  local gone = redis.call('ZRANGEBYSCORE', tok, '-inf', now)
  for _, id in ipairs(gone) do
    total = total - tonumber(redis.call('HGET', amt, id) or '0')
    redis.call('HDEL', amt, id)
  end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', tok, '-inf', now) end
end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  local id, reserved, actual = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]); i = i + 3
  if actual < reserved then
    local current = tonumber(redis.call('HGET', amt, id) or '-1')
    if current > actual then
      redis.call('HSET', amt, id, actual)
      total = total - (current - actual)
    end
  elseif actual > reserved and tpm > 0 then
    if redis.call('ZADD', tok, 'NX', now + 60, 'd' .. id) == 1 then
      redis.call('HSET', amt, 'd' .. id, actual - reserved)
      total = total + actual - reserved
      redis.call('HINCRBY', st, 'tc', actual - reserved)
    end
  end
end

-- a budget the provider reported, kept in the fields <kind>c (the ceiling), <kind>m (the mark it
-- came with) and <kind>r (its reset): one fold for both kinds, so requests and tokens cannot drift
-- apart; a newer mark replaces the ceiling, an older one may only lower it
local function fold_budget(kind, afresh_after_reset)
  local c = tonumber(redis.call('HGET', st, kind .. 'c') or '-1')
  local m = tonumber(redis.call('HGET', st, kind .. 'm') or '-1')
  local r = tonumber(redis.call('HGET', st, kind .. 'r') or '0')
  n = tonumber(ARGV[i]); i = i + 1
  for _ = 1, n do
    local mark, left, after, margin = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]),
      tonumber(ARGV[i + 3]); i = i + 4
    local ceiling = mark + left - margin
    if mark > m or (afresh_after_reset and now >= r) then c, m, r = ceiling, mark, now + after
    elseif ceiling < c then c = ceiling end
  end
  if n > 0 then redis.call('HSET', st, kind .. 'c', c, kind .. 'm', m, kind .. 'r', r) end
  return c, m, r
end
-- the request budget, as a ceiling on the grant counter (see _pacing)
local rc, rm, rr = fold_budget('r', false)
-- the token budget, the same way on the token charge total; token marks repeat (calls of 0
-- tokens): once the reset passed, any answer starts afresh
local kc, km, kr = fold_budget('k', true)

-- a cooldown one process reports pauses every process: joined (the later end wins), never added
-- end to end, so a storm seen by ten processes is one pause, not ten; 'gen' lets each process
-- see that a new one began (it joins it locally: _scope's join_cooldown)
local until_ = tonumber(redis.call('HGET', st, 'cool') or '0')
if cool ~= '' and now + tonumber(cool) > until_ then
  until_ = now + tonumber(cool)
  redis.call('HSET', st, 'cool', until_)
  redis.call('HINCRBY', st, 'gen', 1)
end

-- @discovery@

-- 2. admit the waiters, in order, while everything fits; then spare units
-- (in order: the first that does not fit stops the rest, so a large request is never starved by
-- smaller ones behind it, across processes as within one)
if limit > 0 then redis.call('ZREMRANGEBYSCORE', req, '-inf', now) end
n = tonumber(ARGV[i]); i = i + 1
local ids = {}
local ready = ''
local function blocked(tokens)
  local paced = d_ready()
  if now < until_ then return until_ end
  if rc >= 0 and now < rr and tonumber(redis.call('HGET', st, 'id') or '0') + 1 > rc then return rr end
  if km >= 0 and now < kr and tonumber(redis.call('HGET', st, 'tc') or '0') + math.max(tokens, 1) > kc then
    return kr
  end
  if limit > 0 then
    local excess = redis.call('ZCARD', req) + 1 - limit
    if excess > 0 then
      local at = redis.call('ZRANGE', req, excess - 1, excess - 1, 'WITHSCORES')
      return tonumber(at[2])
    end
  end
  if tpm > 0 and tokens > 0 and total + tokens > tpm then
    local excess, freed = total + tokens - tpm, 0
    local entries = redis.call('ZRANGE', tok, 0, -1, 'WITHSCORES')
    for k = 1, #entries, 2 do
      freed = freed + tonumber(redis.call('HGET', amt, entries[k]) or '0')
      if freed >= excess then return tonumber(entries[k + 1]) end
    end
  end
  return paced
end
local function grant(tokens)
  local id = tostring(redis.call('HINCRBY', st, 'id', 1))
  -- an open call counts until admitted + hold + window: its end re-stamps it (settle, above), and a
  -- process that dies with calls open frees their units after that, not never
  if limit > 0 then redis.call('ZADD', req, now + hold + window, id) end
  if tpm > 0 and tokens > 0 then
    redis.call('ZADD', tok, now + 60, id)
    redis.call('HSET', amt, id, tokens)
    total = total + tokens
  end
  ids[#ids + 1] = id
  ids[#ids + 1] = tostring(redis.call('HINCRBY', st, 'tc', tokens))
  d_commit()
end
local wanted = n
for _ = 1, n do
  local tokens = tonumber(ARGV[i]); i = i + 1
  if ready == '' then
    local at = blocked(tokens)
    if at then ready = string.format('%.6f', at) else grant(tokens) end
  end
end
local spares = 0
if ready == '' and limit > 0 and not D.dact then
  while spares < spare and not blocked(0) do grant(0); spares = spares + 1 end
end

redis.call('HSET', st, 'tok', total)
local ttl = math.ceil((window + hold + 120) * 1000)
local gen, rate = d_finish()
for _, key in ipairs({req, tok, amt, st, ga, sv}) do redis.call('PEXPIRE', key, ttl) end
local cooling = ''
if until_ > now then cooling = string.format('%.6f', until_ - now) end
local reply = {string.format('%.6f', now), ready, cooling, tostring(spares), gen, rate}
for k = 1, #ids do reply[#reply + 1] = ids[k] end
return reply
"""
ACQUIRE_SCRIPT: Final = _TEMPLATE.replace("-- @now@\n", SCRIPT_NOW).replace("-- @discovery@\n", DISCOVERY_LUA)


class AcquireReply(NamedTuple):
    """What one round trip answered: times on the Redis server's clock, seconds."""

    now: float
    ready_at: float | None
    """When the first waiter not admitted could be (``None``: every waiter was admitted)."""
    cooldown_remaining: float
    units: list[str]
    """Unit ids granted, in waiter order; the last ``spares`` of them are spare units."""
    token_marks: list[int]
    """Each granted unit's token mark: the scope's token charge total just after it."""
    spares: int
    generation: int
    """The scope's discovery generation after this round trip (0: nothing discovered yet)."""
    discovered_rate: float | None
    """The shared discovered rate in force, requests per second (``None``: none)."""


def reply_text(value: object) -> str:
    """One field of a script's reply as text (a client may give ``bytes`` or ``str``)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def parse_reply(raw: object) -> AcquireReply:
    if not isinstance(raw, list) or len(raw) < 6:
        raise ValueError(f"unexpected reply from the quota script: {raw!r}")
    fields = [reply_text(value) for value in raw]
    now, ready, cooling, spares, generation, rate = fields[:6]
    return AcquireReply(
        now=float(now),
        ready_at=float(ready) if ready else None,
        cooldown_remaining=float(cooling) if cooling else 0.0,
        units=fields[6::2],
        token_marks=[int(mark) for mark in fields[7::2]],
        spares=int(spares),
        generation=int(generation),
        discovered_rate=float(rate) if rate else None,
    )
