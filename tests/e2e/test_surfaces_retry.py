"""Every surface applies the same retry rules (issue 31).

One scripted strategy runs through ``call_result``, ``LLMCallPool.submit``,
``process_prompts``, ``process_stream`` and ``ParallelBatchProcessor``; each must
give the same outcome, the same number of attempts and the same category for each
failed attempt, and all of them what the retry rules say (a model below).

A hanging attempt is cut by ``attempt_timeout``: on Trio's virtual clock, and on
asyncio with a tiny timeout. Every other scripted attempt answers without awaiting
anything, so no deadline can fall inside it and no outcome depends on how fast the
machine is: only a hang ever reaches the attempt deadline.
"""

from __future__ import annotations

import itertools
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_batch_llm import (
    ErrorCategory,
    LLMCallError,
    LLMCallPool,
    LLMCallStrategy,
    LLMWorkItem,
    ParallelBatchProcessor,
    ProcessorConfig,
    ProviderError,
    RetryConfig,
    RetryState,
    TokenUsage,
    WorkItemResult,
    call_result,
    process_prompts,
    process_stream,
)

from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio

CATEGORY = {
    "hang": ErrorCategory.TIMEOUT,
    "server": ErrorCategory.SERVER,
    "fatal": ErrorCategory.AUTHENTICATION,
    "rate": ErrorCategory.RATE_LIMIT,
    "bad": ErrorCategory.INVALID_REQUEST,
}
KINDS = ["ok", *CATEGORY]


