"""Checkpoint and resume through the engine: process_prompts / process_stream with a store.

Every test runs on both stores (JSONL, SQLite) and both backends; Trio runs on
a virtual clock, so the batch deadline below costs no real time and its end
is exact. Strategies count their calls: a resume must run exactly the items
it cannot replay, and a replay must not be written again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from trio_batch_llm import (
    AbortMode,
    ArtifactIdentity,
    ArtifactMismatchError,
    ArtifactStoreError,
    BatchResult,
    ErrorCategory,
    FakeStrategy,
    GuardrailConfig,
    LLMCallStrategy,
    ProcessorConfig,
    ProviderError,
    ResumePolicy,
    RetryConfig,
    WorkItemResult,
    process_prompts,
    process_stream,
)
from trio_batch_llm._artifacts import JsonlArtifactStore, SqliteArtifactStore, fingerprint

from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio

NONE, SUCCESSES, ALL = ResumePolicy.NONE, ResumePolicy.REUSE_SUCCESSES, ResumePolicy.REUSE_ALL
IDENTITY = ArtifactIdentity(provider="fake", model="fake-model", prompt_version="1")
CONFIG = ProcessorConfig(concurrency=4, retry=RetryConfig(max_attempts=3, initial_wait=0.0, max_wait=0.0))
BATCH_TIMEOUT = 0.05  # virtual on trio; real (and short) on asyncio

Store = JsonlArtifactStore | SqliteArtifactStore


@pytest.fixture(scope="module", params=[pytest.param("asyncio", id="asyncio"),
                                        pytest.param(trio_virtual_clock(threads=True), id="trio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


class Stores:
    """Opens fresh store objects on one path (a store object serves one run)."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind = kind
        self.path = path

    def __call__(self, identity: ArtifactIdentity = IDENTITY, **options: Any) -> Store:
        if self.kind == "jsonl":
            return JsonlArtifactStore(self.path, identity=identity, **options)
        return SqliteArtifactStore(self.path, identity=identity, **options)

    async def history(self) -> list[WorkItemResult[Any]]:
        """Every stored record in write order (superseded ones included)."""
        return await anyio.to_thread.run_sync(lambda: list(self().iter_results()))


