"""Issue 35, point 10: after Ctrl+C in a terminal, the stop message starts its own line.

The terminal's line discipline echoes ``^C`` where the cursor stands (the end
of the progress bar); without a newline the message followed on that line.
The run gets a real pseudo-terminal as its controlling terminal, and Ctrl+C is
typed into it (byte 0x03), so the ``^C`` and the SIGINT are the terminal's own.
A pipe gets no ``^C``, and no newline either.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from pathlib import Path

import anyio
import pytest

from trio_batch_llm.mock import MockServerConfig, serve_mock

from .test_cli import ENV, MODEL, WAIT, command, run_args, spawn, write_prompts

pytestmark = pytest.mark.anyio

# Make the terminal the child's controlling terminal (a new session), as a shell does, then run the CLI.
_LAUNCHER = ("import fcntl, os, sys, termios; os.setsid(); fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
             "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")
_STOPPING = b"trio-batch-llm: SIGINT: stopping"


def _type_ctrl_c_when(controller: int, ready: bytes) -> bytes:
    """The screen: read until ``ready`` shows, type Ctrl+C, read to the end (bounded by WAIT)."""
    screen = bytearray()
    typed = False
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        readable, _, _ = select.select([controller], [], [], 0.1)
        if readable:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the terminal's other side closed
                break
            if not chunk:
                break
            screen += chunk
        if not typed and ready in screen:
            os.write(controller, b"\x03")
            typed = True
    return bytes(screen)


async def test_the_stop_message_does_not_follow_the_echoed_ctrl_c(anyio_backend: str, tmp_path: Path) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(source, 200)
    async with serve_mock(MockServerConfig(model=MODEL, latency=0.1)) as server:
        argv = command(*run_args(server, source, out, anyio_backend, "--concurrency", "2", "--progress"))
        controller, terminal = os.openpty()
        try:
            process = await anyio.open_process([sys.executable, "-c", _LAUNCHER, *argv[1:]], stdin=terminal,
                                               stdout=terminal, stderr=terminal, env=ENV)
        finally:
            os.close(terminal)
        try:
            with anyio.fail_after(WAIT + 5):
                # Ctrl+C once the bar is drawn and calls are in flight: the cursor is at the bar's end.
                screen = await anyio.to_thread.run_sync(_type_ctrl_c_when, controller, b"in flight")
                await process.wait()
        finally:
            os.close(controller)
            if process.returncode is None:
                process.kill()
            with anyio.CancelScope(shield=True):
                await process.aclose()
    shown = screen.decode(errors="replace")
    assert process.returncode == 130, shown
    assert b"^C" in screen, shown  # the terminal echoed it: the test typed a real Ctrl+C
    before = screen[:screen.index(_STOPPING)]
    assert before.endswith(b"^C\r\n"), shown[-2000:]


async def test_a_pipe_gets_no_extra_line(anyio_backend: str, tmp_path: Path) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(source, 200)
    async with (serve_mock(MockServerConfig(model=MODEL, latency=0.05)) as server,
                spawn(*run_args(server, source, out, anyio_backend, "--concurrency", "2")) as cli):
        await server.wait_for(lambda stats: stats.succeeded >= 2)
        cli.send_signal(signal.SIGINT)
    assert cli.returncode == 130, cli.output
    errors = cli.err.decode()
    assert "\ntrio-batch-llm: SIGINT: stopping" in errors or errors.startswith("trio-batch-llm: SIGINT")
    assert "\n\ntrio-batch-llm: SIGINT: stopping" not in errors and not errors.startswith("\n")


def test_only_a_terminal_that_echoes_control_characters_gets_the_newline() -> None:
    from trio_batch_llm._cli._terminal import echoes_ctrl_c

    termios = pytest.importorskip("termios")
    controller, terminal = os.openpty()
    try:
        with os.fdopen(os.dup(terminal), "w") as stream:
            assert echoes_ctrl_c(stream)  # a new terminal echoes ^C (ECHOCTL is on by default)
            modes = termios.tcgetattr(terminal)
            modes[3] &= ~termios.ECHOCTL
            termios.tcsetattr(terminal, termios.TCSANOW, modes)
            assert not echoes_ctrl_c(stream)
        with open(os.devnull, "w") as null:
            assert not echoes_ctrl_c(null)
        read_end, write_end = os.pipe()
        with os.fdopen(read_end, "rb"), os.fdopen(write_end, "w") as pipe:
            assert not echoes_ctrl_c(pipe)
    finally:
        os.close(controller)
        os.close(terminal)
