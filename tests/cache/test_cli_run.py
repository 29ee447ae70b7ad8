"""Issue 34: ``trio-batch-llm run --cache`` end to end, in subprocesses, against the mock server.

The first run fills a SQLite cache; the second, with a new checkpoint, makes no call at all
and says so in its summary; ``sample`` rows are drawn apart; ``--cache-mode`` changes what
is read and written. Runs on both backends (the CLI's ``--backend`` is the test's).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from trio_batch_llm.testing import MockServerConfig, serve_mock

from ..cli.test_cli import MODEL, run_args, spawn
from ..cli.test_runs import cli

pytestmark = pytest.mark.anyio


def write_rows(path: Path) -> None:
    rows = [{"id": "a", "prompt": "same"}, {"id": "b", "prompt": "same", "sample": 1},
            {"id": "c", "prompt": "other"}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


async def test_a_second_run_is_answered_from_the_cache(anyio_backend: str, tmp_path: Path) -> None:
    source, cache = tmp_path / "in.jsonl", tmp_path / "cache.sqlite3"
    write_rows(source)
    async with serve_mock(MockServerConfig(model=MODEL)) as server:
        async with spawn(*run_args(server, source, tmp_path / "one.jsonl", anyio_backend,
                                   "--cache", str(cache))) as first:
            pass
        assert first.returncode == 0, first.output
        assert server.stats.requests == 3  # samples 0 and 1 of "same" are two requests
        assert "  cache hits           0   misses 3   rate 0.0 %" in first.output
        assert stat.S_IMODE(os.stat(cache).st_mode) == 0o600  # prompts and answers: the owner's only
        async with spawn(*run_args(server, source, tmp_path / "two.jsonl", anyio_backend,
                                   "--cache", str(cache))) as second:
            pass
        assert second.returncode == 0, second.output
        assert server.stats.requests == 3  # nothing new: every answer came from the cache
        assert "  cache hits           3   misses 0   rate 100.0 %" in second.output
        assert "succeeded 3   failed 0" in second.output
        async with spawn(*run_args(server, source, tmp_path / "three.jsonl", anyio_backend,
                                   "--cache", str(cache), "--cache-mode", "refresh")) as third:
            pass
        assert third.returncode == 0, third.output
        assert server.stats.requests == 6  # refresh reads nothing: every item is called again
        assert "  cache hits           0   misses 3   rate 0.0 %" in third.output
    records = [json.loads(line) for line in (tmp_path / "two.jsonl").read_text().splitlines()[1:]]
    assert sorted(r["result"]["item_id"] for r in records if r["result"].get("cached")) == ["a", "b", "c"]


async def test_read_only_never_writes(anyio_backend: str, tmp_path: Path) -> None:
    source, cache = tmp_path / "in.jsonl", tmp_path / "cache.sqlite3"
    write_rows(source)
    async with serve_mock(MockServerConfig(model=MODEL)) as server:
        for n in range(2):
            async with spawn(*run_args(server, source, tmp_path / f"out{n}.jsonl", anyio_backend,
                                       "--cache", str(cache), "--cache-mode", "read-only")) as cli:
                pass
            assert cli.returncode == 0, cli.output
            assert "  cache hits           0   misses 3   rate 0.0 %" in cli.output
        assert server.stats.requests == 6  # nothing was stored, so nothing was found


async def test_runs_start_drives_through_the_cache(anyio_backend: str, tmp_path: Path) -> None:
    source, cache, db = tmp_path / "in.jsonl", tmp_path / "cache.sqlite3", tmp_path / "runs.sqlite3"
    source.write_text('{"id": "a", "prompt": "one"}\n{"id": "b", "prompt": "two"}\n', encoding="utf-8")
    async with serve_mock(MockServerConfig(model=MODEL)) as server:
        for run_id, calls in (("first", 2), ("second", 2)):  # the second run's answers: all cached
            argv = ["runs", "start", str(db), run_id, str(source), "--model", f"openai-compatible:{MODEL}",
                    "--base-url", server.base_url, "--backend", anyio_backend, "--cache", str(cache)]
            code, out, err = await cli(*argv)
            assert code == 0, out + err
            assert server.stats.requests == calls
    code, out, err = await cli("runs", "export", str(db), "second", str(tmp_path / "second.jsonl"),
                               "--backend", anyio_backend)
    assert code == 0, err
    lines = [json.loads(line) for line in (tmp_path / "second.jsonl").read_text().splitlines()]
    assert [line["result"].get("cached") for line in lines] == [True, True]
