"""SQLite-only behaviour of SqliteArtifactStore (the shared contract runs in test_artifacts_jsonl.py)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

from trio_batch_llm import ArtifactIdentity, ArtifactStoreError, WorkItemResult
from trio_batch_llm._artifacts import SqliteArtifactStore, fingerprint
from trio_batch_llm._artifacts._sqlite_file import SqliteFile, classify_database

pytestmark = pytest.mark.anyio

IDENTITY = ArtifactIdentity(provider="fake", model="m-1")


def result(i: int) -> WorkItemResult[Any]:
    return WorkItemResult(item_id=f"item-{i}", success=True, output=f"answer {i}", attempts=1)


def fp(i: int) -> str:
    return fingerprint(f"prompt {i}", None)


def query(path: Path, sql: str) -> list[tuple[Any, ...]]:
    """Run ``sql`` on a separate connection (blocking; call through a thread)."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


async def independent(path: Path, sql: str) -> list[tuple[Any, ...]]:
    return await anyio.to_thread.run_sync(query, path, sql)


async def test_schema_wal_mode_and_item_index(tmp_path: Path) -> None:
    path = tmp_path / "run.sqlite"
    async with SqliteArtifactStore(path, identity=IDENTITY) as store:
        await store.append(result(1), fingerprint=fp(1))
        assert await independent(path, "PRAGMA journal_mode") == [("wal",)]
        rows = await independent(path, "SELECT item_id, fingerprint, success, error_category FROM results")
        assert rows == [("item-1", fp(1), 1, None)]
        indexes = await independent(path, "PRAGMA index_list(results)")
        assert any(row[1] == "results_by_item" for row in indexes)
        (header,) = await independent(path, "SELECT value FROM meta WHERE key = 'header'")
    assert json.loads(header[0])["identity"] == IDENTITY.to_dict()
    wal = Path(f"{path}-wal")
    assert await anyio.to_thread.run_sync(lambda: not wal.exists() or wal.stat().st_size == 0)  # checkpointed


async def test_one_transaction_per_group_commit_batch(tmp_path: Path) -> None:
    statements: list[str] = []
    async with SqliteArtifactStore(tmp_path / "run.sqlite", identity=IDENTITY) as store:
        conn = store._conn
        assert conn is not None
        conn.set_trace_callback(statements.append)  # called in the writer thread
        async with anyio.create_task_group() as tg:
            for i in range(100):
                tg.start_soon(lambda i=i: store.append(result(i), fingerprint=fp(i)))
        batches = store.statistics().write_batches
        conn.set_trace_callback(None)
        assert await store.count_records() == 100
    commits = [s for s in statements if s == "COMMIT"]
    assert len(commits) == batches < 100


@pytest.mark.parametrize(("fsync", "level"), [(False, 1), (True, 2)])  # NORMAL, FULL
async def test_fsync_selects_synchronous_full(tmp_path: Path, fsync: bool, level: int) -> None:
    async with SqliteArtifactStore(tmp_path / "run.sqlite", identity=IDENTITY, fsync=fsync) as store:
        conn, gate = store._conn, store._gate
        assert conn is not None and gate is not None
        got = await gate.run(lambda: conn.execute("PRAGMA synchronous").fetchone()[0])
    assert got == level


async def test_not_a_database_is_refused_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "run.sqlite"
    path.write_bytes(b"this is not sqlite, just text that is long enough to have a header" * 4)
    store = SqliteArtifactStore(path, identity=IDENTITY)
    with pytest.raises(ArtifactStoreError, match="opening failed") as info:
        await store.open()
    await store.aclose()
    assert str(path) in str(info.value)
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)


async def test_someone_elses_database_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite"
    await anyio.to_thread.run_sync(query, path, "CREATE TABLE customers (id INTEGER)")
    store = SqliteArtifactStore(path, identity=IDENTITY)
    with pytest.raises(ArtifactStoreError, match="not written by trio-batch-llm"):
        await store.open()
    await store.aclose()
    tables = await independent(path, "SELECT name FROM sqlite_master WHERE type = 'table'")
    assert tables == [("customers",)]


async def test_newer_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "run.sqlite"
    async with SqliteArtifactStore(path, identity=IDENTITY):
        pass
    header = {"format": "trio-batch-llm-artifacts", "version": 99, "identity": IDENTITY.to_dict()}
    sql = f"UPDATE meta SET value = '{json.dumps(header)}' WHERE key = 'header'"

    def update() -> None:
        conn = sqlite3.connect(path)
        with conn:
            conn.execute(sql)
        conn.close()

    await anyio.to_thread.run_sync(update)
    store = SqliteArtifactStore(path, identity=IDENTITY)
    with pytest.raises(ArtifactStoreError, match="newer"):
        await store.open()
    await store.aclose()


async def test_failed_commit_surfaces_with_the_sqlite_error_as_cause(tmp_path: Path) -> None:
    path = tmp_path / "run.sqlite"
    async with SqliteArtifactStore(path, identity=IDENTITY) as store:
        await store.append(result(1), fingerprint=fp(1))
        # Sabotage from outside: the next INSERT fails inside its transaction.
        await anyio.to_thread.run_sync(query, path, "DROP TABLE results")
        with pytest.raises(ArtifactStoreError, match=r"committing 1 record\(s\) failed") as info:
            await store.append(result(2), fingerprint=fp(2))
        assert isinstance(info.value.__cause__, sqlite3.Error)
        assert str(path) in str(info.value)
        assert store._conn is not None
        assert not store._conn.in_transaction  # rolled back, the connection is usable


