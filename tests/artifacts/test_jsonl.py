"""The JSONL store, the contract both stores share, and group commit under cancellation.

Contract tests take a ``kind`` parameter and run against both stores (the
SQLite-only checks live in test_artifacts_sqlite.py). Interleavings are made
deterministic with gated thread-side writes (``threading.Event`` per write),
``wait_all_tasks_blocked`` and a spy on which appender leads; no test sleeps.
"""

from __future__ import annotations

import errno
import json
import logging
import sqlite3
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_batch_llm import (
    ArtifactEncodeError,
    ArtifactIdentity,
    ArtifactMismatchError,
    ArtifactStoreError,
    ErrorCategory,
    WorkItemResult,
)
from trio_batch_llm._artifacts import (
    ArtifactStore,
    JsonlArtifactStore,
    SqliteArtifactStore,
    _jsonl,
    fingerprint,
)
from trio_batch_llm._artifacts._group_commit import CommitStatistics, GroupCommitter
from trio_batch_llm._backends._worker_gate import WorkerGate

pytestmark = pytest.mark.anyio

IDENTITY = ArtifactIdentity(provider="fake", model="m-1", prompt_version="v1")
OTHER_IDENTITY = ArtifactIdentity(provider="fake", model="m-2")
Store = JsonlArtifactStore | SqliteArtifactStore


def result(i: int, *, success: bool = True, output: Any = None) -> WorkItemResult[Any]:
    if success:
        return WorkItemResult(
            item_id=f"item-{i}", success=True, output=output if output is not None else f"answer {i}",
            attempts=1, token_usage={"input_tokens": 3, "output_tokens": 4, "total_tokens": 7},
            context={"row": i}, metadata={"model": "m-1"},
        )
    return WorkItemResult(
        item_id=f"item-{i}", success=False, error="bad request", attempts=1,
        error_category=ErrorCategory.INVALID_REQUEST,
    )


def fp(i: int) -> str:
    return fingerprint(f"prompt {i}", {"row": i})


def make_store(kind: str, path: Path, **kwargs: Any) -> Store:
    kwargs.setdefault("identity", IDENTITY)
    if kind == "jsonl":
        return JsonlArtifactStore(path / "run.jsonl", **kwargs)
    return SqliteArtifactStore(path / "run.sqlite", **kwargs)