@pytest.fixture(params=["jsonl", "sqlite"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Stores:
    return Stores(request.param, tmp_path / ("run.jsonl" if request.param == "jsonl" else "run.sqlite"))


def called(fake: FakeStrategy) -> list[str]:
    return sorted(prompt for prompt, _ in fake.calls)


def by_id(batch: BatchResult[Any]) -> dict[str, WorkItemResult[Any]]:
    ids = [r.item_id for r in batch.results]
    assert len(ids) == len(set(ids)), "an item has two results"
    return batch.by_id()


def failing(category: ErrorCategory) -> ProviderError:
    return ProviderError(f"{category.value} (scripted)", category=category)


# --- resume after failures in the middle ------------------------------------------------

PROMPTS = [(f"id-{i}", f"p{i}", {"row": i}) for i in range(12)]
TERMINAL = {"p1", "p5"}  # INVALID_REQUEST: not retried
EXHAUSTED = {"p2", "p7"}  # SERVER on every attempt: retried until max_attempts
CONFIGURATION = {"p3"}  # AUTHENTICATION: not retried
FAILED = TERMINAL | EXHAUSTED | CONFIGURATION


def first_run_fake() -> FakeStrategy:
    script: dict[str, list[Any]] = {p: [failing(ErrorCategory.INVALID_REQUEST)] for p in TERMINAL}
    script |= {p: [failing(ErrorCategory.SERVER)] * 3 for p in EXHAUSTED}
    script |= {p: [failing(ErrorCategory.AUTHENTICATION)] for p in CONFIGURATION}
    return FakeStrategy(script=script)


async def test_resume_reruns_exactly_the_failures(stores: Stores) -> None:
    fake = first_run_fake()
    first = await process_prompts(fake, PROMPTS, config=CONFIG, artifact_store=stores())
    assert (first.succeeded, first.failed) == (7, 5)
    assert len(fake.calls) == 7 + len(TERMINAL) + 3 * len(EXHAUSTED) + len(CONFIGURATION)
    categories = {r.item_id: r.error_category for r in first.failures()}
    assert categories == {"id-1": ErrorCategory.INVALID_REQUEST, "id-5": ErrorCategory.INVALID_REQUEST,
                          "id-2": ErrorCategory.SERVER, "id-7": ErrorCategory.SERVER,
                          "id-3": ErrorCategory.AUTHENTICATION}
    assert len(await stores.history()) == 12

    rerun = FakeStrategy()
    store = stores()
    second = await process_prompts(rerun, PROMPTS, config=CONFIG, artifact_store=store, resume=SUCCESSES)
    assert called(rerun) == sorted(FAILED)
    assert all(attempt == 1 for _, attempt in rerun.calls)
    results = by_id(second)
    assert set(results) == {item_id for item_id, _, _ in PROMPTS}
    assert (second.total_items, second.succeeded, second.failed) == (12, 12, 0)
    replayed = {item_id for item_id, r in results.items() if r.replayed}
    assert replayed == {r.item_id for r in first.successes()}
    first_by_id = first.by_id()
    for item_id in replayed:
        assert results[item_id].output == first_by_id[item_id].output
        assert results[item_id].attempts == first_by_id[item_id].attempts
    assert results["id-4"].context == {"row": 4}
    # Only the reruns were written: replays are not appended again.
    assert store.statistics().records_written == len(FAILED)
    history = await stores.history()
    assert len(history) == 12 + len(FAILED)
    assert sorted(r.item_id for r in history[12:]) == sorted("id-" + p[1:] for p in FAILED)
    assert all(r.success for r in history[12:])

    idle = FakeStrategy()
    third = await process_prompts(idle, PROMPTS, config=CONFIG, artifact_store=stores(), resume=SUCCESSES)
    assert idle.calls == []
    assert all(r.replayed and r.success for r in third.results) and third.total_items == 12
    assert len(await stores.history()) == 12 + len(FAILED)


# --- the policy matrix, end to end ------------------------------------------------------

# Stored outcome -> whether REUSE_ALL replays it. Written out by hand on purpose.
STORED = {
    "success": True,
    ErrorCategory.INVALID_REQUEST: True,
    ErrorCategory.CONTEXT_LENGTH: True,
    ErrorCategory.CONTENT_POLICY: True,
    ErrorCategory.RATE_LIMIT: False,
    ErrorCategory.TIMEOUT: False,
    ErrorCategory.TRANSIENT: False,
    ErrorCategory.SERVER: False,
    ErrorCategory.PARSE: False,
    ErrorCategory.LOGIC_ERROR: False,
    ErrorCategory.UNKNOWN: False,
    ErrorCategory.AUTHENTICATION: False,
    ErrorCategory.INSUFFICIENT_BALANCE: False,
    ErrorCategory.DEADLINE: False,
    ErrorCategory.ABORTED: False,
    ErrorCategory.BUDGET: False,
    ErrorCategory.NOT_EXECUTED: False,
}


def _name(outcome: ErrorCategory | str) -> str:
    return outcome.value if isinstance(outcome, ErrorCategory) else outcome


async def seed_every_outcome(stores: Stores) -> list[tuple[str, str]]:
    """One stored result per outcome, item id = outcome name; returns the run's prompts."""
    async with stores() as store:
        for outcome in STORED:
            name = _name(outcome)
            result = (
                WorkItemResult(item_id=name, success=True, output="stored answer", attempts=1)
                if outcome == "success"
                else WorkItemResult(item_id=name, success=False, error="stored failure",
                                    error_category=ErrorCategory(outcome), attempts=1)
            )
            await store.append(result, fingerprint=fingerprint(f"prompt {name}", None))
    return [(_name(o), f"prompt {_name(o)}") for o in STORED] + [("new", "prompt new")]


@pytest.mark.parametrize("policy", [SUCCESSES, ALL])
async def test_policy_matrix_end_to_end(stores: Stores, policy: ResumePolicy) -> None:
    prompts = await seed_every_outcome(stores)
    fake = FakeStrategy()
    batch = await process_prompts(fake, prompts, config=CONFIG, artifact_store=stores(), resume=policy)
    replays = {_name(o) for o, reused in STORED.items() if o == "success" or (policy is ALL and reused)}
    assert called(fake) == sorted(f"prompt {i}" for i, _ in prompts if i not in replays)
    results = by_id(batch)
    assert {i for i, r in results.items() if r.replayed} == replays
    for item_id in replays - {"success"}:  # replayed terminal failures keep their stored verdict
        assert not results[item_id].success
        assert results[item_id].error_category == ErrorCategory(item_id)
    assert results["success"].output == "stored answer"
    assert all(r.success for i, r in results.items() if i not in replays)
    assert len(await stores.history()) == len(STORED) + len(prompts) - len(replays)


async def test_none_refuses_a_used_store_before_any_call(stores: Stores) -> None:
    await process_prompts(FakeStrategy(), ["a", "b"], artifact_store=stores())
    fake = FakeStrategy()
    with pytest.raises(ArtifactStoreError) as info:
        await process_prompts(fake, ["a", "b", "c"], artifact_store=stores(), resume=NONE)
    assert type(info.value) is ArtifactStoreError
    assert str(stores.path) in str(info.value) and "2 stored result" in str(info.value)
    assert fake.calls == [] and fake.prepare_count == 0
    # The refused run closed its store (the JSONL lock is free), and nothing was written.
    batch = await process_prompts(fake, ["a", "b", "c"], artifact_store=stores(), resume=SUCCESSES)
    assert called(fake) == ["c"] and batch.total_items == 3
    assert len(await stores.history()) == 3


async def test_none_accepts_a_store_without_results(stores: Stores) -> None:
    async with stores():
        pass  # created: header only
    batch = await process_prompts(FakeStrategy(), ["a"], artifact_store=stores(), resume=NONE)
    assert batch.succeeded == 1 and len(await stores.history()) == 1


# --- what makes a stored result stale ------------------------------------------------------


async def test_changed_prompt_or_context_reruns(stores: Stores) -> None:
    before = [("a", "pa", {"x": 1, "y": 2}), ("b", "pb", None), ("c", "pc", {"n": 1}), ("d", "pd")]
    await process_prompts(FakeStrategy(), before, artifact_store=stores())
    after = [("a", "pa", {"y": 2, "x": 1}), ("b", "pb CHANGED", None), ("c", "pc", {"n": 2}), ("d", "pd")]
    fake = FakeStrategy()
    batch = await process_prompts(fake, after, artifact_store=stores(), resume=ALL)
    assert called(fake) == ["pb CHANGED", "pc"]
    results = by_id(batch)
    assert {i for i, r in results.items() if r.replayed} == {"a", "d"}
    assert results["b"].output == "echo: pb CHANGED"
    assert results["c"].context == {"n": 2}
    assert results["a"].context == {"y": 2, "x": 1}  # a replay carries the current context


async def test_identity_mismatch_is_refused_before_any_call(stores: Stores) -> None:
    await process_prompts(FakeStrategy(), ["a", "b"], artifact_store=stores())
    other = ArtifactIdentity(provider="fake", model="fake-model", prompt_version="2")
    fake = FakeStrategy()
    for policy in (NONE, SUCCESSES, ALL):
        with pytest.raises(ArtifactMismatchError) as info:
            await process_prompts(fake, ["a", "b"], artifact_store=stores(other), resume=policy)
        assert str(stores.path) in str(info.value)
    assert fake.calls == [] and fake.prepare_count == 0
    # Told to allow it, the run appends under its own identity and replays nothing.
    store = stores(other, allow_identity_mismatch=True)
    batch = await process_prompts(fake, ["a", "b"], artifact_store=store, resume=SUCCESSES)
    assert called(fake) == ["a", "b"] and not any(r.replayed for r in batch.results)
    assert len(await stores.history()) == 4


# --- streaming ------------------------------------------------------------------------------


async def test_process_stream_left_early_then_resumed(stores: Stores) -> None:
    prompts = [f"p{i}" for i in range(40)]
    fake = FakeStrategy(latency=(0.001, 0.01), seed=3)
    received: list[WorkItemResult[str]] = []
    async with process_stream(fake, prompts, concurrency=4, artifact_store=stores()) as results:
        async for result in results:
            received.append(result)
            if len(received) == 10:
                break
    stored = {r.item_id: r for r in await stores.history()}
    # Published implies stored, with the same outcome.
    assert all(stored[r.item_id].output == r.output for r in received)
    assert 10 <= len(stored) < 40

    rerun = FakeStrategy(latency=(0.001, 0.01), seed=3)
    final: list[WorkItemResult[str]] = []
    async with process_stream(rerun, prompts, concurrency=4, artifact_store=stores(),
                              resume=SUCCESSES) as results:
        final = [result async for result in results]
    assert sorted(r.item_id for r in final) == sorted(f"item-{i}" for i in range(40))
    assert {r.item_id for r in final if r.replayed} == set(stored)
    assert called(rerun) == sorted(f"p{i}" for i in range(40) if f"item-{i}" not in stored)
    assert len(await stores.history()) == 40


# --- controlled stops are stored, and always rerun ------------------------------------------------


class Hanging(LLMCallStrategy[str]):
    """Answers at once, except for prompts in ``hang``, which never return."""

    def __init__(self, hang: frozenset[str] = frozenset()) -> None:
        self.hang = hang
        self.calls: list[tuple[str, int]] = []

    async def execute(
        self, prompt: str, attempt: int, timeout: float | None, state: Any = None
    ) -> tuple[str, Any, Any]:
        self.calls.append((prompt, attempt))
        if prompt in self.hang:
            await anyio.sleep_forever()
        await anyio.lowlevel.checkpoint()
        return "echo: " + prompt, {"total_tokens": 3}, None


async def test_batch_deadline_results_are_stored_and_rerun(stores: Stores, anyio_backend: Any) -> None:
    prompts = [f"p{i}" for i in range(10)]
    config = ProcessorConfig(concurrency=2, guardrails=GuardrailConfig(batch_timeout=BATCH_TIMEOUT))
    virtual = anyio_backend != "asyncio"
    hanging = Hanging(frozenset({"p1", "p2"}))
    first = await process_prompts(hanging, prompts, config=config, artifact_store=stores())
    assert first.termination.kind == "batch_deadline"
    if virtual:
        assert first.wall_time == pytest.approx(BATCH_TIMEOUT, abs=1e-9)  # virtual time: exact
    results = by_id(first)
    assert results["item-0"].success
    assert results["item-1"].error_category is ErrorCategory.DEADLINE  # in flight when it struck
    # p2 was either in flight or still queued, depending on when the clock reached the deadline.
    assert results["item-2"].error_category in {ErrorCategory.DEADLINE, ErrorCategory.NOT_EXECUTED}
    assert all(results[f"item-{i}"].error_category is ErrorCategory.NOT_EXECUTED for i in range(3, 10))
    not_run = {f"p{i}" for i in range(3, 10)}
    assert not not_run & {p for p, _ in hanging.calls}
    history = await stores.history()
    assert sorted(r.item_id for r in history) == sorted(f"item-{i}" for i in range(10))

    # The resume runs without the deadline: on the virtual clock the store's
    # thread writes would let the clock jump to it.
    rerun = Hanging()
    second = await process_prompts(rerun, prompts, concurrency=2, artifact_store=stores(), resume=ALL)
    assert second.termination.kind == "completed"
    assert sorted(p for p, _ in rerun.calls) == prompts[1:]
    assert {r.item_id for r in second.results if r.replayed} == {"item-0"}
    assert second.succeeded == 10


async def test_abort_results_are_stored_and_rerun(stores: Stores) -> None:
    prompts = [f"p{i}" for i in range(6)]
    guard = GuardrailConfig(abort_on_error_categories=frozenset({ErrorCategory.AUTHENTICATION}),
                            abort_mode=AbortMode.DRAIN_ACTIVE)
    config = ProcessorConfig(concurrency=1, guardrails=guard)
    fake = FakeStrategy(script={"p1": [failing(ErrorCategory.AUTHENTICATION)]})
    first = await process_prompts(fake, prompts, config=config, artifact_store=stores())
    assert first.termination.kind == "aborted"
    assert [r.error_category for r in first.in_input_order()] == [
        None, ErrorCategory.AUTHENTICATION, *[ErrorCategory.NOT_EXECUTED] * 4
    ]
    assert len(await stores.history()) == 6
    # REUSE_ALL replays terminal provider failures, but a configuration failure and
    # "not executed" say nothing about the item: both run again.
    rerun = FakeStrategy()
    second = await process_prompts(rerun, prompts, config=config, artifact_store=stores(), resume=ALL)
    assert called(rerun) == prompts[1:]
    assert second.termination.kind == "completed" and second.succeeded == 6


# --- controlled stops and replays (engine fixes from the durability work) ---


async def test_a_replayed_failure_does_not_abort_the_resume(stores: Stores) -> None:
    """REUSE_ALL replays an INVALID_REQUEST; with that category in abort_on_error_categories the
    replay must not abort the resumed run, or such a run could never complete."""
    fake = FakeStrategy(script={"p1": [failing(ErrorCategory.INVALID_REQUEST)]})
    prompts = [f"p{i}" for i in range(4)]
    await process_prompts(fake, prompts, artifact_store=stores())
    guard = GuardrailConfig(abort_on_error_categories=frozenset({ErrorCategory.INVALID_REQUEST}))
    rerun = FakeStrategy()
    batch = await process_prompts(rerun, [*prompts, "new"], config=ProcessorConfig(guardrails=guard),
                                  artifact_store=stores(), resume=ALL)
    assert batch.termination.kind == "completed"
    assert called(rerun) == ["new"]
    replayed_failure = by_id(batch)["item-1"]
    assert replayed_failure.replayed and replayed_failure.error_category is ErrorCategory.INVALID_REQUEST


async def test_process_stream_batch_deadline_ends_cleanly_and_resumes(stores: Stores) -> None:
    """A controlled stop while the stream's feeder still has input ends the stream cleanly
    (termination batch_deadline), its results are stored, and a resume finishes the rest."""
    prompts = [f"p{i}" for i in range(20)]
    config = ProcessorConfig(concurrency=2, max_queue_size=2,
                             guardrails=GuardrailConfig(batch_timeout=BATCH_TIMEOUT))
    async with process_stream(Hanging(frozenset({"p1", "p2"})), prompts, config=config,
                              artifact_store=stores()) as results:
        first = [result async for result in results]
    assert results.termination.kind == "batch_deadline"
    stored = {r.item_id: r for r in await stores.history()}
    assert {r.item_id for r in first} == set(stored)
    rerun = Hanging()
    async with process_stream(rerun, prompts, concurrency=2, artifact_store=stores(), resume=ALL) as results:
        second = [result async for result in results]
    assert sorted(r.item_id for r in second) == sorted(f"item-{i}" for i in range(20))
    successes = {i for i, r in stored.items() if r.success}
    assert {r.item_id for r in second if r.replayed} == successes
    expected = sorted(f"p{n}" for n in range(20) if f"item-{n}" not in successes)
    assert sorted(p for p, _ in rerun.calls) == expected
