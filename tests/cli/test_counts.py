"""Issue 35, points 1 and 2 at the command line: the bar and the summary agree on *not run*, and a
``--resume`` shows what it replayed apart from what it ran (items, tokens, cost).

The CLI runs in a subprocess against the mock server, in a pseudo-terminal where the bar is the
point; every wait is for a counter of the server or for the process's end, bounded.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from trio_batch_llm.testing import MockServerConfig, serve_mock

from .test_cli import ENV, MODEL, WAIT, command, read_until_eof, run_args, spawn, write_prompts

pytestmark = pytest.mark.anyio

_ESCAPES = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]|\r")


def _frames(screen: bytes) -> list[str]:
    """Every progress frame drawn, oldest first, escape sequences left out."""
    text = _ESCAPES.sub(b"\n", screen).decode(errors="replace")
    return [line.strip() for line in text.splitlines() if "| " in line and "in flight" in line]


async def test_after_ctrl_c_the_bars_last_frame_says_not_run_as_the_summary_does(
        anyio_backend: str, tmp_path: Path) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(source, 400)
    async with serve_mock(MockServerConfig(model=MODEL, latency=0.05)) as server:
        controller, terminal = os.openpty()
        try:
            process = await anyio.open_process(
                command(*run_args(server, source, out, anyio_backend, "--concurrency", "2")),
                stdin=terminal, stdout=terminal, stderr=terminal, env=ENV,
            )
        finally:
            os.close(terminal)
        screen = b""
        try:
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tg:

                    async def read() -> None:
                        nonlocal screen
                        screen = await anyio.to_thread.run_sync(read_until_eof, controller)

                    tg.start_soon(read)
                    await server.wait_for(lambda stats: stats.succeeded >= 4)
                    process.send_signal(signal.SIGINT)
                await process.wait()
        finally:
            os.close(controller)
            if process.returncode is None:
                process.kill()
            with anyio.CancelScope(shield=True):
                await process.aclose()
    text = screen.decode(errors="replace")
    assert process.returncode == 130, text
    items_line = next(line for line in text.splitlines() if line.startswith("  items"))
    succeeded = int(items_line.split("succeeded ")[1].split()[0].replace(",", ""))
    not_run = items_line.split("not run ")[1].split()[0]
    assert "failed 0" in items_line
    last = _frames(screen)[-1]
    assert f"{succeeded}/400 " in last and f"| 0 failed | {not_run} not run | 0 in flight" in last, last
    assert "ETA" not in last  # stopped: no time left to estimate


async def test_no_frame_estimates_a_time_left_before_an_item_finished(anyio_backend: str,
                                                                      tmp_path: Path) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(source, 40)
    async with (serve_mock(MockServerConfig(model=MODEL, latency=30.0)) as server,
                spawn(*run_args(server, source, out, anyio_backend, "--concurrency", "4")) as cli):
        await cli.wait_for_text("trio-batch-llm: progress:")  # not a terminal: log lines
        assert server.stats.succeeded == 0
        cli.send_signal(signal.SIGINT)
        await cli.wait_for_text("SIGINT: stopping")
        cli.send_signal(signal.SIGINT)  # abandon the four 30 s calls
    lines = [line for line in cli.output.splitlines() if line.startswith("trio-batch-llm: progress:")
             or line.startswith("trio-batch-llm: finished:")]
    assert lines and all(re.search(r"ETA \d", line) is None for line in lines), lines
    # The four abandoned calls are not run too (as the summary has them), and no longer anywhere.
    assert "0/40 (0%) | 0 failed | 40 not run | 0 in flight | 0.0 items/s | 0 tokens" in lines[-1], lines[-1]


def _line(output: str, start: str) -> str:
    return next(line for line in output.splitlines() if line.startswith(start))


async def test_a_resume_that_replays_everything_shows_no_new_spend(anyio_backend: str,
                                                                   tmp_path: Path) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(source, 12)
    async with serve_mock(MockServerConfig(model=MODEL)) as server:
        async with spawn(*run_args(server, source, out, anyio_backend)) as first:
            pass
        async with spawn(*run_args(server, source, out, anyio_backend, "--resume")) as again:
            pass
        assert server.stats.requests == 12  # the resume made no call
    assert first.returncode == 0 and again.returncode == 0, again.output
    spent = _line(first.output, "  tokens").split()[1]
    assert int(spent.replace(",", "")) > 0
    assert _line(again.output, "  items").endswith("replayed 12   new 0")
    assert _line(again.output, "  tokens").split()[:2] == ["tokens", "0"]  # this run's calls: none
    replayed = _line(again.output, "  replayed")
    assert replayed.split()[1] == spent and "spent by an earlier run, not counted above" in replayed
    assert _line(again.output, "  wall time").endswith("0 items/s (new items only)")
