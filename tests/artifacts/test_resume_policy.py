"""Resume decisions (the policy matrix), fingerprints, and prepare_resume against real stores."""

from __future__ import annotations

import dataclasses
import datetime
import enum
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_batch_llm import (
    ArtifactIdentity,
    ArtifactStoreError,
    ErrorCategory,
    FakeStrategy,
    LLMWorkItem,
    ResumePolicy,
    WorkItemResult,
)
from trio_batch_llm._artifacts import (
    JsonlArtifactStore,
    RerunReason,
    ResumePlan,
    SqliteArtifactStore,
    StoredRecord,
    decide_resume,
    ensure_store_usable,
    fingerprint,
    prepare_resume,
)

pytestmark = pytest.mark.anyio

NONE, SUCCESSES, ALL = ResumePolicy.NONE, ResumePolicy.REUSE_SUCCESSES, ResumePolicy.REUSE_ALL
FP = fingerprint("prompt", {"k": 1})
IDENTITY = ArtifactIdentity(provider="fake", model="m-1")

# Under REUSE_ALL, which stored failures replay. Written out by hand on purpose:
# the test must not recompute the rule it checks.
REPLAYED_UNDER_REUSE_ALL: dict[ErrorCategory | None, bool] = {
    ErrorCategory.RATE_LIMIT: False,
    ErrorCategory.TIMEOUT: False,
    ErrorCategory.TRANSIENT: False,
    ErrorCategory.SERVER: False,
    ErrorCategory.AUTHENTICATION: False,
    ErrorCategory.INSUFFICIENT_BALANCE: False,
    ErrorCategory.INVALID_REQUEST: True,
    ErrorCategory.CONTEXT_LENGTH: True,
    ErrorCategory.CONTENT_POLICY: True,
    ErrorCategory.PARSE: False,
    ErrorCategory.LOGIC_ERROR: False,
    ErrorCategory.UNKNOWN: False,
    ErrorCategory.DEADLINE: False,
    ErrorCategory.ABORTED: False,
    ErrorCategory.BUDGET: False,
    ErrorCategory.NOT_EXECUTED: False,
    None: False,
}


def stored(
    *, success: bool, category: ErrorCategory | None = None, fp: str = FP, identity_matches: bool = True
) -> StoredRecord:
    result = WorkItemResult(
        item_id="a", success=success, output="old answer" if success else None,
        error=None if success else "failed", error_category=category, attempts=2,
        token_usage={"total_tokens": 9}, context="stored context",
    )
    return StoredRecord(
        item_id="a", fingerprint=fp, result=result.to_dict(), identity_matches=identity_matches
    )


def test_every_category_has_an_expectation() -> None:
    assert set(REPLAYED_UNDER_REUSE_ALL) == {*ErrorCategory, None}


@pytest.mark.parametrize(
    ("record", "policy", "current_fp", "expected"),
    [
        pytest.param(None, ALL, FP, RerunReason.NOT_STORED, id="not-stored"),
        pytest.param(stored(success=True), NONE, FP, RerunReason.POLICY_NONE, id="none-success"),
        pytest.param(stored(success=True), SUCCESSES, FP, None, id="successes-success"),
        pytest.param(stored(success=True), ALL, FP, None, id="all-success"),
        pytest.param(stored(success=True), SUCCESSES, "other", RerunReason.INPUT_CHANGED,
                     id="successes-input-changed"),
        pytest.param(stored(success=True), ALL, "other", RerunReason.INPUT_CHANGED, id="all-input-changed"),
        pytest.param(stored(success=True, identity_matches=False), ALL, FP, RerunReason.IDENTITY_CHANGED,
                     id="identity-changed"),
        pytest.param(stored(success=False, category=ErrorCategory.INVALID_REQUEST), SUCCESSES, FP,
                     RerunReason.FAILURE_NOT_REUSED, id="successes-terminal-failure"),
        pytest.param(stored(success=False, category=ErrorCategory.INVALID_REQUEST), ALL, FP, None,
                     id="all-terminal-failure"),
        pytest.param(stored(success=False, category=ErrorCategory.INVALID_REQUEST), ALL, "other",
                     RerunReason.INPUT_CHANGED, id="all-terminal-failure-input-changed"),
        pytest.param(stored(success=False, category=ErrorCategory.INVALID_REQUEST), NONE, FP,
                     RerunReason.POLICY_NONE, id="none-terminal-failure"),
    ],
)
def test_policy_matrix(
    record: StoredRecord | None, policy: ResumePolicy, current_fp: str, expected: RerunReason | None
) -> None:
    decision = decide_resume(record, policy=policy, fingerprint=current_fp, context={"k": 1})
    assert decision.rerun_reason is expected
    assert decision.replays is (expected is None)
    assert (decision.replay is None) is (expected is not None)


