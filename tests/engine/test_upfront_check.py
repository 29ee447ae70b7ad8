"""The up-front check of a finite input (issue 36, point 3): every item checked once, before any call.

``process_prompts`` and ``process_stream`` over a list refuse bad input before
the strategy's ``prepare()``, naming the item (its index, the field, the value),
and check each item exactly once: the input check's verdict is not checked
again at intake (counted through a strategy's ``request_problem``, which every
item passes through exactly once).
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from trio_batch_llm import (
    FakeStrategy,
    LLMCallStrategy,
    LLMRequest,
    LLMWorkItem,
    ParallelBatchProcessor,
    ProcessorConfig,
    process_prompts,
    process_stream,
)

pytestmark = pytest.mark.anyio

BIG = 100_000
BAD_AT = 70_000


class Counting(LLMCallStrategy[str]):
    """Counts ``request_problem`` (the per-item check), ``prepare`` and calls; refuses one prompt."""

    def __init__(self, refuse: str | None = None) -> None:
        self.checked = 0
        self.prepared = 0
        self.calls: list[str] = []
        self.refuse = refuse

    def request_problem(self, request: LLMRequest) -> str | None:
        self.checked += 1
        if self.refuse is not None and request.prompt == self.refuse:
            return "this prompt is refused by the strategy"
        return super().request_problem(request)

    async def prepare(self) -> None:
        self.prepared += 1
        await anyio.lowlevel.checkpoint()

    async def execute(self, prompt: str, attempt: int, timeout: float | None,
                      state: Any = None) -> tuple[str, None, None]:
        self.calls.append(prompt)
        await anyio.lowlevel.checkpoint()
        return f"echo: {prompt}", None, None


def texts(n: int) -> list[Any]:
    return [f"p{i}" for i in range(n)]


def pairs(n: int) -> list[Any]:
    return [(f"id{i}", f"p{i}") for i in range(n)]


async def refused(strategy: Counting, prompts: list[Any], match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        await process_prompts(strategy, prompts, concurrency=4)
    assert (strategy.prepared, strategy.calls) == (0, [])


# --- the guarantee, deep in a long list ---------------------------------------------------------


async def test_a_text_of_the_wrong_type_deep_in_a_list_is_named_before_any_call(anyio_backend: str) -> None:
    prompts = texts(BIG)
    prompts[BAD_AT] = 42
    await refused(Counting(), prompts, r"^prompts\[70000\]=42: expected a str")


async def test_a_lone_surrogate_deep_in_a_list_of_texts_is_named(anyio_backend: str) -> None:
    prompts = texts(BIG)
    prompts[BAD_AT] = "ok \ud800"
    await refused(Counting(), prompts, r"^prompts\[70000\] \(item_id='item-70000'\): prompt has a lone "
                                       r"surrogate \(U\+D800 at index 3\)")


async def test_the_strategys_refusal_deep_in_a_list_names_the_item(anyio_backend: str) -> None:
    prompts = texts(BIG)
    prompts[BAD_AT] = "bad"
    await refused(Counting(refuse="bad"), prompts,
                  r"^prompts\[70000\] \(item_id='item-70000'\): this prompt is refused by the strategy$")


async def test_tuple_inputs_bad_id_deep_in_a_list(anyio_backend: str) -> None:
    prompts = pairs(BIG)
    prompts[BAD_AT] = ("", "p")
    await refused(Counting(), prompts, r"^prompts\[70000\]: item_id='' must be a non-empty string")
    prompts[BAD_AT] = (7, "p")
    await refused(Counting(), prompts, r"^prompts\[70000\]: item_id=7 must be a non-empty string")


async def test_tuple_inputs_bad_prompt_deep_in_a_list(anyio_backend: str) -> None:
    prompts = pairs(BIG)
    prompts[BAD_AT] = ("x", b"bytes")
    await refused(Counting(), prompts, r"^prompts\[70000\] \(item_id='x'\): prompt=b'bytes' must be a str")
    prompts[BAD_AT] = ("x", "\udfff")
    await refused(Counting(), prompts, r"^prompts\[70000\] \(item_id='x'\): prompt has a lone surrogate")


async def test_tuple_inputs_duplicate_id_deep_in_a_list_names_its_position(anyio_backend: str) -> None:
    prompts = pairs(BIG)
    prompts[BAD_AT] = ("id5", "again")
    await refused(Counting(), prompts,
                  r"^prompts\[70000\]: duplicate item_id='id5': every item needs a unique id")


async def test_tuple_inputs_context_nested_too_deep_deep_in_a_list(anyio_backend: str) -> None:
    prompts: list[Any] = [(f"id{i}", f"p{i}", {"row": i}) for i in range(BIG)]
    deep: Any = []
    for _ in range(300):
        deep = [deep]
    prompts[BAD_AT] = ("x", "p", deep)
    await refused(Counting(), prompts, r"^prompts\[70000\] \(item_id='x'\): context is nested more than 256")


async def test_a_bad_entry_after_good_ones_in_a_stream_of_a_list_is_refused_before_any_call(
        anyio_backend: str) -> None:
    strategy = Counting()
    prompts = pairs(1_000)
    prompts[700] = ("id3", "again")
    with pytest.raises(ValueError, match=r"^prompts\[700\]: duplicate item_id='id3'"):
        async with process_stream(strategy, prompts):
            pass
    assert (strategy.prepared, strategy.calls) == (0, [])


# --- the fast paths give the same items ---------------------------------------------------------


async def test_texts_and_tuples_run_as_before(anyio_backend: str) -> None:
    fake = FakeStrategy()
    batch = await process_prompts(fake, ["a", "b", "c"], preserve_order=True)
    assert [(r.item_id, r.output) for r in batch.results] == [
        ("item-0", "echo: a"), ("item-1", "echo: b"), ("item-2", "echo: c")]
    fake = FakeStrategy()
    batch = await process_prompts(fake, [("x", "a", {"k": 1}), ("y", "b", None), ("z", "c", [1, [2]])],
                                  preserve_order=True)
    assert [(r.item_id, r.output, r.context) for r in batch.results] == [
        ("x", "echo: a", {"k": 1}), ("y", "echo: b", None), ("z", "echo: c", [1, [2]])]
    fake = FakeStrategy()
    batch = await process_prompts(fake, (("x", "a"), ("y", "b")), preserve_order=True)
    assert [r.item_id for r in batch.results] == ["x", "y"]


async def test_a_non_ascii_text_without_surrogates_passes(anyio_backend: str) -> None:
    fake = FakeStrategy()
    batch = await process_prompts(fake, ["héllo", "日本", "\U0001f600"], preserve_order=True)
    assert [r.output for r in batch.results] == ["echo: héllo", "echo: 日本", "echo: \U0001f600"]
    fake = FakeStrategy()
    batch = await process_prompts(fake, [("é", "x"), ("e", "y")], preserve_order=True)
    assert [r.item_id for r in batch.results] == ["é", "e"]


async def test_tuple_ids_that_spell_generated_ones_are_fine_without_texts(anyio_backend: str) -> None:
    fake = FakeStrategy()
    batch = await process_prompts(fake, [("item-1", "a"), ("item-0", "b")], preserve_order=True)
    assert [r.item_id for r in batch.results] == ["item-1", "item-0"]
    with pytest.raises(ValueError, match=r"^prompts\[2\]: duplicate item_id='item-2'"):
        await process_prompts(FakeStrategy(), ["a", ("item-2", "b"), "c"])  # "c" is item-2


# --- one validation per item --------------------------------------------------------------------

N = 1_000


def mappings(n: int) -> list[Any]:
    return [{"id": f"m{i}", "prompt": f"p{i}"} for i in range(n)]


def work_items(strategy: LLMCallStrategy[str], n: int) -> list[Any]:
    return [LLMWorkItem(item_id=f"w{i}", strategy=strategy, prompt=f"p{i}") for i in range(n)]


def mixed(n: int) -> list[Any]:
    return [f"p{i}" if i % 2 else (f"t{i}", f"p{i}") for i in range(n)]


@pytest.mark.parametrize("shape", ["texts", "pairs", "mappings", "work items", "mixed"])
async def test_process_prompts_checks_each_item_once(anyio_backend: str, shape: str) -> None:
    strategy = Counting()
    prompts = {"texts": texts, "pairs": pairs, "mappings": mappings, "mixed": mixed,
               "work items": lambda n: work_items(strategy, n)}[shape](N)
    batch = await process_prompts(strategy, prompts, concurrency=8)
    assert batch.succeeded == N
    assert strategy.checked == N
    assert len(strategy.calls) == N


@pytest.mark.parametrize("lazy", [False, True], ids=["list", "generator"])
async def test_process_stream_checks_each_item_once(anyio_backend: str, lazy: bool) -> None:
    strategy = Counting()
    source: Any = pairs(N)
    if lazy:
        source = iter(source)
    async with process_stream(strategy, source, concurrency=8) as results:
        done = [r async for r in results]
    assert len(done) == N
    assert strategy.checked == N


async def test_add_work_checks_each_item_once(anyio_backend: str) -> None:
    strategy = Counting()
    async with ParallelBatchProcessor[str](ProcessorConfig(concurrency=4)) as proc:
        for item in work_items(strategy, 50):
            await proc.add_work(item)
        batch = await proc.process_all()
    assert batch.succeeded == 50
    assert strategy.checked == 50


async def test_a_resume_over_several_chunks_replays_and_runs_each_item_once(
        anyio_backend: str, tmp_path: Any) -> None:
    """The list goes in 1,024 items at a time; replays met among them are published in between."""
    from trio_batch_llm import ArtifactIdentity, ResumePolicy
    from trio_batch_llm._artifacts import JsonlArtifactStore

    identity = ArtifactIdentity(provider="test", model="one")

    n = 2_500
    prompts = pairs(n)
    failing = {f"p{i}" for i in range(0, n, 7)}  # the first run fails these; a resume runs them again
    first = FakeStrategy(script={p: [ValueError("no")] for p in failing})
    config = ProcessorConfig(concurrency=8)
    path = tmp_path / "store.jsonl"
    def store() -> JsonlArtifactStore:
        return JsonlArtifactStore(path, identity=identity)

    batch = await process_prompts(first, prompts, config=config, artifact_store=store())
    assert (batch.succeeded, batch.failed) == (n - len(failing), len(failing))
    again = Counting()
    batch = await process_prompts(again, prompts, config=config, artifact_store=store(),
                                  resume=ResumePolicy.REUSE_SUCCESSES, preserve_order=True)
    assert [r.item_id for r in batch.results] == [f"id{i}" for i in range(n)]
    assert batch.succeeded == n
    assert sorted(again.calls) == sorted(failing)
    assert sum(r.replayed for r in batch.results) == n - len(failing)
    assert again.checked == n


def test_a_checked_record_of_ids_joins_another_only_without_a_clash() -> None:
    from trio_batch_llm._engine._inputs import DuplicateTracker

    def taken() -> DuplicateTracker:
        tracker = DuplicateTracker()
        tracker.check("x")
        tracker.check("item-0", generated=True, index=0)
        return tracker

    for other, clash in [(DuplicateTracker.of(explicit={"x"}), "x"),
                         (DuplicateTracker.of(explicit={"item-0"}), "item-0")]:
        with pytest.raises(ValueError, match=f"^duplicate item_id='{clash}'"):
            taken().absorb(other)
    tracker = taken()
    tracker.absorb(DuplicateTracker.of(explicit={"y"}, generated=3))
    with pytest.raises(ValueError, match="duplicate item_id='y'"):
        tracker.check("y")
    with pytest.raises(ValueError, match="duplicate item_id='item-2'"):
        tracker.check("item-2")  # spells an id the other record generated
    explicit = DuplicateTracker()
    explicit.check("item-2")
    with pytest.raises(ValueError, match="duplicate item_id='item-2'"):
        explicit.absorb(DuplicateTracker.of(generated=3))
