"""Issue 16, the artifact-store cases: each test is named after the case it covers.

* rel1: a file that is not provably ours is never repaired, truncated or appended to.
* rel2: a complete last record whose newline was stripped is kept, not cut as a torn write.
* rel10: a replay gives back the original output, or the output is refused before it is published.
* rel11: item ids that no store can hold are refused before any call, the same way for every store.
* rel7 (NaN part): every file written is strict JSON (no bare ``NaN`` / ``Infinity``).

Engine-level tests run on both stores and both backends; the CLI ones run ``main()`` in-process
against a closed port, so a check that let a run start would fail loudly.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

from trio_batch_llm import (
    ArtifactIdentity,
    ArtifactStoreError,
    BatchResult,
    ConfigurationError,
    ErrorCategory,
    FakeStrategy,
    LLMWorkItem,
    ParallelBatchProcessor,
    ProcessorConfig,
    ResumePolicy,
    RetryConfig,
    WorkItemResult,
    process_prompts,
    process_stream,
)
from trio_batch_llm._artifacts import JsonlArtifactStore, SqliteArtifactStore, fingerprint
from trio_batch_llm._runs.repository._sqlite import SqliteRunRepository
from trio_batch_llm.cli import main

pytestmark = pytest.mark.anyio

IDENTITY = ArtifactIdentity(provider="fake", model="fake-model")
CONFIG = ProcessorConfig(concurrency=4, retry=RetryConfig(max_attempts=3, initial_wait=0.0, max_wait=0.0))
SUCCESSES, ALL = ResumePolicy.REUSE_SUCCESSES, ResumePolicy.REUSE_ALL
DEAD_URL = "http://127.0.0.1:9/v1"
LOGGER = "trio_batch_llm.artifacts"

Store = JsonlArtifactStore | SqliteArtifactStore


class Stores:
    """Fresh store objects on one path (a store object serves one run)."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind = kind
        self.path = path

    def __call__(self, **options: Any) -> Store:
        options.setdefault("identity", IDENTITY)
        if self.kind == "jsonl":
            return JsonlArtifactStore(self.path, **options)
        return SqliteArtifactStore(self.path, **options)

    async def history(self, **options: Any) -> list[WorkItemResult[Any]]:
        return await anyio.to_thread.run_sync(lambda: list(self(**options).iter_results()))