@pytest.fixture(params=["jsonl", "sqlite"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def read_ids_independently(store: Store) -> list[str]:
    """Read the stored item ids through a separate handle (blocking; run in a thread)."""
    if isinstance(store, JsonlArtifactStore):
        # Other appends may be mid-write: only complete lines count.
        lines = store.path.read_bytes().split(b"\n")
        return [json.loads(line)["item_id"] for line in lines[1:-1]]
    conn = sqlite3.connect(store.path)
    try:
        return [row[0] for row in conn.execute("SELECT item_id FROM results ORDER BY seq")]
    finally:
        conn.close()


class GatedWrites:
    """Wraps a store's thread-side write: write k waits for ``gates[k]``; records each batch."""

    def __init__(self, write: Callable[[Sequence[Any]], None], count: int = 8) -> None:
        self._write = write
        self.batches: list[int] = []
        self.entered = [threading.Event() for _ in range(count)]
        self.gates = [threading.Event() for _ in range(count)]

    def __call__(self, items: Sequence[Any]) -> None:
        k = len(self.batches)
        self.batches.append(len(items))
        self.entered[k].set()
        assert self.gates[k].wait(timeout=30)
        self._write(items)

    async def wait_entered(self, k: int) -> None:
        await anyio.to_thread.run_sync(self.entered[k].wait)


# -- the contract, on both stores -------------------------------------------------


async def test_round_trip(kind: str, tmp_path: Path) -> None:
    async with make_store(kind, tmp_path) as store:
        assert isinstance(store, ArtifactStore)
        for i in range(5):
            await store.append(result(i, success=i % 2 == 0), fingerprint=fp(i), prompt=f"prompt {i}")
        assert await store.count_records() == 5
        loaded = await store.load()
    assert sorted(loaded) == [f"item-{i}" for i in range(5)]
    for i in range(5):
        record = loaded[f"item-{i}"]
        assert record.fingerprint == fp(i)
        assert record.identity_matches
        assert record.prompt is None  # not stored by default
        assert record.success is (i % 2 == 0)
        replayed = record.to_result()
        assert replayed.replayed
        assert replayed.to_dict() == result(i, success=i % 2 == 0).to_dict()


async def test_reopen_loads_previous_run(kind: str, tmp_path: Path) -> None:
    async with make_store(kind, tmp_path) as store:
        await store.append(result(1), fingerprint=fp(1))
    async with make_store(kind, tmp_path) as store:
        assert await store.count_records() == 1
        await store.append(result(2), fingerprint=fp(2))
        assert sorted(await store.load()) == ["item-1", "item-2"]


async def test_later_record_supersedes_earlier(kind: str, tmp_path: Path) -> None:
    async with make_store(kind, tmp_path) as store:
        await store.append(result(7, success=False), fingerprint=fp(7))
        await store.append(result(7, output="second try"), fingerprint=fp(7))
        loaded = await store.load()
        assert await store.count_records() == 2
    assert loaded["item-7"].success
    assert loaded["item-7"].result["output"] == "second try"
    history = list(store.iter_results())
    assert [(r.item_id, r.success) for r in history] == [("item-7", False), ("item-7", True)]


async def test_prompts_stored_only_when_asked(kind: str, tmp_path: Path) -> None:
    secret = "SECRET-PROMPT-0451"

    def file_bytes(directory: Path) -> bytes:
        return b"".join(p.read_bytes() for p in sorted(directory.iterdir()))

    plain = tmp_path / "plain"
    plain.mkdir()
    async with make_store(kind, plain) as store:
        await store.append(result(1), fingerprint=fp(1), prompt=secret)
    assert secret.encode() not in await anyio.to_thread.run_sync(file_bytes, plain)

    keeping = tmp_path / "keeping"
    keeping.mkdir()
    async with make_store(kind, keeping, store_prompts=True) as store:
        await store.append(result(1), fingerprint=fp(1), prompt=secret)
        assert (await store.load())["item-1"].prompt == secret


async def test_append_is_durable_before_it_returns(kind: str, tmp_path: Path) -> None:
    seen_after_return: dict[str, bool] = {}
    async with make_store(kind, tmp_path) as store:

        async def append_then_read(i: int) -> None:
            await store.append(result(i), fingerprint=fp(i))
            ids = await anyio.to_thread.run_sync(read_ids_independently, store)
            seen_after_return[f"item-{i}"] = f"item-{i}" in ids

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(append_then_read, i)
    assert seen_after_return == {f"item-{i}": True for i in range(20)}


async def test_concurrent_appends_are_group_committed(kind: str, tmp_path: Path) -> None:
    async with make_store(kind, tmp_path) as store:
        async with anyio.create_task_group() as tg:
            for i in range(200):
                tg.start_soon(lambda i=i: store.append(result(i), fingerprint=fp(i)))
        stats = store.statistics()
        loaded = await store.load()
    assert len(loaded) == 200
    assert sorted(await anyio.to_thread.run_sync(read_ids_independently, store)) == sorted(loaded)
    assert stats.records_written == 200
    assert 1 <= stats.write_batches < 200  # batched, not one write per record
    assert (stats.pending, stats.in_flight) == (0, 0)


async def test_cancelled_appenders_mid_batch_leave_a_loadable_store(kind: str, tmp_path: Path) -> None:
    store = make_store(kind, tmp_path)
    gated = GatedWrites(store._write_sync)
    store._write_sync = gated  # type: ignore[method-assign]
    outcome: dict[int, str] = {}
    scopes = {i: anyio.CancelScope() for i in range(12)}

    async def appender(i: int) -> None:
        with scopes[i]:
            try:
                await store.append(result(i), fingerprint=fp(i))
            except anyio.get_cancelled_exc_class():
                outcome[i] = "cancelled"
                raise
            outcome[i] = "ok"

    await store.open()
    async with anyio.create_task_group() as tg:
        tg.start_soon(appender, 0)  # leads write 0, held at the gate
        await gated.wait_entered(0)
        for i in range(1, 10):
            tg.start_soon(appender, i)
        await anyio.wait_all_tasks_blocked()
        assert store.statistics().pending == 9
        for i in (0, 1, 2):  # the leader mid-write, two pending appenders
            scopes[i].cancel()
        await anyio.wait_all_tasks_blocked()
        assert outcome == {1: "cancelled", 2: "cancelled"}  # withdrawn; the leader waits for its thread
        assert store.statistics().pending == 7

        gated.gates[0].set()
        await gated.wait_entered(1)  # someone leads 3..9, held at gate 1
        await anyio.wait_all_tasks_blocked()
        assert store.statistics().in_flight == 7
        for i in (5, 6, 7):  # records already handed to the thread
            scopes[i].cancel()
        tg.start_soon(appender, 10)
        tg.start_soon(appender, 11)
        await anyio.wait_all_tasks_blocked()
        scopes[11].cancel()  # still pending: withdrawn
        await anyio.wait_all_tasks_blocked()
        for gate in gated.gates[1:]:
            gate.set()

    written = sorted(int(k.split("-")[1]) for k in await store.load())
    await store.aclose()
    assert written == [0, 3, 4, 5, 6, 7, 8, 9, 10]
    assert gated.batches == [1, 7, 1]
    assert outcome[11] == "cancelled"
    assert all(outcome[i] == "ok" for i in (4, 8, 9, 10))
    # A cancelled appender whose record was handed over may still return (the
    # leader does, once its thread is done); either way its record is durable.
    assert all(outcome[i] in {"ok", "cancelled"} for i in (0, 3, 5, 6, 7))


async def test_aclose_with_appends_in_flight(kind: str, tmp_path: Path) -> None:
    store = make_store(kind, tmp_path)
    gated = GatedWrites(store._write_sync)
    store._write_sync = gated  # type: ignore[method-assign]
    outcome: dict[int, str] = {}

    async def appender(i: int) -> None:
        try:
            await store.append(result(i), fingerprint=fp(i))
        except ArtifactStoreError as exc:
            outcome[i] = str(exc)
        else:
            outcome[i] = "ok"

    await store.open()
    async with anyio.create_task_group() as tg:
        tg.start_soon(appender, 0)
        await gated.wait_entered(0)
        tg.start_soon(appender, 1)
        tg.start_soon(appender, 2)
        await anyio.wait_all_tasks_blocked()
        assert store.statistics().pending == 2
        tg.start_soon(store.aclose)  # waits for the write in flight, not for the pending ones
        await anyio.wait_all_tasks_blocked()
        assert store.statistics().state == "closing"
        with pytest.raises(ArtifactStoreError, match="closing"):
            await store.append(result(3), fingerprint=fp(3))
        for gate in gated.gates:
            gate.set()
    assert outcome[0] == "ok"
    assert "closed before 2 record(s) could be written" in outcome[1] == outcome[2]
    assert store.statistics().state == "closed"
    async with make_store(kind, tmp_path) as reopened:
        assert list(await reopened.load()) == ["item-0"]


async def test_exit_closes_even_when_cancelled(kind: str, tmp_path: Path) -> None:
    store = make_store(kind, tmp_path)
    with anyio.CancelScope() as scope:
        async with store:
            await store.append(result(1), fingerprint=fp(1))
            scope.cancel()
            await anyio.sleep_forever()
    assert scope.cancelled_caught
    assert store.statistics().state == "closed"
    async with make_store(kind, tmp_path) as again:  # the file lock was released
        assert list(await again.load()) == ["item-1"]


async def test_identity_mismatch_refused_unless_allowed(kind: str, tmp_path: Path) -> None:
    async with make_store(kind, tmp_path) as store:
        await store.append(result(1), fingerprint=fp(1))
    other = make_store(kind, tmp_path, identity=OTHER_IDENTITY)
    with pytest.raises(ArtifactMismatchError, match="m-1") as info:
        await other.open()
    assert str(other.path) in str(info.value)
    await other.aclose()

    async with make_store(kind, tmp_path, identity=OTHER_IDENTITY, allow_identity_mismatch=True) as store:
        await store.append(result(2), fingerprint=fp(2))
        loaded = await store.load()
    assert loaded["item-1"].identity_matches is False  # written under the other identity
    assert loaded["item-2"].identity_matches is True


async def test_lifecycle_errors_name_the_path(kind: str, tmp_path: Path) -> None:
    store = make_store(kind, tmp_path)
    with pytest.raises(ArtifactStoreError, match="open"):
        await store.append(result(1), fingerprint=fp(1))
    await store.open()
    with pytest.raises(ArtifactStoreError, match="new one per run"):
        await store.open()
    await store.aclose()
    await store.aclose()  # idempotent
    assert store.statistics().state == "closed"
    with pytest.raises(ArtifactStoreError, match=str(store.path)):
        await store.append(result(1), fingerprint=fp(1))
    with pytest.raises(ArtifactStoreError):
        await store.load()


async def test_unencodable_output_is_refused_and_the_store_stays_usable(kind: str, tmp_path: Path) -> None:
    async with make_store(kind, tmp_path) as store:
        with pytest.raises(ArtifactEncodeError, match="item-1") as info:
            await store.append(result(1, output=object()), fingerprint=fp(1))
        assert isinstance(info.value.__cause__, ValueError)
        assert "of type object" in str(info.value)
        await store.append(result(2), fingerprint=fp(2))
        assert sorted(await store.load()) == ["item-2"]


async def test_awkward_values_round_trip(kind: str, tmp_path: Path) -> None:
    weird = WorkItemResult(
        item_id="ünïcødé-\ud800", success=True, output={"text": "日本語 \ud83d", "n": [1, 2.5]},
        context=object(), metadata={"raw": object(), "ok": {1, 2}},
    )
    async with make_store(kind, tmp_path) as store:
        # No store can hold a lone surrogate in an item id (the engine refuses it at input).
        with pytest.raises(ArtifactEncodeError, match="lone surrogate"):
            await store.append(weird, fingerprint="f")
        weird.item_id = "ünïcødé"
        await store.append(weird, fingerprint="f")
        record = (await store.load())[weird.item_id]
    assert record.result["output"] == {"text": "日本語 \ud83d", "n": [1, 2.5]}
    assert record.result["context"].startswith("<object object")  # audit copy: repr
    assert record.result["metadata"]["ok"] == [1, 2]


async def test_blocking_io_never_runs_on_the_event_loop(kind: str, tmp_path: Path) -> None:
    loop_thread = threading.get_ident()
    threads: list[tuple[str, int]] = []
    store = make_store(kind, tmp_path)
    for name in ("_open_sync", "_load_sync", "_count_sync", "_write_sync", "_close_sync"):
        original = getattr(store, name)

        def spy(*args: Any, _name: str = name, _original: Any = original) -> Any:
            threads.append((_name, threading.get_ident()))
            return _original(*args)

        setattr(store, name, spy)
    async with store:
        async with anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(lambda i=i: store.append(result(i), fingerprint=fp(i)))
        await store.load()
        await store.count_records()
    assert {name for name, _ in threads} == {
        "_open_sync", "_load_sync", "_count_sync", "_write_sync", "_close_sync"
    }
    assert all(ident != loop_thread for _, ident in threads)


async def test_iter_results_reads_offline(kind: str, tmp_path: Path) -> None:
    async with make_store(kind, tmp_path) as store:
        for i in range(3):
            await store.append(result(i), fingerprint=fp(i))
    reader = make_store(kind, tmp_path, identity=OTHER_IDENTITY)  # offline reading ignores identity
    results = await anyio.to_thread.run_sync(lambda: list(reader.iter_results()))
    assert [r.item_id for r in results] == ["item-0", "item-1", "item-2"]
    assert all(not r.replayed and r.success for r in results)
    assert results[1].output == "answer 1"


# -- JSONL specifics -------------------------------------------------------------------


def write_lines(path: Path, *extra: bytes) -> None:
    with path.open("ab") as f:
        for chunk in extra:
            f.write(chunk)


async def fill(path: Path, n: int, **kwargs: Any) -> JsonlArtifactStore:
    store = JsonlArtifactStore(path, identity=IDENTITY, **kwargs)
    async with store:
        for i in range(n):
            await store.append(result(i), fingerprint=fp(i))
    return store


async def test_header_records_format_and_identity(tmp_path: Path) -> None:
    store = await fill(tmp_path / "a.jsonl", 1)
    header = json.loads(store.path.read_bytes().split(b"\n")[0])
    assert header["kind"] == "header"
    assert (header["format"], header["version"]) == ("trio-batch-llm-artifacts", 1)
    assert header["identity"] == IDENTITY.to_dict()


async def test_torn_tail_is_truncated_on_open(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "a.jsonl"
    await fill(path, 3)
    intact = path.stat().st_size
    write_lines(path, b'{"kind":"result","item_id":"item-3","finger')
    caplog.set_level(logging.WARNING, logger="trio_batch_llm.artifacts")
    async with JsonlArtifactStore(path, identity=IDENTITY) as store:
        assert path.stat().st_size == intact
        assert sorted(await store.load()) == ["item-0", "item-1", "item-2"]
        await store.append(result(3), fingerprint=fp(3))
        assert sorted(await store.load()) == ["item-0", "item-1", "item-2", "item-3"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "torn" in warnings[0]
    assert str(path) in warnings[0]


async def test_torn_header_starts_afresh(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"kind":"header","format":"trio-ba')
    async with JsonlArtifactStore(path, identity=IDENTITY) as store:
        assert await store.count_records() == 0
        await store.append(result(1), fingerprint=fp(1))
        assert list(await store.load()) == ["item-1"]


async def test_corrupt_middle_line_is_rejected_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    await fill(path, 4)
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2][:20] + b"#garbage#" + lines[2][20:]  # line 3 of the file
    path.write_bytes(b"\n".join(lines))
    async with JsonlArtifactStore(path, identity=IDENTITY) as store:
        with pytest.raises(ArtifactStoreError, match="line 3 is corrupt") as info:
            await store.load()
    assert str(path) in str(info.value)
    reader = JsonlArtifactStore(path, identity=IDENTITY)
    with pytest.raises(ArtifactStoreError, match="line 3"):
        list(reader.iter_results())


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"hello\nworld\n", "is not a trio-batch-llm checkpoint"),
        (b'{"format":"trio-batch-llm-artifacts","version":99}\n', "not a trio-batch-llm checkpoint"),
        (b'{"kind":"header","format":"trio-batch-llm-artifacts","version":99,"identity":{}}\n', "newer"),
    ],
)
async def test_foreign_files_are_refused(tmp_path: Path, content: bytes, match: str) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(content)
    store = JsonlArtifactStore(path, identity=IDENTITY)
    with pytest.raises(ArtifactStoreError, match=match):
        await store.open()
    await store.aclose()
    assert path.read_bytes() == content  # refused without touching it


async def test_iter_results_ignores_a_torn_tail_without_repairing(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    await fill(path, 2)
    write_lines(path, b'{"kind":"res')
    before = path.read_bytes()
    reader = JsonlArtifactStore(path, identity=IDENTITY)
    assert [r.item_id for r in reader.iter_results()] == ["item-0", "item-1"]
    assert path.read_bytes() == before


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX advisory locks")
async def test_second_writer_on_the_same_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    async with JsonlArtifactStore(path, identity=IDENTITY):
        second = JsonlArtifactStore(path, identity=IDENTITY)
        with pytest.raises(ArtifactStoreError, match="already open for writing"):
            await second.open()
        await second.aclose()
    async with JsonlArtifactStore(path, identity=IDENTITY):
        pass  # released on close


async def test_failed_write_is_undone_and_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a.jsonl"
    real_write_all = _jsonl._write_all

    def half_then_enospc(fd: int, data: bytes) -> None:
        real_write_all(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    async with JsonlArtifactStore(path, identity=IDENTITY) as store:
        await store.append(result(1), fingerprint=fp(1))
        monkeypatch.setattr(_jsonl, "_write_all", half_then_enospc)
        with pytest.raises(ArtifactStoreError, match="No space left") as info:
            await store.append(result(2), fingerprint=fp(2))
        assert isinstance(info.value.__cause__, OSError)
        assert str(path) in str(info.value)
        monkeypatch.setattr(_jsonl, "_write_all", real_write_all)
        await store.append(result(3), fingerprint=fp(3))
        assert sorted(await store.load()) == ["item-1", "item-3"]
    assert path.read_bytes().endswith(b"\n")


async def test_fsync_once_per_batch_before_returning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    syncs: list[int] = []
    real = _jsonl._datasync
    monkeypatch.setattr(_jsonl, "_datasync", lambda fd: (syncs.append(fd), real(fd)))
    async with JsonlArtifactStore(tmp_path / "a.jsonl", identity=IDENTITY, fsync=True) as store:
        after_header = len(syncs)
        assert after_header == 1
        synced_on_return: list[bool] = []

        async def append(i: int) -> None:
            await store.append(result(i), fingerprint=fp(i))
            synced_on_return.append(len(syncs) > after_header)

        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(append, i)
        batches = store.statistics().write_batches
    assert all(synced_on_return)
    assert len(syncs) - after_header - 1 == batches < 50  # one per batch, plus one at close


def _truncated_copy(source: bytes, cut: int, directory: str) -> Path:
    path = Path(directory) / "a.jsonl"
    path.write_bytes(source[:cut])
    return path


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
async def test_any_truncation_opens_to_the_complete_prefix(tmp_path: Path, data: st.DataObject) -> None:
    source_path = tmp_path / "source.jsonl"
    if not source_path.exists():
        await fill(source_path, 5)
    source = source_path.read_bytes()
    header_end = source.index(b"\n") + 1
    cut = data.draw(st.integers(min_value=header_end, max_value=len(source)))
    complete = source[:cut].count(b"\n") - 1
    if source[cut:cut + 1] == b"\n" and source[cut - 1:cut] != b"\n":
        complete += 1  # the cut took only a newline: that last record is whole and kept
    with tempfile.TemporaryDirectory() as directory:
        path = _truncated_copy(source, cut, directory)
        async with JsonlArtifactStore(path, identity=IDENTITY) as store:
            assert sorted(await store.load()) == [f"item-{i}" for i in range(complete)]
            await store.append(result(99), fingerprint=fp(99))
            assert len(await store.load()) == complete + 1


# -- group commit: leadership hand-over ------------------------------------------------


class FakeWriter:
    """A thread-side writer whose k-th write waits for gate k; checks writes never overlap."""

    def __init__(self) -> None:
        self.writes: list[list[str]] = []
        self.entered = [threading.Event() for _ in range(6)]
        self.gates = [threading.Event() for _ in range(6)]
        self._active = 0
        self.max_active = 0
        self._lock = threading.Lock()
        self.fail_with: dict[int, Exception] = {}

    def __call__(self, items: Sequence[str]) -> None:
        with self._lock:
            k = len(self.writes)
            self.writes.append(list(items))
            self._active += 1
            self.max_active = max(self.max_active, self._active)
        self.entered[k].set()
        try:
            assert self.gates[k].wait(timeout=30)
            if k in self.fail_with:
                raise self.fail_with[k]
        finally:
            with self._lock:
                self._active -= 1


def committer_for(writer: FakeWriter) -> tuple[GroupCommitter[str], list[str], WorkerGate]:
    gate = WorkerGate()
    committer = GroupCommitter(
        writer, gate=gate, wrap_error=lambda exc: ArtifactStoreError(f"batch failed: {exc}"),
    )
    leaders: list[str] = []
    lead = committer._lead

    async def spy() -> None:
        leaders.append(anyio.get_current_task().name)
        await lead()

    committer._lead = spy  # type: ignore[method-assign]
    return committer, leaders, gate


class GateHolder:
    """Another blocking call of the store (a load, say) that holds its worker gate until released."""

    def __init__(self) -> None:
        self.holding = threading.Event()
        self.release = threading.Event()

    def __call__(self) -> None:
        self.holding.set()
        assert self.release.wait(timeout=30)


async def test_leader_cancelled_before_its_thread_hands_the_batch_back() -> None:
    writer = FakeWriter()
    committer, leaders, gate = committer_for(writer)
    scopes = {name: anyio.CancelScope() for name in "XABC"}
    outcome: dict[str, str] = {}
    holder = GateHolder()

    async def appender(name: str) -> None:
        with scopes[name]:
            try:
                await committer.submit(name)
            except anyio.get_cancelled_exc_class():
                outcome[name] = "cancelled"
                raise
            outcome[name] = "ok"

    async def hold_gate() -> None:
        await gate.run(holder)

    async with anyio.create_task_group() as tg:
        tg.start_soon(appender, "X", name="X")
        await anyio.to_thread.run_sync(writer.entered[0].wait)
        for name in "ABC":
            tg.start_soon(appender, name, name=name)
        tg.start_soon(hold_gate)  # queues behind X's write for the gate
        await anyio.wait_all_tasks_blocked()
        writer.gates[0].set()
        await anyio.to_thread.run_sync(holder.holding.wait)
        await anyio.wait_all_tasks_blocked()
        stats = committer.statistics()
        assert (stats.writing, stats.in_flight, stats.pending) == (True, 3, 0)
        leader = leaders[-1]  # took A, B and C; waits for the gate, no thread yet
        scopes[leader].cancel()
        await anyio.wait_all_tasks_blocked()
        assert outcome[leader] == "cancelled"
        stats = committer.statistics()
        assert (stats.writing, stats.in_flight) == (True, 2)  # the others took over
        for gate in writer.gates[1:]:
            gate.set()
        holder.release.set()

    survivors = sorted(set("ABC") - {leader})
    assert [sorted(batch) for batch in writer.writes] == [["X"], survivors]
    assert {name: outcome[name] for name in survivors} == dict.fromkeys(survivors, "ok")


async def test_cancelled_owners_of_a_handed_back_batch_are_dropped() -> None:
    writer = FakeWriter()
    committer, _leaders, gate = committer_for(writer)
    scopes = {name: anyio.CancelScope() for name in "XABCD"}
    holder = GateHolder()

    async def appender(name: str) -> None:
        with scopes[name]:
            await committer.submit(name)

    async def hold_gate() -> None:
        await gate.run(holder)

    async with anyio.create_task_group() as tg:
        tg.start_soon(appender, "X", name="X")
        await anyio.to_thread.run_sync(writer.entered[0].wait)
        for name in "ABC":
            tg.start_soon(appender, name, name=name)
        tg.start_soon(hold_gate)
        await anyio.wait_all_tasks_blocked()
        writer.gates[0].set()
        await anyio.to_thread.run_sync(holder.holding.wait)
        await anyio.wait_all_tasks_blocked()
        for name in "ABC":  # the leader and both records it took
            scopes[name].cancel()
        await anyio.wait_all_tasks_blocked()
        assert committer.statistics() == CommitStatistics(
            pending=0, in_flight=0, writing=False, batches_written=1, records_written=1, failed_batches=0
        )
        holder.release.set()
        for gate in writer.gates[1:]:
            gate.set()
        tg.start_soon(appender, "D", name="D")
    assert writer.writes == [["X"], ["D"]]


async def test_failed_batch_raises_a_fresh_error_in_each_appender() -> None:
    writer = FakeWriter()
    writer.fail_with[1] = OSError(errno.EIO, "I/O error")
    committer, _, _ = committer_for(writer)
    errors: dict[str, BaseException] = {}

    async def appender(name: str) -> None:
        try:
            await committer.submit(name)
        except ArtifactStoreError as exc:
            errors[name] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(appender, "X")
        await anyio.to_thread.run_sync(writer.entered[0].wait)
        tg.start_soon(appender, "A")
        tg.start_soon(appender, "B")
        await anyio.wait_all_tasks_blocked()
        for gate in writer.gates:
            gate.set()
    assert sorted(errors) == ["A", "B"]
    assert errors["A"] is not errors["B"]
    assert "I/O error" in str(errors["A"])
    assert committer.statistics().failed_batches == 1
    async with anyio.create_task_group() as tg:
        tg.start_soon(appender, "C")
    assert writer.writes[-1] == ["C"]
    assert "C" not in errors


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_native_cancel_of_a_writing_leader_orphans_and_settles_its_batch() -> None:
    import asyncio

    writer = FakeWriter()
    committer, leaders, _ = committer_for(writer)
    tasks: dict[str, asyncio.Task[Any]] = {}
    outcome: dict[str, str] = {}

    async def appender(name: str) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks[name] = task
        try:
            await committer.submit(name)
        except asyncio.CancelledError:
            outcome[name] = "cancelled"
            return  # the test's own native cancel: keep the task group alive
        outcome[name] = "ok"

    async with anyio.create_task_group() as tg:
        tg.start_soon(appender, "X", name="X")
        await anyio.to_thread.run_sync(writer.entered[0].wait)
        tg.start_soon(appender, "A", name="A")
        tg.start_soon(appender, "B", name="B")
        await anyio.wait_all_tasks_blocked()
        writer.gates[0].set()
        await anyio.to_thread.run_sync(writer.entered[1].wait)  # A+B being written
        await anyio.wait_all_tasks_blocked()
        leader = leaders[-1]
        other = "B" if leader == "A" else "A"
        tasks[leader].cancel()  # native: gets through anyio's shield while the thread writes
        await anyio.wait_all_tasks_blocked()
        assert outcome == {"X": "ok", leader: "cancelled"}
        assert other not in outcome  # still waiting for the orphaned write
        tg.start_soon(appender, "D", name="D")
        await anyio.wait_all_tasks_blocked()
        for gate in writer.gates[1:]:
            gate.set()
    assert outcome == {"X": "ok", leader: "cancelled", other: "ok", "D": "ok"}
    assert [sorted(batch) for batch in writer.writes] == [["X"], ["A", "B"], ["D"]]
    assert writer.max_active == 1  # never two writes at once
    assert committer.statistics().records_written == 4
