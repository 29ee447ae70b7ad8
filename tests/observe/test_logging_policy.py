"""The logging policy (docs/guides/observability.md, "Logging"): levels, fields, counts, no secrets."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest

from trio_batch_llm import (
    CallableStrategy,
    ErrorCategory,
    GuardrailConfig,
    LLMCallPool,
    OpenAICompatibleStrategy,
    ProcessorConfig,
    ProviderError,
    RateLimitConfig,
    RetryConfig,
    process_prompts,
)
from trio_batch_llm._admission import QuotaScope, parse_rate_limit_headers
from trio_batch_llm.mock import MockServerConfig, serve_mock

pytestmark = pytest.mark.anyio

NO_WAIT = RetryConfig(max_attempts=3, initial_wait=0.0, max_wait=0.0, jitter=False)
KEY = "sk-test-SECRET-0123456789abcdef"


class Records:
    """The records of the running test (``caplog.records`` is a new list in each test phase)."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self._caplog = caplog

    def __iter__(self) -> Any:
        return iter(self._caplog.records)


@pytest.fixture
def records(caplog: pytest.LogCaptureFixture) -> Records:
    caplog.set_level(logging.DEBUG, logger="trio_batch_llm")
    return Records(caplog)


def of(records: Records, name: str, level: int) -> list[logging.LogRecord]:
    return [r for r in records if r.name == name and r.levelno == level]


async def test_one_warning_per_category_per_batch(records: Records) -> None:
    async def fails(prompt: str) -> str:
        await anyio.lowlevel.checkpoint()
        n = int(prompt)
        if n % 3 == 0:
            raise ProviderError(f"bad request {n}", category=ErrorCategory.INVALID_REQUEST)
        if n % 3 == 1:
            raise ProviderError(f"no credit {n}", category=ErrorCategory.INSUFFICIENT_BALANCE)
        return prompt

    batch = await process_prompts(CallableStrategy(fails), [str(n) for n in range(60)], concurrency=8,
                                  config=None)
    assert (batch.failed, batch.succeeded) == (40, 20)
    warnings = of(records, "trio_batch_llm.engine", logging.WARNING)
    assert sorted(r.category for r in warnings) == ["insufficient_balance", "invalid_request"]  # type: ignore[attr-defined]
    assert all(r.attempt == 1 and r.item_id.startswith("item-") for r in warnings)  # type: ignore[attr-defined]
    debug = of(records, "trio_batch_llm.engine", logging.DEBUG)
    debug_failures = [r for r in debug if "failed after" in r.message]
    assert len(debug_failures) == 38
    summary = [r for r in of(records, "trio_batch_llm.engine", logging.INFO) if "finished" in r.message]
    assert [r.failures for r in summary] == [{"insufficient_balance": 20, "invalid_request": 20}]  # type: ignore[attr-defined]
    # A second batch warns again: the policy is per batch.
    await process_prompts(CallableStrategy(fails), ["0", "3"], concurrency=2)
    assert len(of(records, "trio_batch_llm.engine", logging.WARNING)) == 3


async def test_retries_are_debug_with_item_attempt_category_and_wait(records: Records) -> None:
    attempts: dict[str, int] = {}

    async def flaky(prompt: str) -> str:
        await anyio.lowlevel.checkpoint()
        attempts[prompt] = attempts.get(prompt, 0) + 1
        if attempts[prompt] < 3:
            raise ProviderError("upstream hiccup", category=ErrorCategory.TRANSIENT)
        return prompt

    config = ProcessorConfig(concurrency=2, retry=RetryConfig(max_attempts=3, initial_wait=0.01,
                                                              max_wait=0.01, jitter=False))
    batch = await process_prompts(CallableStrategy(flaky), [("a", "x"), ("b", "y")], config=config)
    assert batch.succeeded == 2
    retries = [r for r in of(records, "trio_batch_llm.engine", logging.DEBUG) if "retrying" in r.message]
    fields = sorted((r.item_id, r.attempt, r.category, r.wait) for r in retries)  # type: ignore[attr-defined]
    assert fields == [("a", 1, "transient", 0.01), ("a", 2, "transient", 0.01),
                      ("b", 1, "transient", 0.01), ("b", 2, "transient", 0.01)]
    assert not [r for r in records if r.levelno >= logging.WARNING]  # retried and succeeded: no warning


async def test_a_cooldown_is_info_once_per_storm(records: Records) -> None:
    limited = 0
    all_in = anyio.Event()

    async def storm(prompt: str) -> str:
        # All four calls are in flight before any 429 returns: one storm, one cooldown.
        nonlocal limited
        if limited < 4:
            limited += 1
            if limited == 4:
                all_in.set()
            await all_in.wait()
            raise ProviderError("slow down", category=ErrorCategory.RATE_LIMIT, retry_after=0.05)
        await anyio.lowlevel.checkpoint()
        return prompt

    config = ProcessorConfig(concurrency=4, retry=NO_WAIT, rate_limit=RateLimitConfig(slow_start_seconds=0.0))
    batch = await process_prompts(CallableStrategy(storm), [str(n) for n in range(4)], config=config)
    assert batch.succeeded == 4
    cooldowns = of(records, "trio_batch_llm.admission", logging.INFO)
    assert len(cooldowns) == 1, [r.message for r in cooldowns]
    assert cooldowns[0].wait == pytest.approx(0.05, abs=0.02)  # type: ignore[attr-defined]
    assert "cooldown" in cooldowns[0].message
    retries = [r for r in records if "retrying" in r.msg]
    rate_limited = [r for r in retries if getattr(r, "category", None) == "rate_limit"]
    assert len(rate_limited) == 4 and all(r.levelno == logging.DEBUG for r in rate_limited)


