"""Issue 34: ``trio-batch-llm cache stats|clear``: what a response cache holds, and emptying it.

The command runs in this process (``main``); the cache behind it is an in-memory connection
put in place of the backend's (``connect_cache``), or a real SQLite file when its backend
counts its entries.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import pytest

from trio_batch_llm import MemoryResponseCache, SqliteResponseCache
from trio_batch_llm._cache import _open
from trio_batch_llm._cache._connection import CacheConnection
from trio_batch_llm._cache._memory import MemoryCacheConnection
from trio_batch_llm._cache._records import CachedAnswer, CacheKey
from trio_batch_llm._cli._main import main
from trio_batch_llm._values._response_cache import ResponseCache

SECRET = "s3cr3t-Pa55"
URL = f"postgresql://me:{SECRET}@cache.example/llm"
NOW = time.time()


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch) -> MemoryResponseCache:
    """A memory cache with three entries (written 1 h, 1 day and 2 days ago) behind every URL."""
    cache = MemoryResponseCache()
    connection = MemoryCacheConnection(cache)

    async def fill() -> None:
        for n, age in enumerate((3600, 86400, 2 * 86400)):
            await connection.put(CacheKey(f"d{n}"), CachedAnswer(f"answer {n}", created_at=NOW - age))

    anyio.run(fill)

    async def connect(config: ResponseCache) -> CacheConnection:
        await anyio.lowlevel.checkpoint()
        return MemoryCacheConnection(cache)

    monkeypatch.setattr(_open, "connect_cache", connect)
    return cache


def test_stats_counts_the_entries_and_hides_the_password(capsys: pytest.CaptureFixture[str],
                                                        memory: MemoryResponseCache) -> None:
    code, output = run_cli(capsys, "cache", "stats", URL)
    assert code == 0, output
    lines = output.splitlines()
    assert lines[0] == "cache       postgresql://<redacted>@cache.example/llm"
    assert lines[1:3] == ["  entries   3", "  size      unknown"]
    assert lines[3] == f"  oldest    {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(NOW - 2 * 86400))}"
    assert SECRET not in output
    code, output = run_cli(capsys, "cache", "stats", URL, "--json")
    assert code == 0
    data = json.loads(output)
    assert data["entries"] == 3 and data["newest"] == pytest.approx(NOW - 3600)
    assert data["cache"] == "postgresql://<redacted>@cache.example/llm"


def test_clear_deletes_the_old_entries_then_all(capsys: pytest.CaptureFixture[str],
                                                memory: MemoryResponseCache) -> None:
    code, output = run_cli(capsys, "cache", "clear", URL, "--older-than", "43200")
    assert code == 0, output
    assert output == ("deleted 2 entries written more than 43200 s ago from "
                      "postgresql://<redacted>@cache.example/llm\n")
    assert sorted(key for key in memory.entries if key.startswith("d")) == ["d0"]
    code, output = run_cli(capsys, "cache", "clear", URL, "--backend", "asyncio")
    assert code == 0 and output.startswith("deleted 1 entries from ")
    code, output = run_cli(capsys, "cache", "stats", URL)
    assert "  entries   0" in output


def test_a_missing_sqlite_file_is_refused_not_created(capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Path) -> None:
    path = tmp_path / "nothing.sqlite3"
    for command in ("stats", "clear"):
        code, output = run_cli(capsys, "cache", command, str(path))
        assert code == 2 and f"error: {path}: no such cache file" in output
    assert not path.exists()
    code, output = run_cli(capsys, "cache", "stats", f"mysql://u:{SECRET}@h/db")
    assert code == 2 and "--cache mysql://<redacted>@h/db: must be" in output and SECRET not in output


def test_a_backend_that_cannot_count_says_so(capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    class Mute(MemoryCacheConnection):
        stats = CacheConnection.stats  # the protocol's default: not implemented
        clear = CacheConnection.clear

    async def connect(config: ResponseCache) -> CacheConnection:
        await anyio.lowlevel.checkpoint()
        return Mute(MemoryResponseCache())

    monkeypatch.setattr(_open, "connect_cache", connect)
    code, output = run_cli(capsys, "cache", "stats", URL)
    assert code == 1 and "this backend cannot do that yet (Mute cannot count its entries yet)" in output
    code, output = run_cli(capsys, "cache", "clear", URL)
    assert code == 1 and "Mute cannot clear its entries yet" in output


def test_an_unreachable_server_is_said_without_its_password(capsys: pytest.CaptureFixture[str]) -> None:
    code, output = run_cli(capsys, "cache", "stats", f"postgresql://me:{SECRET}@127.0.0.1:9/llm")
    assert code in (1, 69) and "error: postgresql://<redacted>@127.0.0.1:9/llm: " in output
    assert SECRET not in output


def test_stats_and_clear_of_a_real_sqlite_cache(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite3"

    async def fill() -> bool:
        async with _open.open_cache(SqliteResponseCache(path)) as connection:
            for n in range(3):
                await connection.put(CacheKey(f"{n:064x}", {"n": n}), CachedAnswer(f"a{n}", created_at=NOW))
            return type(connection).stats is not CacheConnection.stats

    if not anyio.run(fill):
        pytest.skip("the SQLite backend does not count its entries yet")
    code, output = run_cli(capsys, "cache", "stats", str(path), "--json")
    assert code == 0 and json.loads(output)["entries"] == 3
    code, output = run_cli(capsys, "cache", "clear", str(path))
    assert code == 0 and output.startswith("deleted 3 entries")
