"""Identity inferred: infer_artifact_identity, and stores and runs that infer it when it is omitted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio.lowlevel
import pydantic
import pytest

from trio_batch_llm import (
    ArtifactIdentity,
    ArtifactMismatchError,
    BatchLLMError,
    CallableStrategy,
    ConfigurationError,
    JsonlArtifactStore,
    LLMCallStrategy,
    LLMWorkItem,
    ParallelBatchProcessor,
    ResumePolicy,
    SqliteArtifactStore,
    infer_artifact_identity,
    open_run,
    process_prompts,
    process_stream,
)

pytestmark = pytest.mark.anyio


class Answer(pydantic.BaseModel):
    label: str


class Configured(CallableStrategy[str]):
    """A strategy carrying the request settings an identity fingerprints."""

    def __init__(self, *, system: str | None = None, params: dict[str, Any] | None = None,
                 response_model: Any = None, model: str = "gpt-4o-mini") -> None:
        super().__init__(self._answer)
        self.system_prompt = system
        self.params = params or {}
        self.response_model = response_model
        self._model = model
        self.calls = 0

    async def _answer(self, prompt: str) -> str:
        await anyio.lowlevel.checkpoint()
        self.calls += 1
        return prompt.upper()

    @property
    def provider_name(self) -> str:
        return "openai"

    @property
    def model_name(self) -> str:
        return self._model


def test_a_plain_strategy_keeps_the_bare_identity() -> None:
    assert infer_artifact_identity(Configured()) == ArtifactIdentity("openai", "gpt-4o-mini")


def test_settings_are_fingerprinted_stably() -> None:
    schema = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}
    identity = infer_artifact_identity(
        Configured(system="Be brief.", params={"temperature": 0.2, "max_output_tokens": 64},
                   response_model=schema)
    )
    # Fixed values: canonical JSON + SHA-256, the same in every process and on every run.
    assert identity.provider == "openai" and identity.model == "gpt-4o-mini"
    assert identity.prompt_version == "auto-af7a3eb7a249a71f"
    assert identity.parser_version == "auto-bf65da2f282a106c"


def test_each_setting_changes_the_identity_and_key_order_does_not() -> None:
    base = infer_artifact_identity(Configured(system="A", params={"temperature": 0.2, "seed": 1}))
    assert infer_artifact_identity(Configured(system="A", params={"seed": 1, "temperature": 0.2})) == base
    assert infer_artifact_identity(Configured(system="B", params={"temperature": 0.2, "seed": 1})) != base
    assert infer_artifact_identity(Configured(system="A", params={"temperature": 0.3, "seed": 1})) != base
    schema = {"type": "object", "properties": {"label": {"type": "string"}}}
    with_schema = infer_artifact_identity(Configured(system="A", params={"temperature": 0.2, "seed": 1},
                                                     response_model=schema))
    assert with_schema.prompt_version == base.prompt_version and with_schema.parser_version is not None
    # A pydantic model and its own JSON schema are the same response schema.
    assert (infer_artifact_identity(Configured(response_model=Answer)).parser_version
            == infer_artifact_identity(Configured(response_model=Answer.model_json_schema())).parser_version)
    assert infer_artifact_identity(Configured(model="gpt-4o")).model == "gpt-4o"


def test_params_that_cannot_be_fingerprinted_are_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match=r"params=.*pass identity="):
        infer_artifact_identity(Configured(params={"stop": object()}))


def _header(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text().splitlines()[0])["identity"]


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
async def test_an_omitted_identity_resumes_and_a_changed_system_prompt_is_refused(
    tmp_path: Path, kind: str
) -> None:
    path = tmp_path / f"out.{kind}"
    store_type = JsonlArtifactStore if kind == "jsonl" else SqliteArtifactStore
    first = Configured(system="Be brief.")
    batch = await process_prompts(first, ["a", "b"], artifact_store=store_type(path))
    assert batch.succeeded == 2 and first.calls == 2

    again = Configured(system="Be brief.")  # a new object with the same settings: the same identity
    store = store_type(path)
    assert store.identity is None
    resumed = await process_prompts(again, ["a", "b"], artifact_store=store,
                                    resume=ResumePolicy.REUSE_SUCCESSES)
    assert again.calls == 0 and all(r.replayed for r in resumed.results)
    assert store.identity == infer_artifact_identity(again)

    changed = Configured(system="Be verbose.")
    with pytest.raises(ArtifactMismatchError, match=r"Be verbose|prompt_version"):
        await process_prompts(changed, ["a", "b"], artifact_store=store_type(path),
                              resume=ResumePolicy.REUSE_SUCCESSES)
    assert changed.calls == 0
    # Told to append anyway, the records of the other identity are never replayed: both items run.
    async with process_stream(
        changed, ["a", "b"], artifact_store=store_type(path, allow_identity_mismatch=True),
        resume=ResumePolicy.REUSE_SUCCESSES,
    ) as results:
        rerun = [r async for r in results]
    assert changed.calls == 2 and not any(r.replayed for r in rerun)


async def test_an_explicit_identity_wins(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    explicit = ArtifactIdentity("mine", "m", prompt_version="v7")
    store = JsonlArtifactStore(path, identity=explicit)
    await process_prompts(Configured(system="Be brief."), ["a"], artifact_store=store)
    assert store.identity == explicit
    assert _header(path) == explicit.to_dict()


async def test_a_processor_needs_the_identity_before_it_opens_the_store(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    strategy = Configured()
    with pytest.raises(ConfigurationError, match=r"identity=None.*infer_identity"):
        async with ParallelBatchProcessor[str](artifact_store=JsonlArtifactStore(path)):
            pass  # pragma: no cover
    assert not path.exists()  # refused before any file is touched
    store = JsonlArtifactStore(path)
    store.infer_identity(strategy)
    async with ParallelBatchProcessor[str](artifact_store=store) as processor:
        await processor.add_work(LLMWorkItem(item_id="a", strategy=strategy, prompt="a"))
        batch = await processor.process_all()
    assert batch.succeeded == 1 and _header(path) == infer_artifact_identity(strategy).to_dict()


async def test_open_run_infers_the_identity(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    async with await open_run(db, "r", Configured(system="A"), ["x", "y"]) as run:
        snap = await run.wait()
    assert snap.identity == infer_artifact_identity(Configured(system="A"))
    async with await open_run(db, "r", Configured(system="A"), ["x", "y"]) as run:  # reattach: same identity
        assert (await run.wait()).done == 2
    with pytest.raises(BatchLLMError, match="identity"):
        await open_run(db, "r", Configured(system="B"), ["x", "y"])
    # A store built without an identity takes the strategy's too.
    async with await open_run(SqliteArtifactStore(tmp_path / "s.sqlite"), "r", Configured(system="C"),
                              ["x"]) as run:
        assert (await run.wait()).identity == infer_artifact_identity(Configured(system="C"))


def test_the_openai_strategies_settings_count_whichever_way_they_are_given() -> None:
    from trio_batch_llm import OpenAICompatibleStrategy

    url = "http://127.0.0.1:9/v1"
    bare = infer_artifact_identity(OpenAICompatibleStrategy("m", base_url=url))
    warm = infer_artifact_identity(OpenAICompatibleStrategy("m", base_url=url, temperature=0.7))
    capped = infer_artifact_identity(OpenAICompatibleStrategy("m", base_url=url, max_output_tokens=9))
    assert bare.prompt_version is None
    assert len({bare.prompt_version, warm.prompt_version, capped.prompt_version}) == 3
    assert infer_artifact_identity(Configured(model="m", params={"temperature": 0.7})).prompt_version \
        == warm.prompt_version


# --- issue 31, point 3: a resume never guesses the model ------------------------------------------


class Counting:
    """An async callable that counts its calls (a user's function behind a CallableStrategy)."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, prompt: str) -> str:
        await anyio.lowlevel.checkpoint()
        self.calls += 1
        return prompt.upper()


class NoModel(LLMCallStrategy[str]):
    """A user's strategy that says nothing about the model it calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.model = "gpt-4o"  # an attribute of its own: not a declaration the library reads

    async def execute(self, prompt: str, attempt: int, timeout: float | None,
                      state: Any = None) -> tuple[str, Any, Any]:
        await anyio.lowlevel.checkpoint()
        self.calls += 1
        return prompt.upper(), None, None


def _store(kind: str, path: Path, **options: Any) -> JsonlArtifactStore | SqliteArtifactStore:
    return (JsonlArtifactStore if kind == "jsonl" else SqliteArtifactStore)(path, **options)


def test_a_strategy_that_declares_no_model_has_no_inferred_identity() -> None:
    with pytest.raises(ConfigurationError, match=r"declares no model") as info:
        infer_artifact_identity(CallableStrategy(Counting()))
    message = str(info.value)
    assert "identity=ArtifactIdentity(" in message and "CallableStrategy(fn, identity=" in message
    with pytest.raises(ConfigurationError, match=r"declares no model") as info:
        infer_artifact_identity(NoModel())
    assert "identity=ArtifactIdentity(" in str(info.value) and "model_name" in str(info.value)


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
async def test_no_model_and_a_store_is_refused_before_any_call(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"out.{kind}"
    fn = Counting()
    callable_strategy = CallableStrategy(fn)
    with pytest.raises(ConfigurationError, match=r"declares no model.*identity=ArtifactIdentity"):
        await process_prompts(callable_strategy, ["a", "b"], artifact_store=_store(kind, path))
    with pytest.raises(ConfigurationError, match=r"declares no model.*identity=ArtifactIdentity"):
        async with process_stream(callable_strategy, ["a"], artifact_store=_store(kind, path)) as results:
            async for _ in results:  # pragma: no cover
                pass
    custom = NoModel()
    with pytest.raises(ConfigurationError, match=r"NoModel declares no model.*model_name"):
        await process_prompts(custom, ["a", "b"], artifact_store=_store(kind, path),
                              resume=ResumePolicy.REUSE_SUCCESSES)
    with pytest.raises(ConfigurationError, match=r"declares no model"):
        await open_run(tmp_path / "runs.sqlite", "r", custom, ["a"])
    assert fn.calls == 0 and custom.calls == 0
    assert not path.exists()  # refused before the store was touched

    # No store, no identity needed.
    batch = await process_prompts(callable_strategy, ["a", "b"])
    assert batch.succeeded == 2 and fn.calls == 2


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
async def test_no_model_with_an_explicit_identity_checkpoints_and_resumes(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"out.{kind}"
    identity = ArtifactIdentity("my-gateway", "gpt-4o")
    first = NoModel()
    batch = await process_prompts(first, ["a", "b"], artifact_store=_store(kind, path, identity=identity))
    assert batch.succeeded == 2 and first.calls == 2
    again = NoModel()
    resumed = await process_prompts(again, ["a", "b"], artifact_store=_store(kind, path, identity=identity),
                                    resume=ResumePolicy.REUSE_SUCCESSES)
    assert again.calls == 0 and all(r.replayed for r in resumed.results)


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
async def test_a_callable_declares_its_model_and_a_changed_model_never_replays(tmp_path: Path,
                                                                               kind: str) -> None:
    path = tmp_path / f"out.{kind}"
    old = ArtifactIdentity("my-gateway", "model-a")
    fn = Counting()
    batch = await process_prompts(CallableStrategy(fn, identity=old), ["a", "b"],
                                  artifact_store=_store(kind, path))
    assert batch.succeeded == 2 and fn.calls == 2
    assert infer_artifact_identity(CallableStrategy(fn, identity=old)) == old
    # The same declared model: replayed.
    resumed = await process_prompts(CallableStrategy(fn, identity=old), ["a", "b"],
                                    artifact_store=_store(kind, path), resume=ResumePolicy.REUSE_SUCCESSES)
    assert fn.calls == 2 and all(r.replayed for r in resumed.results)
    # Another model: the store refuses the checkpoint before any call (as for any changed identity) ...
    new = CallableStrategy(fn, identity=ArtifactIdentity("my-gateway", "model-b"))
    with pytest.raises(ArtifactMismatchError, match="model-b"):
        await process_prompts(new, ["a", "b"], artifact_store=_store(kind, path),
                              resume=ResumePolicy.REUSE_SUCCESSES)
    assert fn.calls == 2
    # ... and told to go on, it reruns every item: the old model's answers are never replayed.
    rerun = await process_prompts(new, ["a", "b"], artifact_store=_store(kind, path,
                                                                         allow_identity_mismatch=True),
                                  resume=ResumePolicy.REUSE_SUCCESSES)
    assert fn.calls == 4 and not any(r.replayed for r in rerun.results)


def test_a_declared_identity_is_completed_with_the_strategys_settings() -> None:
    declared = ArtifactIdentity("my-gateway", "model-a", application_version="2")
    strategy = CallableStrategy(Counting(), identity=declared)
    strategy.system_prompt = "Be brief."
    inferred = infer_artifact_identity(strategy)
    assert (inferred.provider, inferred.model, inferred.application_version) == ("my-gateway", "model-a", "2")
    assert inferred.prompt_version is not None and inferred.prompt_version.startswith("auto-")
    # What the user declared wins over what would be inferred.
    pinned = CallableStrategy(Counting(), identity=ArtifactIdentity("g", "m", prompt_version="v3"))
    pinned.system_prompt = "Be brief."
    assert infer_artifact_identity(pinned).prompt_version == "v3"
    assert (strategy.provider_name, strategy.model_name) == ("my-gateway", "model-a")
    assert CallableStrategy(Counting()).model_name is None


def test_every_setting_of_the_bundled_strategies_is_in_the_identity() -> None:
    from trio_batch_llm import FakeStrategy, OpenAICompatibleStrategy, OpenAIStrategy

    url = "http://127.0.0.1:9/v1"

    def compat(**kwargs: Any) -> ArtifactIdentity:
        kwargs.setdefault("base_url", url)
        return infer_artifact_identity(OpenAICompatibleStrategy(kwargs.pop("model", "m"), **kwargs))

    schema = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}
    variants = [
        compat(),
        compat(model="m2"),
        compat(system_prompt="Be brief."),
        compat(params={"seed": 1}),
        compat(temperature=0.5),
        compat(max_output_tokens=10),
        compat(extra_body={"top_k": 3}),
        compat(response_model=Answer),
        compat(response_model=schema),
        infer_artifact_identity(OpenAIStrategy("m", api_key="sk-test", base_url=url)),
    ]
    assert len(set(variants)) == len(variants)
    assert variants[-1].provider == "openai" and variants[0].provider == "openai-compatible"
    fakes = {infer_artifact_identity(FakeStrategy(model=name)) for name in ("a", "b")}
    assert len(fakes) == 2


def test_a_store_inferred_from_one_strategy_refuses_another(tmp_path: Path) -> None:
    store = JsonlArtifactStore(tmp_path / "out.jsonl")
    first = store.infer_identity(Configured(model="model-a"))
    assert store.infer_identity(Configured(model="model-a")) == first  # the same identity: fine
    with pytest.raises(ConfigurationError, match=r"inferred from another strategy.*model-a"):
        store.infer_identity(Configured(model="model-b"))
    # A given identity wins over any strategy, as before.
    given = JsonlArtifactStore(tmp_path / "given.jsonl", identity=ArtifactIdentity("mine", "m"))
    assert given.infer_identity(Configured(model="model-b")) == ArtifactIdentity("mine", "m")


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
async def test_an_item_of_another_strategy_is_refused_by_an_inferred_identity(tmp_path: Path,
                                                                              kind: str) -> None:
    """process_prompts takes LLMWorkItems with strategies of their own: the identity inferred from
    the batch's strategy does not describe them, so such an item is refused before any call."""
    path = tmp_path / f"out.{kind}"
    cheap, other = Configured(model="model-a"), Configured(model="model-b")
    items = [LLMWorkItem(item_id="a", strategy=cheap, prompt="a"),
             LLMWorkItem(item_id="b", strategy=other, prompt="b")]
    with pytest.raises(ConfigurationError, match=r"item_id='b'.*inferred from another strategy"):
        await process_prompts(cheap, items, artifact_store=_store(kind, path))
    assert cheap.calls == 0 and other.calls == 0
    # Items of strategies with the same identity are fine; so is a given identity, for any mix.
    same = Configured(model="model-a")
    batch = await process_prompts(cheap, [items[0], LLMWorkItem(item_id="c", strategy=same, prompt="c")],
                                  artifact_store=_store(kind, path))
    assert batch.succeeded == 2
    given = ArtifactIdentity("mine", "escalating")
    batch = await process_prompts(cheap, items, artifact_store=_store(kind, tmp_path / f"g.{kind}",
                                                                      identity=given))
    assert batch.succeeded == 2