async def test_corrupt_row_is_reported_with_its_row_id(tmp_path: Path) -> None:
    path = tmp_path / "run.sqlite"
    async with SqliteArtifactStore(path, identity=IDENTITY) as store:
        for i in range(3):
            await store.append(result(i), fingerprint=fp(i))

    def corrupt() -> None:
        conn = sqlite3.connect(path)
        with conn:
            conn.execute("UPDATE results SET result = '{torn' WHERE seq = 2")
        conn.close()

    await anyio.to_thread.run_sync(corrupt)
    async with SqliteArtifactStore(path, identity=IDENTITY) as store:
        with pytest.raises(ArtifactStoreError, match="row 2"):
            await store.load()


async def test_iter_results_needs_an_existing_database(tmp_path: Path) -> None:
    reader = SqliteArtifactStore(tmp_path / "missing.sqlite", identity=IDENTITY)
    with pytest.raises(ArtifactStoreError, match="no such artifact database"):
        list(reader.iter_results())
    assert not (tmp_path / "missing.sqlite").exists()


async def test_iter_results_while_the_writer_is_open(tmp_path: Path) -> None:
    path = tmp_path / "run.sqlite"
    async with SqliteArtifactStore(path, identity=IDENTITY) as store:
        await store.append(result(1), fingerprint=fp(1))
        reader = SqliteArtifactStore(path, identity=IDENTITY)
        seen = await anyio.to_thread.run_sync(lambda: [r.item_id for r in reader.iter_results()])
        assert seen == ["item-1"]
        await store.append(result(2), fingerprint=fp(2))


def test_a_file_created_by_another_process_while_it_is_classified_is_seen_in_one_state(
    tmp_path: Path,
) -> None:
    """The four reads of classify_database see one snapshot: another process's commit creating the
    file between them (seen in a six-process race) must not look like its tables without our
    application_id, which refused our own file as foreign."""
    path = tmp_path / "race.sqlite"
    setup = sqlite3.connect(path, isolation_level=None)
    setup.execute("PRAGMA journal_mode=WAL")  # as the first process leaves it before it creates
    setup.close()
    other = SqliteFile(path, busy_timeout=5.0)
    created: list[bool] = []

    def create_between_the_reads(statement: str) -> None:
        if statement.startswith("PRAGMA user_version") and not created:
            created.append(True)
            conn = other.connect()
            with other.transaction(conn):
                other.initialise(conn, IDENTITY)
            other.close(conn, fold_wal=False)

    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.set_trace_callback(create_between_the_reads)
        assert classify_database(conn, path) == "empty"  # the snapshot of the first read
        conn.set_trace_callback(None)
        assert created == [True]
        assert classify_database(conn, path) == "ours"
        assert not conn.in_transaction
    finally:
        conn.close()


_DIE_MID_TRANSACTION = r"""
import os, signal, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA cache_size=2")  # the transaction's pages spill into the file: its journal is hot
conn.execute("BEGIN")
conn.execute("CREATE TABLE junk (x)")
conn.execute("INSERT INTO junk VALUES (randomblob(1000))")
for _ in range(9):
    conn.execute("INSERT INTO junk SELECT randomblob(1000) FROM junk")
os.kill(os.getpid(), signal.SIGKILL)
"""


def die_mid_transaction(path: Path) -> None:
    """A writer in rollback-journal mode killed mid-transaction: a hot journal, as SIGKILL leaves it."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", _DIE_MID_TRANSACTION, str(path)], check=False)
    assert Path(f"{path}-journal").stat().st_size > 0


async def test_iter_results_replays_a_dead_writers_hot_journal_in_our_file(tmp_path: Path) -> None:
    # A read-only connection cannot roll a hot journal back, and SQLite refuses every read until
    # one does (CI, once: the crash fuzz killed a writer while its file was being set up).
    path = tmp_path / "run.sqlite"
    async with SqliteArtifactStore(path, identity=IDENTITY) as store:
        for i in range(3):
            await store.append(result(i), fingerprint=fp(i))
    await independent(path, "PRAGMA journal_mode=DELETE")
    await anyio.to_thread.run_sync(die_mid_transaction, path)
    reader = SqliteArtifactStore(path, identity=IDENTITY)
    seen = await anyio.to_thread.run_sync(lambda: [r.item_id for r in reader.iter_results()])
    assert seen == ["item-0", "item-1", "item-2"]  # everything committed, nothing of the dead transaction
    tables = await independent(path, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
    assert tables == [("meta",), ("results",)]


async def test_iter_results_leaves_a_foreign_files_hot_journal_alone(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite"
    await independent(path, "CREATE TABLE theirs (x)")
    await anyio.to_thread.run_sync(die_mid_transaction, path)
    before = await anyio.to_thread.run_sync(path.read_bytes)
    reader = SqliteArtifactStore(path, identity=IDENTITY)
    with pytest.raises(ArtifactStoreError, match="not provably ours") as caught:
        await anyio.to_thread.run_sync(lambda: list(reader.iter_results()))
    assert str(path) in str(caught.value)
    after = await anyio.to_thread.run_sync(path.read_bytes)
    journal = Path(f"{path}-journal")
    assert after == before and await anyio.to_thread.run_sync(journal.exists)  # not rolled back by us
