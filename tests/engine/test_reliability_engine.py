"""Regression tests for issue 16, cases 8, 9 and 12 (named ``test_rel<case>_...``).

8. Several processes create, open and claim one run on one SQLite database at
   once: each waits its turn (bounded by ``busy_timeout``), none sees "database
   is locked"; past the bound the error names the database and the bound.
9. A cost budget fails closed: an invalid cost stops the batch as
   ``budget_exhausted`` naming the value and the item, and every result is kept.
12. Every second of an item's time lands in exactly one timing bucket, and a
   deadline names what set it.

Exact times run on Trio's virtual clock; behaviour on both backends.
"""

from __future__ import annotations

import fractions
import json
import math
import multiprocessing
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_batch_llm import (
    CallableStrategy,
    CallOutcome,
    ConfigurationError,
    ErrorCategory,
    FakeStrategy,
    GuardrailConfig,
    LLMCallPool,
    ProcessorConfig,
    ProviderError,
    RateLimitConfig,
    RetryConfig,
    SqliteArtifactStore,
    SqliteRunRepository,
    TokenUsage,
    WorkItemResult,
    call_result,
    process_prompts,
    process_stream,
)
from trio_batch_llm._runs import open_run
from trio_batch_llm._values._errors import ArtifactStoreError

from .._reliability_child import race
from .._runs_child import IDENTITY, CountingStrategy, prompts
from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio

virtual = pytest.mark.parametrize("anyio_backend", [pytest.param(trio_virtual_clock(), id="trio-virtual")])


# --- case 8: opening, attaching and claiming wait their turn, with a bound ----------------------


def _hold_write_lock(db: Path) -> sqlite3.Connection:
    """A connection holding the write lock, as a process in its opening transaction (or turning a
    fresh file into a WAL database) does."""
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    return holder


async def _open_and_drive(store: Any) -> Any:
    async with await open_run(store, "r", CountingStrategy(), prompts(2), identity=IDENTITY,
                              poll_interval=0.02) as run:
        return await run.wait(timeout=30)