@pytest.mark.parametrize("category", list(REPLAYED_UNDER_REUSE_ALL), ids=str)
@pytest.mark.parametrize("policy", [SUCCESSES, ALL])
def test_failure_categories(category: ErrorCategory | None, policy: ResumePolicy) -> None:
    decision = decide_resume(stored(success=False, category=category), policy=policy, fingerprint=FP)
    replays = policy is ALL and REPLAYED_UNDER_REUSE_ALL[category]
    assert decision.replays is replays
    if not replays:
        assert decision.rerun_reason is RerunReason.FAILURE_NOT_REUSED


def test_unknown_stored_category_reruns() -> None:
    record = stored(success=False, category=ErrorCategory.INVALID_REQUEST)
    record.result["error_category"] = "from_the_future"
    decision = decide_resume(record, policy=ALL, fingerprint=FP)
    assert decision.rerun_reason is RerunReason.FAILURE_NOT_REUSED


def test_replay_keeps_the_stored_outcome_and_takes_the_current_context() -> None:
    decision = decide_resume(stored(success=True), policy=SUCCESSES, fingerprint=FP, context={"k": 1})
    replay = decision.replay
    assert replay is not None
    assert replay.replayed
    assert (replay.item_id, replay.success, replay.output, replay.attempts) == ("a", True, "old answer", 2)
    assert replay.token_usage == {"total_tokens": 9}
    assert replay.context == {"k": 1}


def test_ensure_store_usable_names_path_count_and_policies() -> None:
    ensure_store_usable(NONE, path="/x/run.jsonl", stored_count=0)
    ensure_store_usable(SUCCESSES, path="/x/run.jsonl", stored_count=5)
    with pytest.raises(ArtifactStoreError) as info:
        ensure_store_usable(NONE, path="/x/run.jsonl", stored_count=5)
    message = str(info.value)
    assert "/x/run.jsonl" in message
    assert "5 stored result" in message
    assert "ResumePolicy.REUSE_SUCCESSES" in message


def test_plan_consumes_each_record_once_and_counts() -> None:
    records = {
        "a": stored(success=True),
        "b": dataclasses.replace(stored(success=True), item_id="b", fingerprint="stale"),
    }
    plan = ResumePlan(records, SUCCESSES)
    assert len(plan) == 2
    assert plan.decide("a", "prompt", {"k": 1}).replays
    assert not plan.decide("b", "prompt", {"k": 1}).replays
    assert not plan.decide("a", "prompt", {"k": 1}).replays  # consumed: the rerun writes a newer one
    assert len(plan) == 0
    assert plan.replayed == 1
    assert plan.rerun == {RerunReason.INPUT_CHANGED: 1, RerunReason.NOT_STORED: 1}


# -- fingerprints ----------------------------------------------------------------------


class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int
    y: int


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=12,
)


@given(st.text(), st.dictionaries(st.text(), json_values, max_size=6))
def test_fingerprint_ignores_dict_order(prompt: str, context: dict[str, Any]) -> None:
    reordered = dict(reversed(list(context.items())))
    assert fingerprint(prompt, context) == fingerprint(prompt, reordered)


@given(st.text(), st.text(), json_values)
def test_fingerprint_separates_prompt_and_context(a: str, b: str, context: Any) -> None:
    # Moving text across the prompt/context boundary never collides.
    if a != b:
        assert fingerprint(a, context) != fingerprint(b, context)
    assert fingerprint(a + "x", b) != fingerprint(a, "x" + b)