class Scripted(LLMCallStrategy[str]):
    """Attempt n does ``kinds[n-1]`` ("ok" past the end); records what each attempt was told."""

    def __init__(self, kinds: list[str]) -> None:
        self.kinds = kinds
        self.seen: list[tuple[int, ErrorCategory | None]] = []
        """(attempt, the previous attempt's category from its RetryState) per call."""

    async def execute(  # noqa: ASYNC910 - answers without a checkpoint on purpose (module docstring)
        self, prompt: str, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[str, TokenUsage | None, Any]:
        self.seen.append((attempt, state.last_category if state is not None else None))
        kind = self.kinds[attempt - 1] if attempt <= len(self.kinds) else "ok"
        if kind == "hang":
            await anyio.sleep_forever()
        if kind == "ok":
            return f"answer {attempt}", {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}, None
        raise ProviderError(f"scripted {kind}", category=CATEGORY[kind],
                            retry_after=0.0 if kind == "rate" else None)


def expected(kinds: list[str], max_attempts: int, max_rate_limit_retries: int) -> tuple[Any, ...]:
    """What the retry rules say: (success, attempts, final category, each failed attempt's category)."""
    failures = rate_limited = 0
    categories: list[ErrorCategory] = []
    for attempt in itertools.count(1):
        kind = kinds[attempt - 1] if attempt <= len(kinds) else "ok"
        if kind == "ok":
            return True, attempt, None, categories
        category = CATEGORY[kind]
        categories.append(category)
        if category is ErrorCategory.RATE_LIMIT:
            rate_limited += 1
            retry = rate_limited <= max_rate_limit_retries
        else:
            failures += 1
            retry = category.retryable and failures < max_attempts
        if not retry:
            return False, attempt, category, categories
    raise AssertionError("unreachable")


def observed(result: WorkItemResult[Any], strategy: Scripted) -> tuple[Any, ...]:
    attempts = [attempt for attempt, _ in strategy.seen]
    assert attempts == list(range(1, result.attempts + 1)), (attempts, result)
    categories = [category for _, category in strategy.seen[1:]]
    if not result.success:
        categories.append(result.error_category)  # type: ignore[arg-type]
    return result.success, result.attempts, result.error_category, categories


async def via_call_result(strategy: Scripted, cfg: ProcessorConfig) -> WorkItemResult[Any]:
    return await call_result(strategy, "p", config=cfg)


async def via_pool_submit(strategy: Scripted, cfg: ProcessorConfig) -> WorkItemResult[Any]:
    async with LLMCallPool(strategy, config=cfg) as pool:
        try:
            output = await pool.submit("p")
        except LLMCallError as exc:
            failed: WorkItemResult[Any] | None = exc.result
        else:
            return WorkItemResult("request-1", True, output)  # submit gives the output only
    assert failed is not None
    return failed


async def via_process_prompts(strategy: Scripted, cfg: ProcessorConfig) -> WorkItemResult[Any]:
    (result,) = (await process_prompts(strategy, ["p"], config=cfg)).results
    return result


async def via_process_stream(strategy: Scripted, cfg: ProcessorConfig) -> WorkItemResult[Any]:
    async with process_stream(strategy, ["p"], config=cfg) as results:
        (result,) = [r async for r in results]
    return result


async def via_processor(strategy: Scripted, cfg: ProcessorConfig) -> WorkItemResult[Any]:
    async with ParallelBatchProcessor[str](cfg) as proc:
        await proc.add_work(LLMWorkItem(item_id="p", strategy=strategy, prompt="p"))
        (result,) = (await proc.process_all()).results
    return result


SURFACES = [via_call_result, via_pool_submit, via_process_prompts, via_process_stream, via_processor]


async def check_every_surface(kinds: list[str], max_attempts: int, max_rl: int, timeout: float) -> None:
    cfg = ProcessorConfig(
        attempt_timeout=timeout,
        retry=RetryConfig(max_attempts=max_attempts, max_rate_limit_retries=max_rl, initial_wait=0.0,
                          max_wait=0.0),
    )
    strategies = [Scripted(kinds) for _ in SURFACES]
    outcomes: dict[str, tuple[Any, ...]] = {}

    async def run(surface: Any, strategy: Scripted) -> None:
        result = await surface(strategy, cfg)
        if surface is via_pool_submit and result.success:
            result.attempts = len(strategy.seen)  # submit returns only the output
        outcomes[surface.__name__] = observed(result, strategy)

    # Side by side: on asyncio the hangs of all five surfaces cost one attempt_timeout, not five.
    async with anyio.create_task_group() as tg:
        for surface, strategy in zip(SURFACES, strategies, strict=True):
            tg.start_soon(run, surface, strategy)
    want = expected(kinds, max_attempts, max_rl)
    assert outcomes == dict.fromkeys(outcomes, want), (kinds, want)


SCRIPTS = st.lists(st.sampled_from(KINDS), min_size=1, max_size=5)


@pytest.mark.parametrize("anyio_backend", [pytest.param(trio_virtual_clock(), id="trio-virtual")])
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=SCRIPTS, max_attempts=st.integers(1, 4), max_rl=st.integers(0, 2))
async def test_every_surface_retries_alike_on_virtual_time(
    kinds: list[str], max_attempts: int, max_rl: int
) -> None:
    await check_every_surface(kinds, max_attempts, max_rl, timeout=0.2)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=SCRIPTS, max_attempts=st.integers(1, 4), max_rl=st.integers(0, 2))
async def test_every_surface_retries_alike_on_asyncio(
    kinds: list[str], max_attempts: int, max_rl: int
) -> None:
    await check_every_surface(kinds, max_attempts, max_rl, timeout=0.02)


@pytest.mark.parametrize(
    "anyio_backend", [pytest.param(trio_virtual_clock(), id="trio-virtual"), pytest.param("asyncio")]
)
async def test_call_result_retries_an_attempt_that_timed_out(anyio_backend: Any) -> None:
    """The issue's example: the first attempt hangs past attempt_timeout; the second answers."""
    cfg = ProcessorConfig(
        attempt_timeout=0.2, retry=RetryConfig(max_attempts=2, initial_wait=0.0, max_wait=0.0)
    )
    strategy = Scripted(["hang", "ok"])
    result = await call_result(strategy, "p", config=cfg)
    assert (result.success, result.attempts, result.output) == (True, 2, "answer 2")
    assert strategy.seen == [(1, None), (2, ErrorCategory.TIMEOUT)]