async def test_rel8_opening_a_fresh_database_waits_while_another_process_creates_it(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    holder = _hold_write_lock(db)  # the file is still in rollback mode: the lock SQLite gave up on at once

    async def release_soon() -> None:
        await anyio.sleep(0.2)
        await anyio.to_thread.run_sync(holder.execute, "COMMIT")

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(release_soon)
            snap = await _open_and_drive(db)
    finally:
        holder.close()
    assert (snap.status, snap.done) == ("completed", 2)


async def test_rel8_opening_an_existing_database_waits_for_a_writer(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    await _open_and_drive(db)
    holder = _hold_write_lock(db)

    async def release_soon() -> None:
        await anyio.sleep(0.2)
        await anyio.to_thread.run_sync(holder.execute, "COMMIT")

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(release_soon)
            snap = await _open_and_drive(db)
    finally:
        holder.close()
    assert (snap.status, snap.done) == ("completed", 2)


async def test_rel8_an_artifact_store_opening_a_fresh_file_waits_too(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    holder = _hold_write_lock(db)

    async def release_soon() -> None:
        await anyio.sleep(0.2)
        await anyio.to_thread.run_sync(holder.execute, "COMMIT")

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(release_soon)
            store = SqliteArtifactStore(db, identity=IDENTITY)
            batch = await process_prompts(FakeStrategy(), ["a", "b"], artifact_store=store)
    finally:
        holder.close()
    assert batch.succeeded == 2


@pytest.mark.parametrize("fresh", [True, False], ids=["fresh-file", "existing-database"])
async def test_rel8_a_lock_held_past_the_bound_fails_naming_the_database_and_the_bound(
    tmp_path: Path, fresh: bool
) -> None:
    db = tmp_path / "runs.db"
    if not fresh:
        await _open_and_drive(db)
    holder = _hold_write_lock(db)
    try:
        began = time.monotonic()
        with pytest.raises(ArtifactStoreError) as info:
            await _open_and_drive(SqliteRunRepository(db, identity=IDENTITY, busy_timeout=0.3))
        waited = time.monotonic() - began
    finally:
        holder.close()
    message = str(info.value)
    assert str(db) in message and "busy_timeout=0.3 s" in message and "locked" in message, message
    assert 0.3 <= waited < 10.0


def test_rel8_a_write_of_an_open_repository_waits_at_most_the_bound(tmp_path: Path) -> None:
    from trio_batch_llm._runs._schema import RunSpec

    db = tmp_path / "runs.db"
    repo = SqliteRunRepository(db, identity=IDENTITY, busy_timeout=0.3)
    repo.open()
    try:
        holder = _hold_write_lock(db)
        try:
            began = time.monotonic()
            with pytest.raises(ArtifactStoreError, match=r"busy_timeout=0\.3 s") as info:
                repo.attach(RunSpec(run_id="r", mode="live", identity=IDENTITY, config={}))
            assert 0.3 <= time.monotonic() - began < 10.0
            assert "opening run 'r'" in str(info.value)
        finally:
            holder.close()
        # The lock is free again: the same repository carries on.
        assert repo.attach(RunSpec(run_id="r", mode="live", identity=IDENTITY, config={})).status == "running"
    finally:
        repo.close()


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "30", True, 10**400],
                         ids=["negative", "nan", "inf", "str", "bool", "huge-int"])
def test_rel8_busy_timeout_is_validated(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        SqliteRunRepository(tmp_path / "runs.db", busy_timeout=bad)
    assert info.value.field == "busy_timeout"
    assert SqliteRunRepository(tmp_path / "runs.db").busy_timeout == 30.0


def test_rel8_six_processes_race_to_create_open_and_claim_one_run(anyio_backend: Any, tmp_path: Path) -> None:
    processes, rounds = 6, 10
    dbs = [str(tmp_path / f"race{i}.db") for i in range(rounds)]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    outs = [tmp_path / f"out{k}.jsonl" for k in range(processes)]
    children = [ctx.Process(target=race, args=(dbs, barrier, anyio_backend, str(out))) for out in outs]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=120)
    assert [child.exitcode for child in children] == [0] * processes
    outcomes = [[json.loads(line) for line in out.read_text().splitlines()] for out in outs]
    errors = [o["error"] for per_child in outcomes for o in per_child if "error" in o]
    assert errors == []
    for i in range(rounds):
        this_round = [per_child[i] for per_child in outcomes]
        assert {(o["status"], o["done"]) for o in this_round} == {("completed", 3)}
        assert sum(o["calls"] for o in this_round) == 3  # one driver at a time: each item called once


# --- case 9: a cost budget fails closed ---------------------------------------------------------


class _Boom(RuntimeError):
    pass


def _raise(usage: TokenUsage) -> float:
    raise _Boom("price list unavailable")


_INVALID_COSTS: list[Any] = [
    pytest.param(math.nan, "nan", id="nan"),
    pytest.param(math.inf, "inf", id="inf"),
    pytest.param(-math.inf, "-inf", id="minus-inf"),
    pytest.param(-0.5, "-0.5", id="negative"),
    pytest.param("0.1", "'0.1'", id="str"),
    pytest.param(True, "True", id="bool"),
    pytest.param(None, "None", id="none"),
    pytest.param(10**400, "1000", id="int-too-large-for-float"),
    pytest.param(_raise, "_Boom: price list unavailable", id="raises"),
]


def _cost_at(bad_item: int, bad: Any) -> Callable[[TokenUsage], Any]:
    """1 cent per call, except for the call of ``p<bad_item>`` (its usage has 1_000 + n input tokens)."""

    def cost(usage: TokenUsage) -> Any:
        if usage.get("input_tokens") == 1000 + bad_item:
            return bad(usage) if callable(bad) else bad
        return 0.01

    return cost


def _strategy_with_usage() -> CallableStrategy[str]:
    """Item n reports 1_000 + n input tokens, so a cost function can tell the calls apart."""

    async def fn(prompt: str) -> CallOutcome[str]:
        await anyio.lowlevel.checkpoint()
        n = int(prompt[1:])
        return CallOutcome(prompt.upper(), token_usage={"input_tokens": 1000 + n, "output_tokens": 1,
                                                        "total_tokens": 1001 + n})

    return CallableStrategy(fn)


@pytest.mark.parametrize(("bad", "shown"), _INVALID_COSTS)
async def test_rel9_an_invalid_cost_stops_the_batch_as_budget_exhausted(bad: Any, shown: str) -> None:
    cfg = ProcessorConfig(
        concurrency=1, guardrails=GuardrailConfig(max_total_cost=3.0, cost_function=_cost_at(3, bad))
    )
    prompts = [f"p{i}" for i in range(20)]
    batch = await process_prompts(_strategy_with_usage(), prompts, config=cfg)
    # Every item has exactly one result, and nothing already bought is lost.
    assert sorted(r.item_id for r in batch.results) == sorted(f"item-{i}" for i in range(20))
    by_id = batch.by_id()
    assert [by_id[f"item-{i}"].output for i in range(4)] == ["P0", "P1", "P2", "P3"]
    assert batch.termination.kind == "budget_exhausted"
    reason = batch.termination.reason or ""
    assert "cost_function" in reason and "'item-3'" in reason and shown in reason, reason
    # Fail closed: with one worker, nothing after the invalid cost was called.
    assert batch.succeeded == 4
    for i in range(4, 20):
        assert by_id[f"item-{i}"].error_category is ErrorCategory.BUDGET
        assert shown in (by_id[f"item-{i}"].error or "")


async def test_rel9_a_nan_cost_cannot_buy_past_the_cap() -> None:
    """The report's case: one NaN made the running cost NaN, and all 20 items were bought on a $3 cap."""
    prices = iter([1.0, math.nan] + [1.0] * 18)
    guard = GuardrailConfig(max_total_cost=3.0, cost_function=lambda usage: next(prices))
    batch = await process_prompts(FakeStrategy(), [f"p{i}" for i in range(20)],
                                  config=ProcessorConfig(concurrency=1, guardrails=guard))
    assert batch.termination.kind == "budget_exhausted"
    assert "nan" in (batch.termination.reason or "")
    assert batch.succeeded == 2
    assert len(batch.results) == 20


async def test_rel9_an_invalid_cost_stops_a_stream_and_keeps_its_results() -> None:
    cfg = ProcessorConfig(
        concurrency=1, guardrails=GuardrailConfig(cost_function=_cost_at(2, _raise))  # no cap: still stops
    )
    async with process_stream(_strategy_with_usage(), [f"p{i}" for i in range(10)], config=cfg) as results:
        seen = [r async for r in results]
        termination = results.termination
    # (A stream's entries not yet read at a controlled stop are never read: they have no result.)
    ids = [r.item_id for r in seen]
    assert len(set(ids)) == len(ids) and set(ids) <= {f"item-{i}" for i in range(10)}
    assert sorted(r.item_id for r in seen if r.success) == ["item-0", "item-1", "item-2"]
    assert {r.error_category for r in seen if not r.success} <= {ErrorCategory.BUDGET}
    assert termination.kind == "budget_exhausted"
    assert "_Boom" in (termination.reason or "") and "'item-2'" in (termination.reason or "")


async def test_rel9_valid_costs_of_every_numeric_kind_are_charged() -> None:
    from decimal import Decimal

    prices: list[Any] = [0, 1, 0.5, fractions.Fraction(1, 4), Decimal("0.25")]
    it = iter(prices)
    guard = GuardrailConfig(max_total_cost=100.0, cost_function=lambda usage: next(it))
    batch = await process_prompts(FakeStrategy(), [f"p{i}" for i in range(5)],
                                  config=ProcessorConfig(concurrency=1, guardrails=guard))
    assert batch.termination.kind == "completed"
    assert batch.succeeded == 5


async def test_rel9_the_cap_is_reached_as_before() -> None:
    guard = GuardrailConfig(max_total_cost=3.0, cost_function=lambda usage: 1.0)
    batch = await process_prompts(FakeStrategy(), [f"p{i}" for i in range(20)],
                                  config=ProcessorConfig(concurrency=1, guardrails=guard))
    assert (batch.termination.kind, batch.succeeded) == ("budget_exhausted", 3)
    assert batch.termination.reason == "max_total_cost=3.0 reached"


@pytest.mark.parametrize(
    ("kwargs", "field", "value"),
    [
        ({"cost_function": 0.01}, "cost_function", 0.01),
        ({"max_total_cost": 3.0, "cost_function": "per-token"}, "cost_function", "per-token"),
        ({"max_total_cost": math.nan, "cost_function": abs}, "max_total_cost", math.nan),
        ({"max_total_cost": math.inf, "cost_function": abs}, "max_total_cost", math.inf),
        ({"max_total_cost": -1.0, "cost_function": abs}, "max_total_cost", -1.0),
        ({"max_total_cost": "3", "cost_function": abs}, "max_total_cost", "3"),
        ({"max_total_cost": True, "cost_function": abs}, "max_total_cost", True),
        ({"max_total_cost": 10**400, "cost_function": abs}, "max_total_cost", 10**400),
        ({"total_timeout_per_item": 10**400}, "total_timeout_per_item", 10**400),
        ({"batch_timeout": 10**400}, "batch_timeout", 10**400),
        ({"batch_timeout": math.nan}, "batch_timeout", math.nan),
        ({"max_total_tokens": 2.5}, "max_total_tokens", 2.5),
        ({"max_total_tokens": 0}, "max_total_tokens", 0),
    ],
    ids=lambda v: "huge-int" if isinstance(v, int) and v > 10**20 else None,
)
def test_rel9_guardrails_refuse_bad_numbers_at_construction(kwargs: dict[str, Any], field: str,
                                                            value: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        GuardrailConfig(**kwargs)
    assert info.value.field == field
    assert info.value.value == value or (isinstance(value, float) and math.isnan(value))
    assert field in str(info.value)


def test_rel9_a_zero_cost_cap_is_accepted() -> None:
    assert GuardrailConfig(max_total_cost=0, cost_function=abs).max_total_cost == 0


@pytest.mark.parametrize("bad", [10**400, -(10**400)], ids=["huge", "minus-huge"])
def test_rel9_other_configs_refuse_ints_too_large_for_a_float(bad: int) -> None:
    with pytest.raises(ConfigurationError) as info:
        RetryConfig(initial_wait=bad)
    assert info.value.field == "initial_wait"
    with pytest.raises(ConfigurationError) as info:
        RateLimitConfig(cooldown_seconds=bad)
    assert info.value.field == "cooldown_seconds"
    with pytest.raises(ConfigurationError) as info:
        ProcessorConfig(attempt_timeout=bad)
    assert info.value.field == "attempt_timeout"


# --- case 12: every second in exactly one bucket ------------------------------------------------


def _buckets(result: WorkItemResult[Any]) -> float:
    t = result.timing
    return t.admission_wait + t.execution + t.backoff + t.cooldown


def _rate_limited_once(*, first_call: float, retry_after: float) -> CallableStrategy[str]:
    async def fn(prompt: str, *, attempt: int) -> str:
        await anyio.sleep(first_call if attempt == 1 else 0.5)
        if attempt == 1:
            raise ProviderError("429", category=ErrorCategory.RATE_LIMIT, retry_after=retry_after,
                                status_code=429)
        return prompt

    return CallableStrategy(fn)


@virtual
async def test_rel12_an_item_deadline_during_a_cooldown_counts_the_cooldown() -> None:
    cfg = ProcessorConfig(guardrails=GuardrailConfig(total_timeout_per_item=4.0))
    (result,) = (await process_prompts(_rate_limited_once(first_call=1.0, retry_after=10.0), ["p"],
                                       config=cfg)).results
    assert result.error_category is ErrorCategory.DEADLINE
    t = result.timing
    assert (t.execution, t.cooldown, t.admission_wait, t.backoff, t.total) == (1.0, 3.0, 0.0, 0.0, 4.0)
    assert "total_timeout_per_item of 4.0 s" in (result.error or "")


async def test_rel12_an_item_deadline_during_a_cooldown_counts_the_cooldown_in_real_time() -> None:
    cfg = ProcessorConfig(guardrails=GuardrailConfig(total_timeout_per_item=0.15))
    (result,) = (await process_prompts(_rate_limited_once(first_call=0.05, retry_after=30.0), ["p"],
                                       config=cfg)).results
    assert result.error_category is ErrorCategory.DEADLINE
    t = result.timing
    assert t.cooldown >= 0.05
    assert _buckets(result) == pytest.approx(t.total, abs=1e-9)


@virtual
async def test_rel12_call_result_names_the_per_item_deadline_not_a_submit_timeout() -> None:
    cfg = ProcessorConfig(max_workers=1, guardrails=GuardrailConfig(total_timeout_per_item=4.0))
    result = await call_result(_rate_limited_once(first_call=1.0, retry_after=10.0), "p", config=cfg)
    assert result.error_category is ErrorCategory.DEADLINE
    assert "submit timeout" not in (result.error or "")
    assert "total_timeout_per_item of 4.0 s" in (result.error or "")
    assert (result.timing.cooldown, result.timing.total) == (3.0, 4.0)


@virtual
async def test_rel12_a_pool_submit_timeout_keeps_its_name() -> None:
    cfg = ProcessorConfig(guardrails=GuardrailConfig(total_timeout_per_item=100.0))
    async with LLMCallPool(_rate_limited_once(first_call=1.0, retry_after=10.0), config=cfg,
                           submit_timeout=2.5) as pool:
        result = await pool.submit_result("p")
        per_call = await pool.submit_result("q", timeout=1.5)
    assert "submit timeout of 2.5 s" in (result.error or "")
    assert (result.timing.execution, result.timing.cooldown, result.timing.total) == (1.0, 1.5, 2.5)
    assert "submit timeout of 1.5 s" in (per_call.error or "")
    assert _buckets(per_call) == per_call.timing.total == 1.5


@virtual
async def test_rel12_an_admission_wait_cut_by_the_item_deadline_is_counted() -> None:
    async def fn(prompt: str) -> str:
        await anyio.sleep(10.0 if prompt == "slow" else 0.0)
        return prompt

    cfg = ProcessorConfig(concurrency=2, max_provider_concurrency=1,
                          guardrails=GuardrailConfig(total_timeout_per_item=3.0))
    batch = await process_prompts(CallableStrategy(fn), ["slow", "waits"], config=cfg)
    waits = batch.by_id()["item-1"]
    assert waits.error_category is ErrorCategory.DEADLINE
    assert (waits.timing.admission_wait, waits.timing.total) == (3.0, 3.0)


@virtual
async def test_rel12_a_backoff_cut_by_the_batch_deadline_is_counted() -> None:
    async def fn(prompt: str) -> str:
        await anyio.sleep(1.0)
        raise ProviderError("503", category=ErrorCategory.SERVER)

    cfg = ProcessorConfig(retry=RetryConfig(max_attempts=3, initial_wait=10.0, jitter=False),
                          guardrails=GuardrailConfig(batch_timeout=4.0))
    (result,) = (await process_prompts(CallableStrategy(fn), ["p"], config=cfg)).results
    assert result.error_category is ErrorCategory.DEADLINE
    t = result.timing
    assert (t.execution, t.backoff, t.total) == (1.0, 3.0, 4.0)


@virtual
async def test_rel12_time_in_on_error_and_preparation_is_counted() -> None:
    class Slow(FakeStrategy):
        async def prepare(self) -> None:
            await anyio.sleep(2.0)

        async def on_error(self, exc: Exception, attempt: int, state: Any) -> None:
            await anyio.sleep(0.25)

    fake = Slow(latency=1.0, script={"p": [ProviderError("503", category=ErrorCategory.SERVER)]})
    cfg = ProcessorConfig(retry=RetryConfig(max_attempts=2, initial_wait=0.5, jitter=False))
    (result,) = (await process_prompts(fake, ["p"], config=cfg)).results
    assert result.success
    t = result.timing
    # Preparing the strategy is waiting to be admitted; on_error is part of the gap between attempts.
    assert (t.admission_wait, t.execution, t.backoff, t.total) == (2.0, 2.0, 0.75, 4.75)


_OUTCOMES = st.lists(
    st.tuples(
        st.sampled_from(["ok", "server", "rate_limit", "hang"]),
        st.sampled_from([0.0, 0.5, 1.0, 2.5]),  # latency
        st.sampled_from([None, 0.5, 3.0]),  # retry-after
    ),
    min_size=1,
    max_size=4,
)


@virtual
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    scripts=st.lists(_OUTCOMES, min_size=1, max_size=6),
    concurrency=st.integers(min_value=1, max_value=3),
    item_timeout=st.sampled_from([None, 1.0, 2.75, 6.0]),
    batch_timeout=st.sampled_from([None, 4.5, 9.0]),
    attempt_timeout=st.sampled_from([None, 2.0]),
)
async def test_rel12_the_timing_buckets_always_add_up_to_the_total(
    scripts: list[list[tuple[str, float, float | None]]],
    concurrency: int,
    item_timeout: float | None,
    batch_timeout: float | None,
    attempt_timeout: float | None,
) -> None:
    async def fn(prompt: str, *, attempt: int) -> str:
        script = scripts[int(prompt[1:])]
        kind, latency, retry_after = script[min(attempt, len(script)) - 1]
        await anyio.sleep(latency)
        if kind == "server":
            raise ProviderError("503", category=ErrorCategory.SERVER, retry_after=retry_after)
        if kind == "rate_limit":
            raise ProviderError("429", category=ErrorCategory.RATE_LIMIT, retry_after=retry_after)
        if kind == "hang":
            await anyio.sleep(100.0)  # past every deadline drawn (virtual time: free)
        return prompt

    cfg = ProcessorConfig(
        concurrency=concurrency,
        attempt_timeout=attempt_timeout,
        retry=RetryConfig(max_attempts=3, initial_wait=0.75, jitter=False, max_rate_limit_retries=2),
        rate_limit=RateLimitConfig(cooldown_seconds=1.5, slow_start_seconds=1.0),
        guardrails=GuardrailConfig(total_timeout_per_item=item_timeout, batch_timeout=batch_timeout),
    )
    t0 = anyio.current_time()
    batch = await process_prompts(CallableStrategy(fn), [f"p{i}" for i in range(len(scripts))], config=cfg)
    elapsed = anyio.current_time() - t0
    assert len(batch.results) == len(scripts)
    for result in batch.results:
        t = result.timing
        assert min(t.admission_wait, t.execution, t.backoff, t.cooldown) >= 0.0, result
        assert _buckets(result) == pytest.approx(t.total, abs=1e-9), result
        assert t.total <= elapsed + 1e-9
        if item_timeout is not None:
            assert t.total <= item_timeout + 1e-9, result