def test_fingerprint_is_a_stable_sha256() -> None:
    value = fingerprint("hello", {"b": 1, "a": [1, 2]})
    assert len(value) == 64
    assert value == fingerprint("hello", {"a": [1, 2], "b": 1})
    assert value != fingerprint("hello", {"a": [2, 1], "b": 1})
    assert fingerprint("p", None) != fingerprint("p", "null")
    assert fingerprint("p", {1, 2, 3}) == fingerprint("p", {3, 2, 1})
    assert fingerprint("p", (1, 2)) == fingerprint("p", [1, 2])
    assert fingerprint("p", Colour.RED) == fingerprint("p", "red")
    assert fingerprint("p", Point(1, 2)) == fingerprint("p", {"x": 1, "y": 2})
    when = datetime.datetime(2025, 1, 2, tzinfo=datetime.UTC)
    assert fingerprint("p", when) == fingerprint("p", when.isoformat())
    assert fingerprint("lone \ud800", None) == fingerprint("lone \ud800", None)


def test_unencodable_context_falls_back_to_repr() -> None:
    class Stable:
        def __repr__(self) -> str:
            return "Stable()"

    assert fingerprint("p", Stable()) == fingerprint("p", Stable())
    assert fingerprint("p", Stable()) != fingerprint("p", "Stable()")  # repr is tagged, not a string
    assert fingerprint("p", object()) != fingerprint("p", object())  # address in repr: always reruns
    assert fingerprint("p", {1: "a", "b": 2}) == fingerprint("p", {1: "a", "b": 2})  # mixed keys


# -- prepare_resume against real stores -------------------------------------------


@pytest.fixture(params=["jsonl", "sqlite"])
def store_path(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path]:
    return str(request.param), tmp_path / f"run.{request.param}"


def open_store(kind: str, path: Path) -> JsonlArtifactStore | SqliteArtifactStore:
    if kind == "jsonl":
        return JsonlArtifactStore(path, identity=IDENTITY)
    return SqliteArtifactStore(path, identity=IDENTITY)


def item(item_id: str, prompt: str) -> LLMWorkItem[Any]:
    return LLMWorkItem(item_id=item_id, strategy=FakeStrategy(), prompt=prompt, context={"n": item_id})


async def first_run(kind: str, path: Path) -> None:
    store = open_store(kind, path)
    async with store:
        for item_id, success in (("a", True), ("b", False), ("c", True)):
            result = WorkItemResult(
                item_id=item_id, success=success, output=item_id.upper() if success else None,
                error=None if success else "too long",
                error_category=None if success else ErrorCategory.CONTEXT_LENGTH,
            )
            await store.append(result, fingerprint=fingerprint(f"p-{item_id}", {"n": item_id}))


async def test_prepare_resume_under_none_refuses_a_used_store(store_path: tuple[str, Path]) -> None:
    kind, path = store_path
    fresh = open_store(kind, path)
    plan = await prepare_resume(fresh, NONE)
    assert len(plan) == 0
    await fresh.aclose()
    await first_run(kind, path)
    used = open_store(kind, path)
    with pytest.raises(ArtifactStoreError, match="3 stored result") as info:
        await prepare_resume(used, NONE)
    await used.aclose()
    assert str(path) in str(info.value)


@pytest.mark.parametrize(("policy", "replayed"), [(SUCCESSES, {"a"}), (ALL, {"a", "b"})])
async def test_prepare_resume_replays_matching_items(
    store_path: tuple[str, Path], policy: ResumePolicy, replayed: set[str]
) -> None:
    kind, path = store_path
    await first_run(kind, path)
    store = open_store(kind, path)
    plan = await prepare_resume(store, policy)
    await store.aclose()
    outcomes = {
        item_id: plan.replay(item(item_id, prompt))
        for item_id, prompt in (("a", "p-a"), ("b", "p-b"), ("c", "p-c CHANGED"), ("d", "p-d"))
    }
    assert {k for k, v in outcomes.items() if v is not None} == replayed
    replay_a = outcomes["a"]
    assert replay_a is not None
    assert (replay_a.output, replay_a.replayed, replay_a.context) == ("A", True, {"n": "a"})
