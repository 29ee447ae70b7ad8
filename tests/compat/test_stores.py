"""async-batch-llm's SQLite store knobs: ``busy_timeout_seconds`` and ``read_batch_size``."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from trio_batch_llm import (
    ArtifactIdentity,
    ArtifactStoreError,
    ConfigurationError,
    SqliteArtifactStore,
    WorkItemResult,
)
from trio_batch_llm._artifacts import fingerprint

pytestmark = pytest.mark.anyio

IDENTITY = ArtifactIdentity(provider="fake", model="m-1")


def _result(i: int) -> WorkItemResult[Any]:
    return WorkItemResult(f"item-{i}", True, f"out-{i}")


def _fp(i: int) -> str:
    return fingerprint(f"prompt {i}", None)


async def test_read_batch_size_reads_every_row_in_order(tmp_path: Path) -> None:
    path = tmp_path / "run.sqlite"
    async with SqliteArtifactStore(path, identity=IDENTITY, read_batch_size=2) as store:
        for i in range(5):
            await store.append(_result(i), fingerprint=_fp(i))
    reader = SqliteArtifactStore(path, identity=IDENTITY, read_batch_size=2)
    assert [r.item_id for r in reader.iter_results()] == [f"item-{i}" for i in range(5)]


async def test_busy_timeout_seconds_bounds_the_wait_for_another_writer(tmp_path: Path) -> None:
    path = tmp_path / "run.sqlite"
    async with SqliteArtifactStore(path, identity=IDENTITY, busy_timeout_seconds=0.05) as store:
        await store.append(_result(0), fingerprint=_fp(0))
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # holds the write lock
            with pytest.raises(ArtifactStoreError, match=r"(?i)lock|busy"):
                await store.append(_result(1), fingerprint=_fp(1))
        finally:
            other.execute("ROLLBACK")
            other.close()
        await store.append(_result(2), fingerprint=_fp(2))
    stored = SqliteArtifactStore(path, identity=IDENTITY).iter_results()
    assert [r.item_id for r in stored] == ["item-0", "item-2"]


@pytest.mark.parametrize(("knob", "value"), [("busy_timeout_seconds", -1.0), ("read_batch_size", 0)])
def test_bad_store_knobs_are_named(tmp_path: Path, knob: str, value: float) -> None:
    with pytest.raises(ConfigurationError, match=knob):
        SqliteArtifactStore(tmp_path / "x.sqlite", identity=IDENTITY, **{knob: value})
