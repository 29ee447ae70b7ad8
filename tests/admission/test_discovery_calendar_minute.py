"""A limit counted per calendar minute, with no reset header (issue 32, point 2).

Some gateways count calls per wall-clock minute and answer 429 with no hint when
to come back. After a storm with no hint, discovery's probes go at doubling gaps
(1 s, 2 s, ... at most a minute) but never later than just after the next ``:00``,
when such a gateway has room again. The wall clock reaches the pure core as an
injected offset (``Discovery.wall_offset``); these tests run on exact times.
"""

from __future__ import annotations

from trio_batch_llm import RateLimitConfig
from trio_batch_llm._admission._core import QuotaCore
from trio_batch_llm._admission._discovery import MINUTE_SLACK, next_minute

NO_RAMP = RateLimitConfig(slow_start_seconds=0.0)


def probe_times(wall_offset: float | None, probes: int) -> list[float]:
    """A scope whose every call is refused with no hint: when each storm probe goes."""
    core = QuotaCore(concurrency=10, rate_limit=NO_RAMP)
    assert core.pacing is not None
    if wall_offset is not None:
        core.pacing.discovery.wall_offset = lambda: wall_offset
    core.release_rate_limited(core.try_admit_nowait(0, 0.0), None, None, 0.0)  # the first 429
    times, now = [], 0.0
    for _ in range(probes):
        now = max(now, core.ready_at(0, now))
        times.append(now)
        core.release_rate_limited(core.try_admit_nowait(0, now), None, None, now)
    return times


def test_without_the_wall_clock_probes_double() -> None:
    assert probe_times(None, 8) == [0.0, 1.0, 3.0, 7.0, 15.0, 31.0, 63.0, 123.0]


def test_probes_after_a_storm_with_no_hint_meet_the_calendar_minute() -> None:
    # The scope's 0 is wall-clock :10 (1,030 s after the epoch): the next :00 is at 50 s.
    times = probe_times(1030.0, 9)
    assert times[:6] == [0.0, 1.0, 3.0, 7.0, 15.0, 31.0]  # short gaps: as before
    # 31 + 32 would be 63 (13 s past :00); the probe goes at :00.5 instead, and then each minute.
    assert times[6:] == [50.0 + MINUTE_SLACK, 110.0 + MINUTE_SLACK, 170.0 + MINUTE_SLACK]


def test_a_storm_ends_at_the_first_probe_after_the_minute_turns() -> None:
    # A gateway refusing until :00 (its minute is full) and then answering: a probe just after :00
    # gets through, and the scope flows again: no sliding 60 s from the first call, no doubling gap.
    core = QuotaCore(concurrency=10, rate_limit=NO_RAMP)
    assert core.pacing is not None
    core.pacing.discovery.wall_offset = lambda: 1000.0  # 0 is :40; the minute turns at 20 s
    now = 0.0
    while True:
        now = max(now, core.ready_at(0, now))
        grant = core.try_admit_nowait(0, now)
        if now >= 20.0:  # the new minute has room
            core.release(grant, None, now + 0.2)
            break
        core.release_rate_limited(grant, None, None, now)
    assert now == 20.0 + MINUTE_SLACK
    assert core.ready_at(0, now + 0.2) <= now + 0.2  # flowing again


def test_next_minute_is_strictly_after_and_on_the_scope_clock() -> None:
    assert next_minute(0.0, 1020.0) == MINUTE_SLACK  # 0 is :00 exactly: just after it
    assert next_minute(MINUTE_SLACK, 1020.0) == 60.0 + MINUTE_SLACK
    assert next_minute(100.0, -5.0) == 120.0 + MINUTE_SLACK + 5.0
