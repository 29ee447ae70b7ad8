"""Issue 35, point 2 for durable runs: a ``runs start`` that continues a run says what was done
since it started apart from what was done before it, so adding up the reports of several starts
counts no item (nor its tokens) twice. (A run replays nothing: ``runs status`` counts each item's
recorded result once.)

Subprocesses against the mock server, as in ``test_cli_runs``: the first driver is stopped at a
known point by a prompt whose first call never answers.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from trio_batch_llm.testing import MockServerConfig, serve_mock

from ..cli.test_cli import MODEL, spawn
from ..cli.test_runs import RUN, cli, start_args, status, wait_until_done, write_items

pytestmark = pytest.mark.anyio


async def test_a_continued_start_reports_what_it_added_apart_from_what_was_done_before(
        anyio_backend: str, tmp_path: Path) -> None:
    db, source = tmp_path / "runs.sqlite", tmp_path / "in.jsonl"
    write_items(source, ["a", "b", "c [[hangx1]]", "d", "e", "f"])
    async with serve_mock(MockServerConfig(model=MODEL)) as server:
        args = start_args(server, db, source, anyio_backend, "--concurrency", "1")
        async with spawn(*args) as driver:
            await server.wait_for(lambda stats: stats.hangs == 1)
            await wait_until_done(db, 2)
            driver.send_signal(signal.SIGTERM)
        before = await status(db)
        assert before["done"] == 2 and before["total_tokens"] > 0
        code, out, err = await cli(*args)
        assert code == 0, out + err
        after = await status(db)
    added = after["total_tokens"] - before["total_tokens"]
    line = next(line for line in out.splitlines() if line.startswith("  this start:"))
    assert line == (f"  this start: done 4 (succeeded 4, failed 0), tokens {added:,}; done before it: 2 "
                    f"(tokens {before['total_tokens']:,}): add up starts by these lines, not the totals")
    assert "this start" not in (await cli("runs", "status", str(db), RUN))[1]
