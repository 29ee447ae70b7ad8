"""The response cache in the item path and on every surface (issue 34, point 1, the engine's side).

Run twice, the second run makes no call: every result ``cached=True`` with the first run's
output, whichever surface ran it (processor, pool, ``process_prompts``/``process_stream``,
``call_result``/``call``, ``open_run`` on SQLite and PostgreSQL run stores). A hit takes no
admission and costs no tokens; modes, samples, structured outputs, budgets, observers,
failures and refusals, a strategy that is not cacheable, a cache that fails.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import BaseModel

from trio_batch_llm import (
    ArtifactIdentity,
    CallableStrategy,
    ConfigurationError,
    FakeStrategy,
    GuardrailConfig,
    LLMCallPool,
    LLMCallStrategy,
    LLMWorkItem,
    MemoryResponseCache,
    ParallelBatchProcessor,
    ProcessorConfig,
    ProviderError,
    ResponseCache,
    ResponseDetails,
    SqliteResponseCache,
    WorkItemResult,
    call,
    call_result,
    open_run,
    process_prompts,
    process_stream,
)
from trio_batch_llm._cache._flight import CacheGate, Claim
from trio_batch_llm._cache._memory import MemoryCacheConnection
from trio_batch_llm._observe._events import ItemCompleted
from trio_batch_llm._values._categories import ErrorCategory
from trio_batch_llm._values._details import DETAILS_METADATA_KEY

pytestmark = pytest.mark.anyio

PROMPTS = [f"p{i}" for i in range(6)]


def config(cache: Any, **kwargs: Any) -> ProcessorConfig:
    kwargs.setdefault("concurrency", 4)
    return ProcessorConfig(cache=cache, **kwargs)


def outputs(results: list[WorkItemResult[Any]]) -> dict[Any, Any]:
    return {r.context if r.context is not None else r.item_id: r.output for r in results}


# --- every surface: run twice, the second run makes no call --------------------------------------


async def via_processor(strategy: Any, cfg: ProcessorConfig) -> list[WorkItemResult[Any]]:
    async with ParallelBatchProcessor[Any](cfg) as proc:
        for i, prompt in enumerate(PROMPTS):
            await proc.add_work(LLMWorkItem(f"i{i}", strategy, prompt, context=prompt))
        return list(await proc.process_all())


async def via_prompts(strategy: Any, cfg: ProcessorConfig) -> list[WorkItemResult[Any]]:
    return list(await process_prompts(strategy, PROMPTS, config=cfg, preserve_order=True))


async def via_stream(strategy: Any, cfg: ProcessorConfig) -> list[WorkItemResult[Any]]:
    async with process_stream(strategy, iter(PROMPTS), config=cfg) as results:
        return [r async for r in results]


async def via_pool(strategy: Any, cfg: ProcessorConfig) -> list[WorkItemResult[Any]]:
    async with LLMCallPool(strategy, config=cfg) as pool:
        return [await pool.submit_result(p, context=p) for p in PROMPTS]


async def via_call_result(strategy: Any, cfg: ProcessorConfig) -> list[WorkItemResult[Any]]:
    return [await call_result(strategy, p, config=cfg) for p in PROMPTS]


async def via_call(strategy: Any, cfg: ProcessorConfig) -> list[WorkItemResult[Any]]:
    # call() gives the output only; the calls counted say whether it came from the cache.
    return [WorkItemResult(item_id=p, success=True, output=await call(strategy, p, config=cfg), cached=True)
            for p in PROMPTS]


SURFACES: dict[str, Callable[[Any, ProcessorConfig], Awaitable[list[WorkItemResult[Any]]]]] = {
    "processor": via_processor, "process_prompts": via_prompts, "process_stream": via_stream,
    "pool": via_pool, "call_result": via_call_result, "call": via_call,
}


@pytest.fixture(params=["memory", "sqlite"])
def cache_value(request: pytest.FixtureRequest, tmp_path: Path) -> ResponseCache:
    if request.param == "sqlite":
        return SqliteResponseCache(tmp_path / "cache.sqlite3")
    return MemoryResponseCache()


@pytest.mark.parametrize("surface", list(SURFACES))
async def test_every_surface_second_run_makes_no_call(surface: str, cache_value: ResponseCache) -> None:
    run = SURFACES[surface]
    strategy = FakeStrategy()
    cfg = config(cache_value)
    first = await run(strategy, cfg)
    assert len(strategy.calls) == len(PROMPTS)
    prepared = strategy.prepare_count
    if surface != "call":
        assert not any(r.cached for r in first)
        assert all(r.cache_key is not None and len(r.cache_key) == 64 for r in first)
    second = await run(strategy, cfg)
    assert len(strategy.calls) == len(PROMPTS), "the second run called the provider"
    assert strategy.prepare_count == prepared, "a run answered whole by the cache prepares nothing"
    assert all(r.success and r.cached for r in second)
    assert sorted(str(r.output) for r in second) == sorted(str(r.output) for r in first)
    if surface != "call":
        keys = {str(r.output): r.cache_key for r in first}
        for r in second:
            assert (r.attempts, r.token_usage, r.cache_key) == (0, {}, keys[str(r.output)])
            assert r.saved_usage == {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
            assert r.metadata.get("model") == "fake-model"


@pytest.fixture(params=["sqlite", "postgres"])
def run_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        url: str = request.getfixturevalue("postgres_url")
        return url
    return str(tmp_path / "runs.sqlite")


async def test_open_run_records_cached_results(run_store: str, cache_value: ResponseCache) -> None:
    strategy = FakeStrategy()
    cache = cache_value
    got: dict[str, list[WorkItemResult[Any]]] = {}
    for run_id in ("first", "second"):
        async with await open_run(run_store, run_id, strategy, list(PROMPTS), cache=cache,
                                  config=ProcessorConfig(concurrency=4), poll_interval=0.05) as run:
            snap = await run.wait()
            assert snap.status == "completed" and snap.succeeded == len(PROMPTS)
            got[run_id] = [r.result for r in await run.read_results()]
    assert len(strategy.calls) == len(PROMPTS)
    assert not any(r.cached for r in got["first"])
    assert all(r.cached and r.token_usage == {} for r in got["second"]), "recorded as cached results"
    assert sorted(r.output for r in got["second"]) == sorted(r.output for r in got["first"])


async def test_open_run_refuses_a_cache_given_twice(tmp_path: Path) -> None:
    cache = MemoryResponseCache()
    with pytest.raises(ConfigurationError, match="cache='<memory>': is given twice"):
        await open_run(tmp_path / "r.sqlite", "r", FakeStrategy(), [], cache=cache,
                       config=ProcessorConfig(cache=cache))


async def test_single_flight_at_the_surface(cache_value: ResponseCache) -> None:
    strategy = FakeStrategy(latency=0.05)
    batch = await process_prompts(strategy, ["same"] * 100, config=config(cache_value, concurrency=50))
    assert batch.succeeded == 100
    assert len(strategy.calls) == 1
    assert sum(r.cached for r in batch) == 99


async def test_a_failed_leader_hands_its_key_over_and_its_failure_is_not_shared(
        cache_value: ResponseCache) -> None:
    calls = 0

    async def answer(prompt: str) -> str:
        nonlocal calls
        calls += 1
        await anyio.sleep(0.05)
        if calls == 1:
            raise ProviderError("bad request", category=ErrorCategory.INVALID_REQUEST)
        return f"answer to {prompt}"

    strategy = CallableStrategy(answer, identity=ArtifactIdentity(provider="test", model="m"))
    batch = await process_prompts(strategy, ["same"] * 10, config=config(cache_value, concurrency=10))
    assert calls == 2  # the leader failed; one waiter took the key over and called
    assert batch.failed == 1 and batch.succeeded == 9
    assert sum(r.cached for r in batch) == 8
    assert all(r.output == "answer to same" for r in batch if r.success)


# --- what a hit costs --------------------------------------------------------------------------


async def test_a_hit_takes_no_admission() -> None:
    # One request a minute: the first run waits for its admissions; the second, all hits, does not.
    cache = MemoryResponseCache()
    strategy = FakeStrategy()
    await process_prompts(strategy, PROMPTS, config=config(cache))
    slow = config(cache, max_requests_per_minute=1)
    started = anyio.current_time()
    batch = await process_prompts(strategy, PROMPTS, config=slow)
    assert anyio.current_time() - started < 5.0
    assert all(r.cached and r.timing.admission_wait < 1.0 for r in batch)
    assert len(strategy.calls) == len(PROMPTS)


async def test_a_cached_result_adds_nothing_to_the_token_budget() -> None:
    cache = MemoryResponseCache()
    strategy = FakeStrategy()
    await process_prompts(strategy, PROMPTS, config=config(cache))
    tight = config(cache, guardrails=GuardrailConfig(max_total_tokens=20))  # one call's worth (15)
    batch = await process_prompts(strategy, PROMPTS, config=tight)
    assert batch.termination.kind == "completed"
    assert batch.succeeded == len(PROMPTS) and all(r.cached for r in batch)
    assert batch.total_tokens() == {}


async def test_observers_and_counters_see_the_hits() -> None:
    cache = MemoryResponseCache()
    strategy = FakeStrategy()
    await process_prompts(strategy, PROMPTS, config=config(cache))
    seen: list[bool] = []
    proc = ParallelBatchProcessor[Any](config(cache), observers=[
        lambda event: seen.append(event.result.cached) if isinstance(event, ItemCompleted) else None])
    async with proc:
        for i, prompt in enumerate(PROMPTS):
            await proc.add_work(LLMWorkItem(f"i{i}", strategy, prompt))
        await proc.process_all()
        assert proc.statistics().counters.cached == len(PROMPTS)
    assert seen == [True] * len(PROMPTS)


# --- modes, samples, structured outputs ----------------------------------------------------------


async def test_read_only_writes_nothing() -> None:
    cache = MemoryResponseCache()
    strategy = FakeStrategy()
    for _ in range(2):
        batch = await process_prompts(strategy, PROMPTS, config=config(cache, cache_mode="read-only"))
        assert not any(r.cached for r in batch)
    assert len(strategy.calls) == 2 * len(PROMPTS)
    assert [k for k in cache.entries if not k.startswith("\x00")] == []


async def test_write_only_never_reads_and_refresh_overwrites() -> None:
    cache = MemoryResponseCache()
    answer = {"text": "old"}
    strategy = FakeStrategy(output=lambda p: f"{answer['text']}: {p}")
    await process_prompts(strategy, PROMPTS, config=config(cache))
    batch = await process_prompts(strategy, PROMPTS, config=config(cache, cache_mode="write-only"))
    assert len(strategy.calls) == 2 * len(PROMPTS) and not any(r.cached for r in batch)
    answer["text"] = "new"
    await process_prompts(strategy, PROMPTS, config=config(cache, cache_mode="refresh"))
    assert len(strategy.calls) == 3 * len(PROMPTS)
    batch = await process_prompts(strategy, PROMPTS, config=config(cache))
    assert len(strategy.calls) == 3 * len(PROMPTS)
    assert sorted(r.output for r in batch) == sorted(f"new: {p}" for p in PROMPTS), "refresh overwrote"


async def test_k_samples_make_k_calls_then_none() -> None:
    cache = MemoryResponseCache()
    strategy = FakeStrategy()
    for _ in range(2):
        async with ParallelBatchProcessor[Any](config(cache)) as proc:
            for k in range(3):
                await proc.add_work(LLMWorkItem(f"s{k}", strategy, "one prompt", sample=k))
            batch = await proc.process_all()
        assert len({r.cache_key for r in batch}) == 3
    assert len(strategy.calls) == 3
    assert all(r.cached for r in batch)


class Answer(BaseModel):
    label: str
    score: float


class StructuredStrategy(LLMCallStrategy[Answer]):
    def __init__(self) -> None:
        self.response_model = Answer
        self.calls = 0

    @property
    def model_name(self) -> str | None:
        return "structured-model"

    async def execute(self, prompt: str, attempt: int, timeout: float | None,
                      state: Any = None) -> tuple[Answer, dict[str, int], dict[str, Any]]:
        self.calls += 1
        await anyio.lowlevel.checkpoint()
        return Answer(label=prompt.upper(), score=0.5), {"input_tokens": 3, "output_tokens": 2}, {}


async def test_a_pydantic_output_round_trips_through_the_cache() -> None:
    cache = MemoryResponseCache()
    strategy = StructuredStrategy()
    first = await process_prompts(strategy, PROMPTS, config=config(cache), preserve_order=True)
    second = await process_prompts(strategy, PROMPTS, config=config(cache), preserve_order=True)
    assert strategy.calls == len(PROMPTS)
    assert all(type(r.output) is Answer and r.cached for r in second)
    assert [r.output for r in second] == [r.output for r in first]


# --- what is never cached ------------------------------------------------------------------------


async def test_a_failure_is_never_cached() -> None:
    cache = MemoryResponseCache()
    boom = ProviderError("bad request", category=ErrorCategory.INVALID_REQUEST)
    strategy = FakeStrategy(script={"p0": [boom, boom]})
    first = await process_prompts(strategy, ["p0"], config=config(cache))
    assert not first.results[0].success and first.results[0].cache_key is not None
    second = await process_prompts(strategy, ["p0"], config=config(cache))
    assert not second.results[0].success and not second.results[0].cached
    assert len(strategy.calls) == 2


class Refusing(LLMCallStrategy[str]):
    def __init__(self) -> None:
        self.calls = 0

    @property
    def model_name(self) -> str | None:
        return "refusing-model"

    async def execute(self, prompt: str, attempt: int, timeout: float | None,
                      state: Any = None) -> tuple[str, dict[str, int], dict[str, Any]]:
        self.calls += 1
        await anyio.lowlevel.checkpoint()
        details = ResponseDetails(refusal="I can't")
        return "", {"input_tokens": 1, "output_tokens": 1}, {DETAILS_METADATA_KEY: details}


@pytest.mark.parametrize("cache_refusals", [False, True])
async def test_a_refusal_is_cached_only_when_asked(cache_refusals: bool) -> None:
    cache = MemoryResponseCache()
    strategy = Refusing()
    for _ in range(2):
        batch = await process_prompts(strategy, ["p"], config=config(cache, cache_refusals=cache_refusals))
    assert strategy.calls == (1 if cache_refusals else 2)
    result = batch.results[0]
    assert result.cached is cache_refusals
    assert result.details is not None and result.details.refusal == "I can't"


async def test_a_strategy_that_is_not_cacheable_runs_uncached_with_one_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    calls = Counter[str]()

    async def answer(prompt: str) -> str:
        calls[prompt] += 1
        await anyio.lowlevel.checkpoint()
        return prompt

    strategy = CallableStrategy(answer)  # declares no model: nothing tells its answers apart
    cache = MemoryResponseCache()
    with caplog.at_level(logging.WARNING, logger="trio_batch_llm"):
        for _ in range(2):
            batch = await process_prompts(strategy, PROMPTS, config=config(cache))
            assert all(r.success and not r.cached and r.cache_key is None for r in batch)
    assert sum(calls.values()) == 2 * len(PROMPTS)
    warnings = [r.getMessage() for r in caplog.records if "not cacheable" in r.getMessage()]
    assert len(warnings) == 2, warnings  # once per run (owner), not once per item
    assert "CallableStrategy" in warnings[0]


# --- claims: settled exactly once, whatever ends the item -----------------------------------------


@pytest.fixture
def claims(monkeypatch: pytest.MonkeyPatch) -> list[Claim]:
    made: list[Claim] = []
    original = CacheGate.lookup

    async def recording(self: CacheGate, key: Any) -> Any:
        found = await original(self, key)
        if isinstance(found, Claim):
            made.append(found)
        return found

    monkeypatch.setattr(CacheGate, "lookup", recording)
    return made


async def test_a_cancelled_processor_lets_every_claim_go(claims: list[Claim]) -> None:
    strategy = FakeStrategy(latency=10.0)
    with anyio.move_on_after(0.2):
        await process_prompts(strategy, PROMPTS, config=config(MemoryResponseCache()))
    assert len(claims) == 4  # the four workers' items, each in its call
    assert all(c.settled for c in claims)


async def test_a_cancelled_pool_caller_and_a_deadline_let_their_claims_go(claims: list[Claim]) -> None:
    cache = MemoryResponseCache()
    strategy = FakeStrategy(latency=10.0)
    async with LLMCallPool(strategy, config=config(cache)) as pool:
        with anyio.move_on_after(0.2):
            await pool.submit_result("cancelled")
        result = await pool.submit_result("timed out", timeout=0.2)
    assert result.error_category is ErrorCategory.DEADLINE and result.cache_key is not None
    assert len(claims) == 2 and all(c.settled for c in claims)
    assert [k for k in cache.entries if not k.startswith("\x00")] == []  # nothing written


# --- a cache that fails --------------------------------------------------------------------------


async def test_a_cache_that_fails_mid_run_fails_no_item(monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    async def broken(self: Any, key: Any) -> None:
        await anyio.lowlevel.checkpoint()
        raise OSError("disk gone")

    monkeypatch.setattr(MemoryCacheConnection, "get", broken)
    strategy = FakeStrategy()
    with caplog.at_level(logging.WARNING, logger="trio_batch_llm"):
        batch = await process_prompts(strategy, PROMPTS, config=config(MemoryResponseCache()))
    assert batch.succeeded == len(PROMPTS) and not any(r.cached for r in batch)
    failed = [r.getMessage() for r in caplog.records if "failed to read" in r.getMessage()]
    assert len(failed) == 1 and "OSError" in failed[0] and "disk gone" not in failed[0]


async def test_a_cache_that_cannot_open_is_an_error_before_any_call(monkeypatch: pytest.MonkeyPatch) -> None:
    async def refuse(config: Any) -> Any:
        await anyio.lowlevel.checkpoint()
        raise OSError("unreachable")

    monkeypatch.setattr("trio_batch_llm._cache._open.connect_cache", refuse)
    strategy = FakeStrategy()
    with pytest.raises(ConfigurationError, match="cache='<memory>': could not be opened"):
        await process_prompts(strategy, PROMPTS, config=config(MemoryResponseCache()))
    with pytest.raises(ConfigurationError, match="could not be opened"):
        await call_result(strategy, "p", config=config(MemoryResponseCache()))
    assert strategy.calls == []


async def test_each_owner_closes_the_connection_it_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[Any] = []
    closed: list[Any] = []
    original = MemoryCacheConnection.__init__

    def counting_init(self: Any, config: Any) -> None:
        original(self, config)
        opened.append(self)

    async def counting_close(self: Any) -> None:
        await anyio.lowlevel.checkpoint()
        closed.append(self)

    monkeypatch.setattr(MemoryCacheConnection, "__init__", counting_init)
    monkeypatch.setattr(MemoryCacheConnection, "aclose", counting_close)
    cfg = config(MemoryResponseCache())
    strategy = FakeStrategy()
    for run in SURFACES.values():
        await run(strategy, cfg)
    assert len(opened) == 4 + 2 * len(PROMPTS)  # one per processor or pool; call() and call_result() one each
    assert Counter(map(id, closed)) == Counter(map(id, opened))
