"""The mock server's own limits as it tells them: rate-limit headers, a true Retry-After, limit changes.

In-process tests drive the ASGI app with a manual clock (exact windows);
served tests go over real HTTP on 127.0.0.1, on both backends, and read the
headers back with the parser the quota scope uses.
"""

from __future__ import annotations

from typing import Any

import httpx2
import pytest

from trio_batch_llm import ConfigurationError
from trio_batch_llm._admission import parse_rate_limit_headers
from trio_batch_llm._cli._main import build_parser
from trio_batch_llm.mock import MockOpenAIApp, MockServerConfig, serve_mock
from trio_batch_llm.mock._limits import go_duration
from trio_batch_llm.mock._state import mock_token_count

pytestmark = pytest.mark.anyio

PROMPT = "abcd"
TOKENS = mock_token_count(PROMPT) + mock_token_count("echo: " + PROMPT)  # what one answer costs: 1 + 3


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def chat(prompt: str = PROMPT) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": prompt}]}


def limits(response: httpx2.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if "ratelimit" in k or k.startswith("retry-after")}


@pytest.mark.parametrize(("seconds", "text"), [
    (0.0, "0s"), (0.0004, "0s"), (0.02, "20ms"), (0.9995, "1000ms"), (1.0, "1s"), (1.5, "1.5s"),
    (59.95, "59.95s"), (60.0, "1m0s"), (90.25, "1m30.25s"), (360.0, "6m0s"), (3723.5, "1h2m3.5s"),
    (-3.0, "0s"),
])
def test_go_durations_read_back(seconds: float, text: str) -> None:
    from trio_batch_llm._admission._headers import parse_duration

    assert go_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(max(0.0, round(seconds, 3)), abs=1e-3)


