"""The CLI's first Ctrl+C: the items waiting for an ``--rpm`` unit start no call, and the run ends when
the calls in flight have finished, not when the rate window would have let the waiting ones go.

A real subprocess against the project's mock server, so real time: ``--concurrency 4 --rpm 2``, calls
of 1 s; SIGINT once the first two calls have reached the server. Before the fix the two waiting items
were called when the window allowed (a minute on).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from trio_batch_llm.mock import MockServerConfig, serve_mock

from .test_cli import MODEL, records, run_args, spawn, write_prompts

pytestmark = pytest.mark.anyio


async def test_the_first_ctrl_c_starts_no_call_for_items_waiting_for_an_rpm_unit(
    anyio_backend: str, tmp_path: Path
) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(source, 20)
    async with serve_mock(MockServerConfig(model=MODEL, latency=1.0)) as server:
        async with spawn(*run_args(server, source, out, anyio_backend, "--concurrency", "4",
                                   "--rpm", "2")) as cli:
            await server.wait_for_requests(2)
            sent = time.monotonic()
            cli.send_signal(signal.SIGINT)
        ended = time.monotonic() - sent
        stats = await server.wait_for(lambda stats: True)
    assert cli.returncode == 130, cli.output
    assert stats.requests == 2, cli.output  # the two waiting items were never called
    assert ended < 15.0, cli.output  # the calls in flight (1 s), not the RPM window (60 s)
    done = {r["item_id"]: r["result"] for r in records(out)}
    assert sum(r["success"] for r in done.values()) == 2, cli.output
    assert "not run" in cli.err.decode() + cli.out.decode()
