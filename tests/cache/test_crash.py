"""The SQLite response cache under kill -9 (no half entry) and two processes racing over its claims."""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from trio_batch_llm import SqliteResponseCache
from trio_batch_llm._cache._answer_json import answer_from_json
from trio_batch_llm._cache._sqlite import SqliteCacheConnection

from .._cache_child import check_entry, crash_answer, crash_key
from .._paths import TESTS

CHILD = TESTS.joinpath("_cache_child.py")
BACKENDS = ["asyncio", "trio"]
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(CHILD), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def entries(path: Path) -> dict[int, Any]:
    """Every entry of the file, checked whole: integrity, key, answer and its checksum."""
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        found: dict[int, Any] = {}
        for digest, text in conn.execute("SELECT digest, answer FROM entries"):
            answer = answer_from_json(text)
            assert answer is not None, f"an entry that does not decode: {text[:80]!r}"
            i = answer.output["i"]
            assert crash_key(i).digest == digest
            assert check_entry(i, answer), f"entry {i} is not whole"
            found[i] = answer
        return found
    finally:
        conn.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_writer_killed_at_random_moments_leaves_no_half_entry(tmp_path: Path, backend: str) -> None:
    path = tmp_path / "c.sqlite3"
    rng = random.Random(f"{backend}-kill")
    start, written = 0, 0
    for _ in range(4):
        child = spawn("write", str(path), "--backend", backend, "--start", str(start))
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready", child.stderr.read() if child.stderr else ""
        time.sleep(rng.uniform(0.02, 0.4))
        child.kill()  # SIGKILL: no cleanup of any kind
        child.communicate()
        found = entries(path)
        assert found, "nothing was written"
        newest = max(found)
        assert newest >= start  # this child wrote (some may have been evicted by the size bound)
        written += newest - start + 1
        start = newest + 1

    async def read_back() -> None:
        cache = await SqliteCacheConnection.open(SqliteResponseCache(path, max_bytes=2_000_000))
        try:
            got = await cache.get(crash_key(start - 1))
            assert got is not None and got.output == crash_answer(start - 1).output
            await cache.put(crash_key(start), crash_answer(start))  # and it takes writes again
        finally:
            await cache.aclose()

    anyio.run(read_back, backend=backend)
    assert start in entries(path)
    assert written > 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_processes_racing_over_one_file_call_each_key_once(tmp_path: Path, backend: str) -> None:
    path = tmp_path / "c.sqlite3"
    keys = 40
    children = [spawn("race", str(path), "--backend", backend, "--keys", str(keys), "--seed", str(seed))
                for seed in (1, 2)]
    for child in children:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
    (tmp_path / "c.sqlite3.go").touch()
    reports = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        reports.append(json.loads(out))
    leaders = sorted(k for report in reports for k in report["called"])
    assert leaders == list(range(keys)), reports  # every key called exactly once in all
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM entries").fetchone()[0] == keys
        assert conn.execute("SELECT count(*) FROM claims").fetchone()[0] == 0  # all let go