@pytest.mark.parametrize(("knobs", "field"), [
    ({"ratelimit_headers": "yes"}, "ratelimit_headers"),
    ({"limit_schedule": [(1.0, 2, None)]}, "limit_schedule"),
    ({"limit_schedule": ((1.0, 2),)}, "limit_schedule"),
    ({"limit_schedule": ((-1.0, 2, None),)}, "limit_schedule"),
    ({"limit_schedule": ((5.0, 2, None), (5.0, 3, None))}, "limit_schedule"),
    ({"limit_schedule": ((5.0, 0, None),)}, "limit_schedule"),
    ({"limit_schedule": ((5.0, None, 2.5),)}, "limit_schedule"),
])
def test_new_knobs_are_validated(knobs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        MockServerConfig(**knobs)
    assert info.value.field == field


class TestInProcess:
    async def test_headers_follow_the_enforced_windows(self) -> None:
        clock = ManualClock()
        app = MockOpenAIApp(MockServerConfig(rpm_limit=3, tpm_limit=10 * TOKENS, ratelimit_headers=True),
                            clock=clock)
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://mock/v1") as client:
            async def post_at(t: float) -> httpx2.Response:
                clock.now = t
                return await client.post("/chat/completions", json=chat())

            first = await post_at(0.0)
            assert limits(first) == {
                "x-ratelimit-limit-requests": "3", "x-ratelimit-remaining-requests": "2",
                "x-ratelimit-reset-requests": "1m0s",
                "x-ratelimit-limit-tokens": str(10 * TOKENS),
                "x-ratelimit-remaining-tokens": str(9 * TOKENS), "x-ratelimit-reset-tokens": "1m0s",
            }
            await post_at(10.0)
            third = await post_at(20.5)
            assert limits(third)["x-ratelimit-remaining-requests"] == "0"
            refused = await post_at(30.0)  # the window is full until the call at t=0 leaves, at 60
            assert refused.status_code == 429
            assert limits(refused) == {
                "x-ratelimit-limit-requests": "3", "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-requests": "50.5s",  # empty at 20.5 + 60, if nothing more comes
                "x-ratelimit-limit-tokens": str(10 * TOKENS),
                "x-ratelimit-remaining-tokens": str(7 * TOKENS), "x-ratelimit-reset-tokens": "50.5s",
                "retry-after": "30", "retry-after-ms": "30000",
            }
            assert (await post_at(60.0)).status_code == 200  # when the Retry-After said
            late = await post_at(500.0)
            assert limits(late)["x-ratelimit-remaining-requests"] == "2"

    async def test_without_the_knob_only_a_429_says_when(self) -> None:
        clock = ManualClock()
        app = MockOpenAIApp(MockServerConfig(rpm_limit=1), clock=clock)
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://mock/v1") as client:
            ok = await client.post("/chat/completions", json=chat())
            refused = await client.post("/chat/completions", json=chat())
        assert limits(ok) == {}
        assert limits(refused) == {"retry-after": "60", "retry-after-ms": "60000"}

    async def test_injected_429s_say_capacity_remains(self) -> None:
        app = MockOpenAIApp(MockServerConfig(rpm_limit=100, tpm_limit=10_000, ratelimit_headers=True),
                            clock=ManualClock())
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://mock/v1") as client:
            blip = await client.post("/chat/completions", json=chat("[[fail:429]]"))
        assert blip.status_code == 429
        observation = parse_rate_limit_headers(blip.headers, 0.0)
        assert observation is not None and observation.capacity_remains
        assert observation.retry_after == 1.0  # the configured Retry-After of injected 429s

    async def test_a_schedule_changes_the_limits_from_the_first_request_on(self) -> None:
        clock = ManualClock()
        clock.now = 1000.0  # the schedule counts from the first completion request, not from zero
        config = MockServerConfig(rpm_limit=4, ratelimit_headers=True,
                                  limit_schedule=((30.0, 2, None), (90.0, None, 2 * TOKENS)))
        app = MockOpenAIApp(config, clock=clock)
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://mock/v1") as client:
            async def post_at(t: float) -> httpx2.Response:
                clock.now = 1000.0 + t
                return await client.post("/chat/completions", json=chat())

            assert [(await post_at(t)).status_code for t in (0.0, 1.0, 2.0)] == [200, 200, 200]
            halved = await post_at(30.0)  # 3 in the window, the limit now 2
            assert halved.status_code == 429
            assert limits(halved)["x-ratelimit-limit-requests"] == "2"
            assert limits(halved)["x-ratelimit-remaining-requests"] == "0"
            assert limits(halved)["retry-after-ms"] == "31000"  # two must leave: the one at 1 s, at 61
            assert (await post_at(61.0)).status_code == 200
            tokens_only = await post_at(90.0)
            assert tokens_only.status_code == 200
            assert "x-ratelimit-limit-requests" not in limits(tokens_only)  # no request limit any more
            # The window still holds the answer at 61 s, and now this one: 2 answers' worth, the limit.
            assert limits(tokens_only)["x-ratelimit-remaining-tokens"] == "0"


async def test_served_headers_and_retry_after_read_back() -> None:
    config = MockServerConfig(rpm_limit=2, tpm_limit=1000, ratelimit_headers=True)
    async with serve_mock(config) as server, httpx2.AsyncClient(base_url=server.base_url) as client:
        replies = [await client.post("/chat/completions", json=chat(f"p{i}")) for i in range(3)]
    assert [r.status_code for r in replies] == [200, 200, 429]
    first = parse_rate_limit_headers(replies[0].headers, 0.0)
    assert first is not None and first.dialect == "openai"
    assert (first.requests_limit, first.requests_remaining, first.tokens_limit) == (2, 1, 1000)
    assert first.requests_reset_at is not None and 59.0 < first.requests_reset_at <= 60.0
    refused = parse_rate_limit_headers(replies[2].headers, 0.0)
    assert refused is not None and refused.requests_remaining == 0 and not refused.capacity_remains
    assert refused.retry_after is not None and 59.0 < refused.retry_after <= 60.0
    assert server.stats.rate_limited_enforced == 1


def test_serve_mock_command_line_knobs() -> None:
    args = build_parser().parse_args(["serve-mock", "--rpm-limit", "1200", "--ratelimit-headers",
                                      "--limit-change", "90:600:", "--limit-change", "30::5000"])
    assert args.ratelimit_headers is True
    assert sorted(args.limit_change) == [(30.0, None, 5000), (90.0, 600, None)]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve-mock", "--limit-change", "90:0:"])


def test_serve_mock_gateway_knobs() -> None:
    """``--calendar-rpm-limit`` and ``--retry-hint`` reach MockServerConfig (issue 32's gateways)."""
    from trio_batch_llm._cli._main import _retry_hints

    args = build_parser().parse_args(["serve-mock", "--calendar-rpm-limit", "600",
                                      "--retry-hint", "llm_provider-retry-after"])
    assert args.calendar_rpm_limit == 600
    assert _retry_hints(args.retry_hint) == ("llm_provider-retry-after",)
    assert _retry_hints(None) == ("retry-after",)
    assert _retry_hints(["none"]) == ()
    assert _retry_hints(["retry-after", "llm_provider-retry-after", "retry-after"]) == (
        "retry-after", "llm_provider-retry-after")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve-mock", "--retry-hint", "x-retry"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve-mock", "--calendar-rpm-limit", "0"])