async def test_a_limit_the_provider_reports_is_info_once() -> None:
    scope = QuotaScope(concurrency=4, rate_limit=RateLimitConfig())
    headers = {"x-ratelimit-limit-requests": "20", "x-ratelimit-remaining-requests": "19",
               "x-ratelimit-reset-requests": "3s"}
    logger = logging.getLogger("trio_batch_llm.admission")
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        for _ in range(3):  # the same report thrice: one message
            admission = await scope.admit()
            admission.release(10, parse_rate_limit_headers(headers, admission.now()))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    assert [(r.levelno, r.limit, r.old, r.new) for r in seen] == [  # type: ignore[attr-defined]
        (logging.INFO, "requests", None, 20)
    ]


async def test_learnt_pacing_lowered_is_info() -> None:
    scope = QuotaScope(concurrency=4, rate_limit=RateLimitConfig(), name="'demo'")
    logger = logging.getLogger("trio_batch_llm.admission")
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        for _ in range(6):  # 429s without headers and without Retry-After feed discovery
            admission = await scope.admit()
            admission.release_rate_limited(None, 0)
            await anyio.sleep(0.01)
            ok = await scope.admit()
            ok.release(0)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    lowered = [r for r in seen if r.levelno == logging.INFO and "lowered" in r.getMessage()]
    assert lowered, [r.getMessage() for r in seen]
    assert all(r.scope == "'demo'" and r.source == "discovery" for r in lowered)  # type: ignore[attr-defined]
    assert all(r.new_rpm is not None for r in lowered)  # type: ignore[attr-defined]


async def test_a_deadline_stop_is_info_once(records: Records) -> None:
    async def slow(prompt: str) -> str:
        await anyio.sleep(30)
        return prompt

    config = ProcessorConfig(concurrency=2, guardrails=GuardrailConfig(batch_timeout=0.05))
    batch = await process_prompts(CallableStrategy(slow), [str(n) for n in range(6)], config=config)
    assert batch.termination.kind == "batch_deadline"
    stops = [r for r in records if getattr(r, "stop", None) is not None]
    assert [(r.levelno, r.stop) for r in stops] == [(logging.INFO, "batch_deadline")]  # type: ignore[attr-defined]
    warnings = [r for r in records if r.levelno == logging.WARNING]
    assert [r.category for r in warnings] == ["deadline"]  # type: ignore[attr-defined]  # 2 cut short, 4 not run


async def test_a_pool_warns_once_per_category(records: Records) -> None:
    async def refuses(prompt: str) -> str:
        await anyio.lowlevel.checkpoint()
        raise ProviderError("nope", category=ErrorCategory.CONTENT_POLICY)

    pool = LLMCallPool(CallableStrategy(refuses), config=ProcessorConfig(concurrency=3))
    async with pool, anyio.create_task_group() as tg:
        for n in range(9):
            tg.start_soon(pool.submit_result, str(n))
    warnings = of(records, "trio_batch_llm.engine", logging.WARNING)
    assert [r.category for r in warnings] == ["content_policy"]  # type: ignore[attr-defined]


def _everything(records: Records) -> str:
    parts: list[str] = []
    for r in records:
        parts.append(r.getMessage())
        parts.append(repr(r.__dict__))
    return "\n".join(parts)


async def test_keys_are_never_logged(records: Records) -> None:
    # A strategy holding a key whose errors quote it: every family of message, and none carries it.
    calls: dict[str, int] = {}

    async def leaky(prompt: str, key: str = KEY) -> str:
        await anyio.lowlevel.checkpoint()
        calls[prompt] = calls.get(prompt, 0) + 1
        if prompt == "limited" and calls[prompt] == 1:
            raise ProviderError(f"429 for key {key}", category=ErrorCategory.RATE_LIMIT, retry_after=0.01)
        if prompt == "flaky" and calls[prompt] == 1:
            raise ProviderError(f"500 while using {key}", category=ErrorCategory.SERVER)
        if prompt == "denied":
            raise ProviderError(f"Incorrect API key provided: {key}", category=ErrorCategory.AUTHENTICATION)
        return prompt

    config = ProcessorConfig(concurrency=3, retry=NO_WAIT, rate_limit=RateLimitConfig(slow_start_seconds=0.0))
    prompts = ["limited", "flaky", "denied", "ok"]
    batch = await process_prompts(CallableStrategy(leaky), prompts, config=config)
    assert batch.failed == 1
    # And a real provider strategy configured with a key, refused by the server it talks to.
    async with serve_mock(MockServerConfig(api_key="sk-the-right-one-000000")) as server:
        strategy = OpenAICompatibleStrategy("m", base_url=server.base_url, api_key=KEY)
        batch = await process_prompts(strategy, ["a", "b"], config=ProcessorConfig(retry=NO_WAIT))
    assert batch.failed == 2
    text = _everything(records)
    assert len({r.levelno for r in records}) >= 3  # DEBUG, INFO and WARNING were all captured
    assert "429 for key" not in text and "Incorrect API key" not in text
    assert KEY not in text


async def test_logging_off_costs_nothing_visible(caplog: pytest.LogCaptureFixture) -> None:
    # Default levels (WARNING): a batch that retries and succeeds logs nothing at all.
    caplog.set_level(logging.WARNING, logger="trio_batch_llm")
    seen = 0

    async def once(prompt: str) -> Any:
        nonlocal seen
        await anyio.lowlevel.checkpoint()
        seen += 1
        if seen == 1:
            raise ProviderError("blip", category=ErrorCategory.TRANSIENT)
        return prompt

    batch = await process_prompts(CallableStrategy(once), ["a"], config=ProcessorConfig(retry=NO_WAIT))
    assert batch.succeeded == 1
    assert [r for r in caplog.records if r.name.startswith("trio_batch_llm")] == []
