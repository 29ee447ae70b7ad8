"""Issue 7's fault storm: 1,000 items through a misbehaving server under an RPM limit, on both backends.

The server answers 30 % of requests with 429 + Retry-After, 10 % with 500, hangs
on 5 % and drops the connection on 2 %. Every item must end with exactly one
typed result, and the server's own count must show the engine never exceeded
``max_requests_per_minute`` in any 60 s window.

Time. The RPM window is a minute and the limit must bind for several of them,
so the run spans minutes of loop time. Real sockets rule out a clock that jumps
whenever a task waits (``autojump_threshold=0``), but not one that jumps when
the whole loop has sat idle for a couple of milliseconds: on loopback a socket
is readable the moment its peer wrote, so an idle loop is one waiting only on
timers (cooldowns, the RPM window, hangs, latency). Trio has that clock
(``MockClock(autojump_threshold=...)``); :class:`AutojumpEventLoop` is its
asyncio counterpart. Loop time stands still while code runs, so the engine and
the in-process server (which read the same clock) see no transit time, and the
assertions below are exact: a request arrives at the instant it was admitted.
"""

from __future__ import annotations

import asyncio
import selectors
from collections import defaultdict
from functools import partial
from typing import Any

import anyio
import pytest
import trio.testing

from trio_batch_llm import (
    BatchLLMError,
    ErrorCategory,
    ProcessorConfig,
    RateLimitConfig,
    RetryConfig,
    process_prompts,
)
from trio_batch_llm._strategies.openai._compatible import OpenAICompatibleStrategy
from trio_batch_llm._strategies.openai._sdk import OpenAIStrategy
from trio_batch_llm.mock import MockServer, MockServerConfig, RecordedRequest, serve_mock
from trio_batch_llm.mock._state import mock_token_count

pytestmark = pytest.mark.anyio

AUTOJUMP_THRESHOLD = 0.01
"""Real seconds the event loop must sit idle before its clock jumps to the next timer.

Loopback data is normally readable the moment it was written, but a loaded
machine may defer the kernel's delivery by a few milliseconds; a jump in that
gap would move time under a request in transit. Each jump costs this much real
time, and the storm makes about 160 of them."""


class _AutojumpSelector(selectors.BaseSelector):
    """The default selector; a wait that times out with nothing ready moves the loop's clock instead."""

    def __init__(self, loop: AutojumpEventLoop, threshold: float) -> None:
        self._inner = selectors.DefaultSelector()
        self._loop = loop
        self._threshold = threshold

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None or timeout <= 0:  # no timers (wait for I/O), or a poll
            return self._inner.select(timeout)
        events = self._inner.select(min(timeout, self._threshold))
        if not events:  # idle: jump to the next timer, as Trio's autojumping MockClock does
            self._loop.virtual_time += timeout
        return events

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.get_key(fileobj)

    def get_map(self) -> Any:
        return self._inner.get_map()

    def close(self) -> None:
        self._inner.close()


class AutojumpEventLoop(asyncio.SelectorEventLoop):
    """asyncio with Trio's ``MockClock(autojump_threshold=...)``: virtual time that moves only by jumps."""

    def __init__(self, threshold: float = AUTOJUMP_THRESHOLD) -> None:
        self.virtual_time = 0.0
        super().__init__(_AutojumpSelector(self, threshold))

    def time(self) -> float:
        return self.virtual_time


def autojump_backends(threshold: float = AUTOJUMP_THRESHOLD) -> list[Any]:
    """Both backends on an autojumping virtual clock (fresh clocks: one per call)."""
    return [
        pytest.param(("asyncio", {"loop_factory": partial(AutojumpEventLoop, threshold)}), id="asyncio"),
        pytest.param(("trio", {"clock": trio.testing.MockClock(autojump_threshold=threshold)}), id="trio"),
    ]


@pytest.fixture(scope="module", params=autojump_backends())
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


async def test_the_clock_jumps_only_when_idle() -> None:
    began = anyio.current_time()
    await anyio.sleep(3600.0)
    woke = anyio.current_time()
    assert woke == pytest.approx(began + 3600.0)  # an hour of sleep costs milliseconds
    sum(range(200_000))  # busy work takes no loop time
    assert anyio.current_time() == woke
    async with serve_mock() as server:  # and loopback I/O takes none either
        strategy = OpenAICompatibleStrategy("m", base_url=server.base_url, api_key=None)
        await strategy.prepare()
        try:
            assert (await strategy.execute("[[latency:2.5]] ping", 1, None))[0].startswith("echo:")
        finally:
            await strategy.cleanup()
        (request,) = server.requests
    assert request.answered == pytest.approx(request.arrival + 2.5)