@pytest.mark.parametrize("anyio_backend", [pytest.param(trio_virtual_clock(), id="trio-virtual")])
async def test_a_timed_out_attempt_waits_its_backoff_on_the_pool_path() -> None:
    """With a backoff after the timeout (the default initial_wait), the retry comes after it."""
    cfg = ProcessorConfig(attempt_timeout=0.2,
                          retry=RetryConfig(max_attempts=2, initial_wait=1.0, max_wait=1.0, jitter=False))
    strategy = Scripted(["hang", "ok"])
    started = anyio.current_time()
    async with LLMCallPool(strategy, config=cfg) as pool:
        assert await pool.submit("p") == "answer 2"
    assert anyio.current_time() - started == pytest.approx(1.2)


class CancelsItsGuardInOnError(Scripted):
    """Its first ``on_error()`` cancels the guard scope the item runs in, as an attempt deadline that
    came in the instant the call failed reaches it (on asyncio at the next await, here: on_error)."""

    def __init__(self, kinds: list[str], guards: list[Any]) -> None:
        super().__init__(kinds)
        self.guards = guards

    async def on_error(self, exception: Exception, attempt: int, state: RetryState | None) -> None:
        if attempt == 1:
            self.guards[-1].scope.cancel()
        await anyio.lowlevel.checkpoint()


@pytest.mark.parametrize(
    "anyio_backend", [pytest.param(trio_virtual_clock(), id="trio-virtual"), pytest.param("asyncio")]
)
@pytest.mark.parametrize("surface", SURFACES, ids=lambda s: s.__name__)
async def test_a_deadline_that_lands_after_its_call_failed_spends_no_retry(
    anyio_backend: Any, surface: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No second failure is invented for an attempt that failed already, and its backoff is waited out."""
    from trio_batch_llm._engine import _guards

    guards: list[Any] = []
    arm = _guards.Guard.arm

    def recording_arm(self: Any, run: object, deadline: float) -> None:
        guards.append(self)
        arm(self, run, deadline)

    monkeypatch.setattr(_guards.Guard, "arm", recording_arm)
    backoff = 1.0 if anyio_backend != "asyncio" else 0.05
    cfg = ProcessorConfig(attempt_timeout=600.0, retry=RetryConfig(
        max_attempts=2, initial_wait=backoff, max_wait=backoff, jitter=False))
    strategy = CancelsItsGuardInOnError(["server", "ok"], guards)
    started = anyio.current_time()
    result = await surface(strategy, cfg)
    assert result.success, result
    assert strategy.seen == [(1, None), (2, ErrorCategory.SERVER)]
    if anyio_backend != "asyncio":
        assert anyio.current_time() - started == pytest.approx(backoff)


@pytest.mark.parametrize("anyio_backend", [pytest.param(trio_virtual_clock(), id="trio-virtual")])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kinds=SCRIPTS,
    max_attempts=st.integers(1, 4),
    item_timeout=st.sampled_from([None, 0.3, 0.5, 1.1, 2.5]),
    initial_wait=st.sampled_from([0.0, 0.1, 0.4]),
)
async def test_item_deadlines_and_backoffs_end_alike_on_every_surface(
    kinds: list[str], max_attempts: int, item_timeout: float | None, initial_wait: float
) -> None:
    """With an item deadline and seeded backoffs too, every surface ends the same way at the same time."""
    from trio_batch_llm import GuardrailConfig

    cfg = ProcessorConfig(
        attempt_timeout=0.2,
        retry=RetryConfig(max_attempts=max_attempts, max_rate_limit_retries=1, initial_wait=initial_wait,
                          max_wait=1.0, jitter=False),
        guardrails=GuardrailConfig(total_timeout_per_item=item_timeout),
    )
    seen: dict[str, tuple[Any, ...]] = {}

    async def run(surface: Any) -> None:
        strategy = Scripted(kinds)
        started = anyio.current_time()
        result = await surface(strategy, cfg)
        elapsed = round(anyio.current_time() - started, 6)
        seen[surface.__name__] = (result.success, len(strategy.seen), result.error_category, elapsed,
                                  [category for _, category in strategy.seen[1:]])

    async with anyio.create_task_group() as tg:
        for surface in SURFACES:
            tg.start_soon(run, surface)
    first = seen[SURFACES[0].__name__]
    assert seen == dict.fromkeys(seen, first), kinds
