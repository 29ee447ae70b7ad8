"""The mock as the gateways of issue 32 behave: a calendar-minute limit that tells nothing, LiteLLM's
retry hint, an endpoint that refuses everything, and random 429s that say only "retry in 1 s".

In-process tests drive the ASGI app on injected clocks (exact minute boundaries); served tests go over
real HTTP on 127.0.0.1, on both backends, with the wall clock the calendar limit reads injected, so
they never wait for a real minute to turn.
"""

from __future__ import annotations

from typing import Any

import httpx2
import pytest

from trio_batch_llm import ConfigurationError
from trio_batch_llm.mock import MockOpenAIApp, MockServerConfig, serve_mock

from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio

MINUTE = 60.0
EPOCH = 1_800_000_000.0  # a whole minute (a multiple of 60) on the wall clock


class ManualClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def chat(prompt: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": prompt}]}


def hints(response: httpx2.Response) -> dict[str, str]:
    """Every header a client could take as a limit or a wait."""
    return {k: v for k, v in response.headers.items() if "ratelimit" in k or "retry-after" in k}


@pytest.mark.parametrize(("knobs", "field"), [
    ({"calendar_rpm_limit": 0}, "calendar_rpm_limit"),
    ({"calendar_rpm_limit": 2.5}, "calendar_rpm_limit"),
    ({"calendar_rpm_limit": True}, "calendar_rpm_limit"),
    ({"retry_after_headers": ("retry-after", "x-wait")}, "retry_after_headers"),
    ({"retry_after_headers": ["retry-after"]}, "retry_after_headers"),
])
def test_gateway_knobs_are_validated(knobs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        MockServerConfig(**knobs)
    assert info.value.field == field


class TestCalendarMinute:
    async def test_the_count_resets_at_each_wall_clock_minute_and_a_refusal_tells_nothing(self) -> None:
        wall = ManualClock(EPOCH + 50.0)  # 10 s before a minute turns
        app = MockOpenAIApp(MockServerConfig(calendar_rpm_limit=3, ratelimit_headers=True),
                            clock=ManualClock(), wall_clock=wall)
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://mock/v1") as client:
            async def post_at(t: float, prompt: str) -> httpx2.Response:
                wall.now = EPOCH + t
                return await client.post("/chat/completions", json=chat(prompt))

            served = [(await post_at(50.0 + i, f"a{i}")).status_code for i in range(3)]
            refused = await post_at(59.9, "a3")
            # 0.2 s later the minute has turned: a sliding 60 s window would still be full.
            after = [(await post_at(60.1 + i, f"b{i}")).status_code for i in range(4)]
            third = await post_at(120.0, "c0")
        assert served == [200, 200, 200]
        assert refused.status_code == 429
        assert hints(refused) == {}  # no Retry-After, no rate-limit headers: nothing says when
        assert after == [200, 200, 200, 429]
        assert third.status_code == 200
        stats = app.statistics()
        assert stats.rate_limited == stats.rate_limited_enforced == 2
        assert stats.max_served_per_calendar_minute == 3
        assert [r.outcome for r in app.requests].count("rate_limited_enforced") == 2

    async def test_refusals_use_no_quota_and_it_binds_beside_a_sliding_limit(self) -> None:
        wall = ManualClock(EPOCH)
        clock = ManualClock()
        app = MockOpenAIApp(MockServerConfig(calendar_rpm_limit=2, rpm_limit=3), clock=clock, wall_clock=wall)
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://mock/v1") as client:
            async def post_at(t: float, prompt: str) -> httpx2.Response:
                wall.now, clock.now = EPOCH + t, t
                return await client.post("/chat/completions", json=chat(prompt))

            first = [await post_at(t, f"p{t}") for t in (50.0, 51.0, 52.0)]
            # Next minute: the calendar has room again; the sliding window (3 per 60 s) holds the two
            # served at 50 and 51 (the refusal at 52 used no quota), so it has one slot.
            second = [await post_at(t, f"q{t}") for t in (60.5, 61.0)]
        assert [r.status_code for r in first] == [200, 200, 429]  # the calendar limit (2) binds first
        assert hints(first[2]) == {}
        assert [r.status_code for r in second] == [200, 429]
        assert hints(second[1]) == {"retry-after": "49", "retry-after-ms": "49000"}  # sliding: as before

    async def test_served_over_loopback(self) -> None:
        wall = ManualClock(EPOCH + 59.0)
        async with serve_mock(MockServerConfig(calendar_rpm_limit=2), wall_clock=wall) as server, \
                httpx2.AsyncClient(base_url=server.base_url) as client:
            before = [await client.post("/chat/completions", json=chat(f"p{i}")) for i in range(3)]
            wall.now = EPOCH + MINUTE
            after = [await client.post("/chat/completions", json=chat(f"q{i}")) for i in range(3)]
        assert [r.status_code for r in before] == [200, 200, 429]
        assert [r.status_code for r in after] == [200, 200, 429]
        assert hints(before[2]) == {} and hints(after[2]) == {}
        assert server.stats.rate_limited_enforced == 2


class TestVirtualTime:
    @pytest.fixture(scope="class", params=[pytest.param(trio_virtual_clock(), id="trio-virtual")])
    @classmethod
    def anyio_backend(cls, request: pytest.FixtureRequest) -> Any:
        return request.param

    async def test_the_calendar_limit_on_trio_virtual_time(self) -> None:
        import anyio

        # Both of the app's clocks read Trio's virtual time: waiting out a minute costs no real time.
        start = anyio.current_time()
        app = MockOpenAIApp(MockServerConfig(calendar_rpm_limit=1), clock=anyio.current_time,
                            wall_clock=lambda: EPOCH + 30.0 + anyio.current_time() - start)
        transport = httpx2.ASGITransport(app=app)
        codes = []
        async with httpx2.AsyncClient(transport=transport, base_url="http://mock/v1") as client:
            for prompt, pause in (("a", 0.0), ("b", 29.0), ("c", 1.5), ("d", 0.0)):
                await anyio.sleep(pause)
                codes.append((await client.post("/chat/completions", json=chat(prompt))).status_code)
        assert codes == [200, 429, 200, 429]  # b at :59, still the first minute; c at :00:30.5


class TestRetryHints:
    async def test_litellm_hint_instead_of_retry_after(self) -> None:
        config = MockServerConfig(rate_limit_rate=1.0, retry_after=2.5,
                                  retry_after_headers=("llm_provider-retry-after",))
        async with serve_mock(config) as server, httpx2.AsyncClient(base_url=server.base_url) as client:
            refused = await client.post("/chat/completions", json=chat("x"))
        assert refused.status_code == 429
        assert hints(refused) == {"llm_provider-retry-after": "3"}  # whole seconds, as LiteLLM forwards

    async def test_litellm_hint_beside_retry_after_and_on_enforced_limits(self) -> None:
        config = MockServerConfig(rpm_limit=1,
                                  retry_after_headers=("retry-after", "llm_provider-retry-after"))
        app = MockOpenAIApp(config, clock=ManualClock(10.0))
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://mock/v1") as client:
            await client.post("/chat/completions", json=chat("a"))
            refused = await client.post("/chat/completions", json=chat("b"))
        assert hints(refused) == {"retry-after": "60", "retry-after-ms": "60000",
                                  "llm_provider-retry-after": "60"}

    async def test_no_hint_headers_at_all(self) -> None:
        app = MockOpenAIApp(MockServerConfig(rate_limit_rate=1.0, retry_after_headers=()))
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://mock/v1") as client:
            refused = await client.post("/chat/completions", json=chat("a"))
        assert refused.status_code == 429 and hints(refused) == {}


class TestRefusals:
    @pytest.mark.parametrize(("retry_after", "expected"), [
        (None, {}), (1.0, {"retry-after": "1", "retry-after-ms": "1000"}),
    ])
    async def test_always_429(self, retry_after: float | None, expected: dict[str, str]) -> None:
        config = MockServerConfig(rate_limit_rate=1.0, retry_after=retry_after)
        async with serve_mock(config) as server, httpx2.AsyncClient(base_url=server.base_url) as client:
            replies = [await client.post("/chat/completions", json=chat(f"p{i % 7}")) for i in range(40)]
        assert {r.status_code for r in replies} == {429}
        assert all(hints(r) == expected for r in replies)
        assert server.stats.rate_limited == 40 and server.stats.succeeded == 0

    async def test_random_429s_say_retry_in_one_second_and_nothing_more(self) -> None:
        config = MockServerConfig(rate_limit_rate=0.3, retry_after=1.0, seed=7)
        async with serve_mock(config) as server, httpx2.AsyncClient(base_url=server.base_url) as client:
            replies = [await client.post("/chat/completions", json=chat(f"p{i}")) for i in range(200)]
        refused = [r for r in replies if r.status_code == 429]
        assert {r.status_code for r in replies} == {200, 429}
        assert 40 <= len(refused) <= 80  # 30 % of 200, seeded
        assert all(hints(r) == {"retry-after": "1", "retry-after-ms": "1000"} for r in refused)
        assert all(hints(r) == {} for r in replies if r.status_code == 200)
        # Seeded: the same prompts get the same faults on another server (and on the other backend).
        async with serve_mock(config) as again, httpx2.AsyncClient(base_url=again.base_url) as client:
            codes = [(await client.post("/chat/completions", json=chat(f"p{i}"))).status_code
                     for i in range(200)]
        assert codes == [r.status_code for r in replies]