@pytest.fixture(params=["jsonl", "sqlite"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Stores:
    return Stores(request.param, tmp_path / ("run.jsonl" if request.param == "jsonl" else "run.sqlite"))


def success(item_id: str, output: Any = "answer") -> WorkItemResult[Any]:
    return WorkItemResult(item_id=item_id, success=True, output=output, attempts=1,
                          token_usage={"input_tokens": 3, "output_tokens": 4, "total_tokens": 7})


async def fill(path: Path, n: int) -> None:
    async with JsonlArtifactStore(path, identity=IDENTITY) as store:
        for i in range(n):
            await store.append(success(f"item-{i}", f"answer {i}"), fingerprint=fingerprint(f"p{i}", None))


def strict_loads(text: str | bytes) -> Any:
    """A JSON reader as strict as jq about numbers: NaN and Infinity are not JSON."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def cli_args(source: Path, out: Path, backend: str, *extra: str) -> list[str]:
    return ["run", str(source), "--model", "openai-compatible:m", "--base-url", DEAD_URL,
            "--out", str(out), "--backend", backend, *extra]


# --- rel1: only a file that is provably ours is repaired or appended to -----------------------


ONE_LINE_FOREIGN = b'{"api":"important"}'


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_rel1_cli_resume_refuses_a_foreign_one_line_file(
    backend: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "prompt": "one"}\n')
    out = tmp_path / "precious.jsonl"
    out.write_bytes(ONE_LINE_FOREIGN)
    code, output = run_cli(capsys, *cli_args(source, out, backend, "--resume"))
    assert code == 2, output
    assert f"cannot use --out {out}" in output
    assert "not a trio-batch-llm checkpoint" in output
    assert out.read_bytes() == ONE_LINE_FOREIGN


FOREIGN_JSONL = [
    ONE_LINE_FOREIGN,
    ONE_LINE_FOREIGN + b"\n",
    b'{"api":"important"}\n{"more":1}',
    b"hello",
    b"\n",
    b'{"kind":"header"}',  # not a prefix of the header's fixed start
    b'{"kind":"header","format":"someone-else","version":1}\n',
    b'{"format":"trio-batch-llm-artifacts","version":1,"identity":{}}\n',  # right words, not our bytes
    b'{"kind":"header","format":"trio-batch-llm-artifacts","version":1}\n',  # our bytes, but corrupt
]


@pytest.mark.parametrize("content", FOREIGN_JSONL)
async def test_rel1_jsonl_store_refuses_a_file_that_is_not_ours_untouched(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(content)
    store = JsonlArtifactStore(path, identity=IDENTITY)
    with pytest.raises(ArtifactStoreError) as info:
        await store.open()
    await store.aclose()
    message = str(info.value)
    assert str(path) in message
    assert "not a trio-batch-llm checkpoint" in message or "corrupt" in message
    assert path.read_bytes() == content
    reader = JsonlArtifactStore(path, identity=IDENTITY)
    with pytest.raises(ArtifactStoreError):
        await anyio.to_thread.run_sync(lambda: list(reader.iter_results()))


@pytest.mark.parametrize(
    "content",
    [b"", b"{", b'{"kind":"he', b'{"kind":"header","format":"trio-batch-llm-artifacts","vers',
     b'{"kind":"header","fo' + b"\0" * 300, b"\0" * 64,
     b'{"kind":"header","format":"trio-batch-llm-artifacts",' + b"x" * 100],  # starts with the magic
)
async def test_rel1_a_torn_header_of_ours_is_started_afresh(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(content)
    async with JsonlArtifactStore(path, identity=IDENTITY) as store:
        assert await store.count_records() == 0
        await store.append(success("x"), fingerprint="f")
    lines = path.read_bytes().split(b"\n")
    assert len(lines) == 3 and lines[2] == b""
    assert strict_loads(lines[0])["kind"] == "header"
    assert strict_loads(lines[1])["item_id"] == "x"


async def test_rel1_files_written_by_the_previous_version_still_open(tmp_path: Path) -> None:
    # The exact bytes this library wrote before the magic prefix was named (version 1 header).
    path = tmp_path / "old.jsonl"
    identity = json.dumps(IDENTITY.to_dict(), separators=(",", ":"))
    header = (
        '{"kind":"header","format":"trio-batch-llm-artifacts","version":1,"identity":' + identity
        + ',"identity_fingerprint":"0123456789abcdef","created_at":"2025-01-01T00:00:00+00:00",'
        '"library_version":"0.1.0"}\n'
    )
    from trio_batch_llm._artifacts._fingerprint import identity_fingerprint

    record = {"kind": "result", "item_id": "a", "fingerprint": "f",
              "identity": identity_fingerprint(IDENTITY), "result": success("a").to_dict()}
    path.write_text(header + json.dumps(record, separators=(",", ":")) + "\n")
    async with JsonlArtifactStore(path, identity=IDENTITY) as store:
        assert list(await store.load()) == ["a"]
        await store.append(success("b"), fingerprint="g")
    assert path.read_text().startswith(header)


def _foreign_sqlite(path: Path, *statements: str) -> bytes:
    conn = sqlite3.connect(path)
    try:
        for statement in statements:
            conn.execute(statement)
        conn.commit()
    finally:
        conn.close()
    return path.read_bytes()


@pytest.mark.parametrize(
    "statements",
    [
        ("CREATE TABLE customers (id INTEGER)", "INSERT INTO customers VALUES (1)"),
        ("PRAGMA user_version=7",),  # no tables, but somebody's schema version: not empty, not ours
        ("PRAGMA application_id=1234",),
        # our application id but none of our tables: refuse, do not "migrate"
        ("PRAGMA application_id=1413631052", "CREATE TABLE customers (id INTEGER)"),
    ],
)
async def test_rel1_sqlite_store_refuses_a_foreign_database_untouched(
    tmp_path: Path, statements: tuple[str, ...]
) -> None:
    path = tmp_path / "other.sqlite"
    before = await anyio.to_thread.run_sync(_foreign_sqlite, path, *statements)
    store = SqliteArtifactStore(path, identity=IDENTITY)
    with pytest.raises(ArtifactStoreError) as info:
        await store.open()
    await store.aclose()
    assert str(path) in str(info.value)
    assert "not a trio-batch-llm" in str(info.value)
    assert path.read_bytes() == before  # byte for byte: not even switched to WAL
    assert not await anyio.Path(f"{path}-wal").exists()


async def test_rel1_sqlite_store_refuses_a_text_file_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.sqlite"
    path.write_bytes(ONE_LINE_FOREIGN)
    store = SqliteArtifactStore(path, identity=IDENTITY)
    with pytest.raises(ArtifactStoreError, match="not a trio-batch-llm"):
        await store.open()
    await store.aclose()
    assert path.read_bytes() == ONE_LINE_FOREIGN


def test_rel1_run_repository_refuses_a_foreign_database_untouched(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    before = _foreign_sqlite(path, "CREATE TABLE customers (id INTEGER)")
    repository = SqliteRunRepository(path)
    with pytest.raises(ArtifactStoreError, match="not a trio-batch-llm"):
        repository.open()
    assert path.read_bytes() == before


# --- rel2: a complete last record without its newline is kept --------------------------------


async def test_rel2_complete_last_record_without_newline_is_kept_and_not_paid_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "run.jsonl"
    prompts = [(f"id-{i}", f"p{i}") for i in range(3)]
    first = FakeStrategy()
    await process_prompts(first, prompts, config=CONFIG,
                          artifact_store=JsonlArtifactStore(path, identity=IDENTITY))
    data = path.read_bytes()
    assert data.endswith(b"\n")
    path.write_bytes(data[:-1])  # an editor stripped the final newline
    caplog.set_level(logging.WARNING, logger=LOGGER)
    again = FakeStrategy()
    batch = await process_prompts(
        again, [*prompts, ("id-3", "p3")], config=CONFIG,
        artifact_store=JsonlArtifactStore(path, identity=IDENTITY), resume=SUCCESSES,
    )
    assert [prompt for prompt, _ in again.calls] == ["p3"]  # the kept record was not paid again
    assert sorted(r.item_id for r in batch.results if r.replayed) == ["id-0", "id-1", "id-2"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 6  # header, 4 records, and the missing newline was written
    ids = [strict_loads(line)["item_id"] for line in lines[1:-1]]
    assert sorted(ids[:3]) == ["id-0", "id-1", "id-2"] and ids[3] == "id-3"


async def test_rel2_readers_see_a_complete_last_record_without_newline(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    await fill(path, 2)
    path.write_bytes(path.read_bytes()[:-1])
    before = path.read_bytes()
    reader = JsonlArtifactStore(path, identity=IDENTITY)
    assert [r.item_id for r in reader.iter_results()] == ["item-0", "item-1"]
    assert path.read_bytes() == before
    async with JsonlArtifactStore(path, identity=IDENTITY) as store:
        assert await store.count_records() == 2
        assert sorted(await store.load()) == ["item-0", "item-1"]
    assert path.read_bytes() == before  # nothing appended: nothing to repair


async def test_rel2_only_a_truly_incomplete_tail_is_cut_and_the_warning_says_what(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "a.jsonl"
    await fill(path, 3)
    intact = path.read_bytes()
    torn = b'{"kind":"result","item_id":"item-3","finger'
    path.write_bytes(intact + torn)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    async with JsonlArtifactStore(path, identity=IDENTITY) as store:
        assert sorted(await store.load()) == ["item-0", "item-1", "item-2"]
    assert path.read_bytes() == intact
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    message = warnings[0]
    assert str(path) in message
    assert f"{len(torn)} bytes" in message
    assert "line 5" in message  # header + 3 records, then the torn one
    assert '{"kind":"result","item_id":"item-3"' in message  # a short preview of what was cut
    assert "incomplete" in message


@pytest.mark.parametrize("tail", [b'{"kind":"result"}', b"hand-written note", b'{"a":1'])
async def test_rel2_a_last_line_that_is_not_a_record_of_ours_is_refused_not_cut(
    tmp_path: Path, tail: bytes
) -> None:
    path = tmp_path / "a.jsonl"
    await fill(path, 2)
    content = path.read_bytes() + tail
    path.write_bytes(content)
    store = JsonlArtifactStore(path, identity=IDENTITY)
    with pytest.raises(ArtifactStoreError, match="line 4"):
        await store.open()
    await store.aclose()
    assert path.read_bytes() == content


# --- rel10: a replay is the original, or the output is refused before it is published ---------

PLAIN = {
    "text": "日本語 ✓",
    "nested": {"list": [1, 2.5, -0.0, True, False, None, "x", [], {}], "big": 2**70, "neg": -3},
    "empty": "",
}


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (1 == 1.0 == True are not the same here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return math.copysign(1.0, a) == math.copysign(1.0, b) and a == b
    return bool(a == b)


async def test_rel10_plain_json_outputs_round_trip_exactly(stores: Stores) -> None:
    outputs: dict[str, Any] = {"p0": PLAIN, "p1": [PLAIN, 1.0, 1], "p2": 7, "p3": 0.1, "p4": "s"}
    prompts = [(f"id-{p}", p) for p in outputs]
    fake = FakeStrategy(script={p: [o] for p, o in outputs.items()})
    first = await process_prompts(fake, prompts, config=CONFIG, artifact_store=stores())
    assert first.failed == 0
    idle = FakeStrategy()
    second = await process_prompts(idle, prompts, config=CONFIG, artifact_store=stores(), resume=SUCCESSES)
    assert idle.calls == []
    for r in second.results:
        assert r.replayed
        assert _same(r.output, outputs[r.item_id[3:]]), (r.item_id, r.output)


NOT_JSON: dict[str, tuple[Any, str]] = {
    "tuple": ((1, 2), "tuple"),
    "set": ({1, 2}, "set"),
    "int-keys": ({1: "x"}, "key 1"),
    "datetime": ({"when": datetime.datetime(2024, 5, 1, 12, 0)}, "datetime"),
    "nested-tuple": ([1, {"a": (2,)}], "tuple"),
}


async def test_rel10_an_output_that_cannot_round_trip_is_refused_before_publish(stores: Stores) -> None:
    prompts = [(f"id-{name}", name) for name in NOT_JSON] + [("id-ok", "ok")]
    fake = FakeStrategy(script={name: [value] for name, (value, _) in NOT_JSON.items()})
    async with process_stream(fake, prompts, config=CONFIG, artifact_store=stores()) as results:
        published = {r.item_id: r async for r in results}
    assert set(published) == {item_id for item_id, _ in prompts}  # the batch went on
    assert published["id-ok"].success and published["id-ok"].output == "echo: ok"
    for name, (_, type_word) in NOT_JSON.items():
        r = published[f"id-{name}"]
        assert not r.success, name
        assert r.output is None
        assert r.error_category is ErrorCategory.PARSE
        assert r.error is not None and type_word in r.error and "output_encoder" in r.error, r.error
        assert r.token_usage.get("total_tokens"), "what the call cost is kept"
    # What was stored is what was published: the refusal, not a lossy copy of the output.
    stored = {r.item_id: r for r in await stores.history()}
    assert {k: v.success for k, v in stored.items()} == {k: v.success for k, v in published.items()}
    # A resume runs the refused items again, whatever the policy (the store may have been fixed).
    rerun = FakeStrategy()
    await process_prompts(rerun, prompts, config=CONFIG, artifact_store=stores(), resume=ALL)
    assert sorted(p for p, _ in rerun.calls) == sorted(NOT_JSON)


def _encode(value: Any) -> Any:
    if isinstance(value, tuple):
        return {"$tuple": [_encode(v) for v in value]}
    if isinstance(value, (set, frozenset)):
        return {"$set": sorted(_encode(v) for v in value)}
    if isinstance(value, datetime.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {"$dict": {k: _encode(v) for k, v in value.items()}}
        return {"$items": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        ((tag, inner),) = value.items()
        if tag == "$tuple":
            return tuple(_decode(v) for v in inner)
        if tag == "$set":
            return {_decode(v) for v in inner}
        if tag == "$datetime":
            return datetime.datetime.fromisoformat(inner)
        if tag == "$dict":
            return {k: _decode(v) for k, v in inner.items()}
        return {_decode(k): _decode(v) for k, v in inner}
    return value


async def test_rel10_encoder_and_decoder_make_any_output_round_trip(stores: Stores) -> None:
    codec = {"output_encoder": _encode, "output_decoder": _decode}
    prompts = [(f"id-{name}", name) for name in NOT_JSON] + [("id-ok", "ok")]
    fake = FakeStrategy(script={name: [value] for name, (value, _) in NOT_JSON.items()})
    first = await process_prompts(fake, prompts, config=CONFIG, artifact_store=stores(**codec))
    assert first.failed == 0
    idle = FakeStrategy()
    second = await process_prompts(idle, prompts, config=CONFIG, artifact_store=stores(**codec),
                                   resume=SUCCESSES)
    assert idle.calls == []
    replayed = second.by_id()
    for name, (value, _) in NOT_JSON.items():
        assert replayed[f"id-{name}"].replayed
        assert _same(replayed[f"id-{name}"].output, value), name
    assert replayed["id-ok"].output == "echo: ok"
    # Offline readers decode the same way.
    offline = {r.item_id: r.output for r in await stores.history(**codec)}
    assert _same(offline["id-tuple"], (1, 2))


async def test_rel10_an_encoder_that_returns_no_json_refuses_the_item(stores: Stores) -> None:
    store = stores(output_encoder=lambda value: value, output_decoder=lambda value: value)
    fake = FakeStrategy(script={"t": [(1, 2)]})
    batch = await process_prompts(fake, [("a", "t"), ("b", "ok")], config=CONFIG, artifact_store=store)
    by_id = batch.by_id()
    assert by_id["b"].success
    assert not by_id["a"].success and "output_encoder" in str(by_id["a"].error)


async def test_rel10_a_failing_decoder_is_reported_at_open_naming_the_item(stores: Stores) -> None:
    async with stores() as store:
        await store.append(success("a", {"v": 1}), fingerprint=fingerprint("p", None))

    def broken(value: Any) -> Any:
        raise KeyError("no tag")

    fake = FakeStrategy()
    with pytest.raises(ArtifactStoreError, match="output_decoder") as info:
        await process_prompts(fake, [("a", "p")], config=CONFIG, resume=SUCCESSES,
                              artifact_store=stores(output_encoder=_encode, output_decoder=broken))
    assert "'a'" in str(info.value) and str(stores.path) in str(info.value)
    assert fake.calls == []


def test_rel10_encoder_and_decoder_are_checked_at_construction(tmp_path: Path) -> None:
    for cls in (JsonlArtifactStore, SqliteArtifactStore):
        with pytest.raises(ConfigurationError, match="output_decoder"):
            cls(tmp_path / "x", identity=IDENTITY, output_encoder=_encode)
        with pytest.raises(ConfigurationError, match="output_encoder"):
            cls(tmp_path / "x", identity=IDENTITY, output_decoder=_decode)
        with pytest.raises(ConfigurationError, match="output_encoder"):
            cls(tmp_path / "x", identity=IDENTITY, output_encoder=5, output_decoder=_decode)  # type: ignore[arg-type]


# --- rel11: ids no store can hold are refused before any call ---------------------------------

BAD_ID = "bad-\ud800"


@pytest.mark.parametrize("kind", ["jsonl", "sqlite", "none"])
async def test_rel11_lone_surrogate_item_id_is_refused_before_any_call(tmp_path: Path, kind: str) -> None:
    store = None if kind == "none" else Stores(kind, tmp_path / f"run.{kind}")()
    fake = FakeStrategy()
    with pytest.raises(ValueError, match=repr(BAD_ID).replace("\\", "\\\\")) as info:
        await process_prompts(fake, [("ok", "p1"), (BAD_ID, "p2")], config=CONFIG, artifact_store=store)
    assert "prompts[1]" in str(info.value)
    assert fake.calls == []
    if store is not None:
        assert not store.path.exists() or await Stores(kind, store.path).history() == []


async def test_rel11_add_work_refuses_a_lone_surrogate_id_before_any_call(stores: Stores) -> None:
    fake = FakeStrategy()
    async with ParallelBatchProcessor(CONFIG, artifact_store=stores()) as proc:
        with pytest.raises(ValueError, match="lone surrogate"):
            await proc.add_work(LLMWorkItem(BAD_ID, fake, "p"))
        await proc.add_work(LLMWorkItem("ok", fake, "p"))
        batch = await proc.process_all()
    assert [r.item_id for r in batch.results] == ["ok"] and batch.succeeded == 1
    assert [p for p, _ in fake.calls] == ["p"]


async def test_rel11_every_store_refuses_the_same_ids_in_append(stores: Stores) -> None:
    async with stores() as store:
        with pytest.raises(ArtifactStoreError, match="lone surrogate"):
            await store.append(success(BAD_ID), fingerprint="f")
        await store.append(success("fine"), fingerprint="f")  # the store stays usable
        assert list(await store.load()) == ["fine"]


def test_rel11_cli_refuses_a_lone_surrogate_id_naming_line_and_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "prompt": "one"}\n{"id": "b\\ud800", "prompt": "two"}\n')
    out = tmp_path / "out.jsonl"
    code, output = run_cli(capsys, *cli_args(source, out, "asyncio"))
    assert code == 2, output
    assert 'line 2, field "id"' in output and "lone surrogate" in output
    assert not out.exists()


# --- rel7 (NaN part): strict JSON in every file written ---------------------------------------

NAN_CONTEXT = {"score": math.nan, "limits": [math.inf, -math.inf]}


def _strict_lines(path: Path) -> list[Any]:
    return [strict_loads(line) for line in path.read_bytes().splitlines()]


def _strict_sqlite_results(path: Path) -> list[Any]:
    conn = sqlite3.connect(path)
    try:
        return [strict_loads(row[0]) for row in conn.execute("SELECT result FROM results ORDER BY seq")]
    finally:
        conn.close()


async def test_rel7_nan_output_is_refused_item_locally(stores: Stores) -> None:
    fake = FakeStrategy(script={"nan": [{"x": math.nan}], "inf": [[math.inf]]})
    batch = await process_prompts(fake, [("a", "nan"), ("b", "inf"), ("c", "ok")], config=CONFIG,
                                  artifact_store=stores())
    by_id = batch.by_id()
    assert by_id["c"].success
    for item_id in ("a", "b"):
        assert not by_id[item_id].success
        assert by_id[item_id].error_category is ErrorCategory.PARSE
        assert "finite" in str(by_id[item_id].error)
    if stores.kind == "jsonl":
        assert len(_strict_lines(stores.path)) == 4
    else:
        assert len(await anyio.to_thread.run_sync(_strict_sqlite_results, stores.path)) == 3


async def test_rel7_nan_in_context_and_metadata_is_stored_as_strict_json(stores: Stores) -> None:
    result = WorkItemResult(item_id="a", success=True, output="ok", context=NAN_CONTEXT,
                            metadata={"ratio": math.inf, "fine": 1})
    async with stores() as store:
        await store.append(result, fingerprint=fingerprint("p", NAN_CONTEXT))
    if stores.kind == "jsonl":
        stored = _strict_lines(stores.path)[1]["result"]
    else:
        stored = (await anyio.to_thread.run_sync(_strict_sqlite_results, stores.path))[0]
    assert stored["output"] == "ok"
    assert stored["metadata"]["fine"] == 1
    assert "nan" in stored["context"]  # an audit copy that JSON cannot hold is kept as its repr
    assert "inf" in stored["metadata"]["ratio"]


async def test_rel7_nan_fingerprints_still_match_on_resume(stores: Stores) -> None:
    prompts = [("a", "p", NAN_CONTEXT)]
    await process_prompts(FakeStrategy(), prompts, config=CONFIG, artifact_store=stores())
    idle = FakeStrategy()
    batch = await process_prompts(idle, prompts, config=CONFIG, artifact_store=stores(), resume=SUCCESSES)
    assert idle.calls == [] and batch.results[0].replayed


def test_rel7_nan_batch_result_exports_are_strict_json(tmp_path: Path) -> None:
    batch = BatchResult.from_results([
        WorkItemResult(item_id="a", success=True, output="ok", context=NAN_CONTEXT,
                       metadata={"ratio": math.nan}),
    ])
    data = strict_loads(batch.to_json())
    assert "nan" in data["results"][0]["context"]
    batch.to_jsonl(tmp_path / "out.jsonl")
    assert len(_strict_lines(tmp_path / "out.jsonl")) == 1
    bad = BatchResult.from_results([WorkItemResult(item_id="b", success=True, output={"x": math.nan})])
    with pytest.raises(ValueError, match="'b'"):
        bad.to_json()
    with pytest.raises(ValueError, match="'b'"):
        bad.to_jsonl(tmp_path / "bad.jsonl")
    assert not (tmp_path / "bad.jsonl").exists()


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_rel7_nan_in_cli_input_is_refused_naming_line_and_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, literal: str
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "prompt": "one"}\n'
                      f'{{"id": "b", "prompt": "two", "context": {{"v": [1, {literal}]}}}}\n')
    out = tmp_path / "out.jsonl"
    code, output = run_cli(capsys, *cli_args(source, out, "asyncio"))
    assert code == 2, output
    assert 'line 2, field "context"' in output and literal in output
    assert not out.exists()


async def test_a_checkpoint_of_a_newer_format_version_is_refused_by_both_stores(tmp_path: Path) -> None:
    # One rule for both formats (``_artifacts._protocol.check_format_version``).
    jsonl, db = tmp_path / "c.jsonl", tmp_path / "c.sqlite"
    for store in (JsonlArtifactStore(jsonl, identity=IDENTITY), SqliteArtifactStore(db, identity=IDENTITY)):
        async with store:
            await store.append(success("a"), fingerprint="f")
    jsonl.write_text(jsonl.read_text().replace('"version":1,', '"version":99,', 1))
    conn = sqlite3.connect(db)
    try:
        (value,) = conn.execute("SELECT value FROM meta WHERE key = 'header'").fetchone()
        newer = value.replace('"version": 1', '"version": 99').replace('"version":1', '"version":99')
        assert newer != value
        conn.execute("UPDATE meta SET value = ? WHERE key = 'header'", (newer,))
        conn.commit()
    finally:
        conn.close()
    for store in (JsonlArtifactStore(jsonl, identity=IDENTITY), SqliteArtifactStore(db, identity=IDENTITY)):
        with pytest.raises(ArtifactStoreError, match="format version 99 is newer than this library reads"):
            async with store:
                pass