ITEMS = 1000
RPM = 300  # about 1,900 requests: the limit binds in six consecutive windows
WINDOW = 60.0
RETRY_AFTER = 0.5
ATTEMPT_TIMEOUT = 30.0
# Every idle moment costs AUTOJUMP_THRESHOLD of real time, so the storm keeps timers few: answers
# without latency, retries without backoff, no slow-start ramp after a cooldown.
STORM = MockServerConfig(
    rate_limit_rate=0.30, retry_after=RETRY_AFTER, server_error_rate=0.10, hang_rate=0.05,
    reset_rate=0.02, seed=2024,
)
STORM_CONFIG = ProcessorConfig(
    concurrency=32,
    attempt_timeout=ATTEMPT_TIMEOUT,
    max_requests_per_minute=RPM,
    retry=RetryConfig(max_attempts=10, initial_wait=0.0, max_wait=0.0, max_rate_limit_retries=100),
    rate_limit=RateLimitConfig(slow_start_seconds=0.0),
)
STORM_CATEGORIES = frozenset(
    {ErrorCategory.RATE_LIMIT, ErrorCategory.SERVER, ErrorCategory.TIMEOUT, ErrorCategory.TRANSIENT}
)


def build(kind: str, server: MockServer) -> OpenAICompatibleStrategy | OpenAIStrategy:
    if kind == "compatible":
        return OpenAICompatibleStrategy("storm-model", base_url=server.base_url, api_key="sk-storm-KEY-0001")
    return OpenAIStrategy("storm-model", base_url=server.base_url, api_key="sk-storm-KEY-0001", api="chat")


def by_prompt(requests: list[RecordedRequest]) -> dict[str | None, list[RecordedRequest]]:
    grouped: dict[str | None, list[RecordedRequest]] = defaultdict(list)
    for request in requests:
        grouped[request.prompt].append(request)
    return grouped


@pytest.mark.slow
# 36-48 s per case on an idle 2-core machine, near the suite's 60 s: a loaded machine must not
# turn it into a timeout (which ends the worker process).
@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["compatible", "sdk"])
async def test_fault_storm(kind: str) -> None:
    prompts = [(f"storm-{i}", f"storm prompt {i}") for i in range(ITEMS)]
    async with serve_mock(STORM) as server:
        began = anyio.current_time()
        batch = await process_prompts(build(kind, server), prompts, config=STORM_CONFIG)
        elapsed = anyio.current_time() - began
        stats = await server.wait_for(lambda s: s.in_flight == 0)
        requests = server.requests

    # The storm happened.
    assert stats.rate_limited > 0.25 * ITEMS
    assert min(stats.server_errors, stats.hangs, stats.resets) > 0

    # Every item ended with exactly one typed result ...
    assert batch.total_items == ITEMS
    assert sorted(r.item_id for r in batch.results) == sorted(item_id for item_id, _ in prompts)
    # ... which agrees, attempt for attempt, with what the server saw of that prompt (no attempt
    # lost, none repeated behind the engine's back: the SDK's own retries are off).
    attempts = by_prompt(requests)
    assert sum(r.attempts for r in batch.results) == stats.requests == len(requests)
    for result in batch.results:
        prompt = "storm prompt " + result.item_id.removeprefix("storm-")
        seen = [r.outcome for r in attempts[prompt]]
        assert len(seen) == result.attempts, (result.item_id, seen)
        assert all(outcome != "ok" for outcome in seen[:-1]), (result.item_id, seen)
        if result.success:
            assert seen[-1] == "ok"
            assert result.output == "echo: " + prompt
            assert result.token_usage["total_tokens"] == mock_token_count(prompt) + mock_token_count(
                "echo: " + prompt
            )
        else:  # out of retries for a failure the storm causes: typed, with the exception kept
            assert result.error_category in STORM_CATEGORIES, (result.item_id, seen)
            assert result.exception is not None
            assert kind == "sdk" or isinstance(result.exception, BatchLLMError)
    assert batch.total_tokens()["total_tokens"] == stats.prompt_tokens + stats.completion_tokens

    # A hang ends at the engine's attempt timeout: the client lets go, the item tries again.
    for hung in (r for r in requests if r.outcome == "hang"):
        assert hung.client_disconnected
        later = [r for r in attempts[hung.prompt] if r.arrival > hung.arrival]
        assert not later or later[0].arrival >= hung.arrival + ATTEMPT_TIMEOUT

    # Retry-After is honoured: a refused item tries again no sooner than it said. (Since issue 32 the
    # 30 % of 429s here, refusals at random, no longer pause the whole scope: once the rule has seen
    # that they come at random, each is retried by its own call, and the others go on.)
    for limited in (r for r in requests if r.outcome == "error:429"):
        assert limited.answered is not None
        later = [r for r in attempts[limited.prompt] if r.arrival > limited.arrival]
        assert not later or later[0].arrival >= limited.answered + RETRY_AFTER, limited

    # The RPM limit bound (no correct engine finishes this many requests sooner) and the server's
    # own count shows it was never exceeded in any 60 s window.
    assert elapsed >= WINDOW * ((stats.requests - 1) // RPM)
    assert stats.max_arrivals_per_window <= RPM
