"""Issue 8: the command line end to end, in subprocesses, against the mock server.

The mock server runs in the test process (on the test's backend); the CLI runs
with ``--backend`` set to the same backend. Nothing waits on the wall clock:
the tests wait for the server's own counters (``wait_for``) or for a line of
the CLI's output, each wait bounded so a broken run fails instead of hanging.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx2
import pytest

from trio_batch_llm import ArtifactIdentity
from trio_batch_llm._artifacts import JsonlArtifactStore
from trio_batch_llm.testing import MockServer, MockServerConfig, serve_mock

pytestmark = pytest.mark.anyio

MODEL = "mock-model"
IDENTITY = ArtifactIdentity(provider="openai-compatible", model=MODEL)
WAIT = 30.0  # a bound on every wait: only a broken run ever reaches it
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "120", "TERM": "xterm-256color"}
ENV.pop("OPENAI_API_KEY", None)


class CliProcess:
    """A running CLI whose stdout and stderr are collected as they arrive."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        self.out = bytearray()
        self.err = bytearray()
        self._changed = anyio.Event()

    async def pump(self, stream: anyio.abc.ByteReceiveStream, buffer: bytearray) -> None:
        async for chunk in stream:
            buffer.extend(chunk)
            self._changed.set()
            self._changed = anyio.Event()

    async def wait_for_text(self, text: str) -> None:
        with anyio.fail_after(WAIT):
            while True:
                changed = self._changed
                if text in self.output:
                    return
                await changed.wait()

    @property
    def output(self) -> str:
        return (self.out + self.err).decode()

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def send_signal(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "trio_batch_llm", *args]


@asynccontextmanager
async def spawn(*args: str) -> AsyncIterator[CliProcess]:
    """Start the CLI; on leaving the block wait (bounded) for it to exit."""
    process = await anyio.open_process(command(*args), stdin=subprocess.DEVNULL, env=ENV)
    cli = CliProcess(process)
    try:
        async with anyio.create_task_group() as group:
            assert process.stdout is not None and process.stderr is not None
            group.start_soon(cli.pump, process.stdout, cli.out)
            group.start_soon(cli.pump, process.stderr, cli.err)
            yield cli
            with anyio.fail_after(WAIT):
                await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
        with anyio.CancelScope(shield=True):
            await process.aclose()


def run_args(server: MockServer, source: Path, out: Path, backend: str, *extra: str) -> list[str]:
    return ["run", str(source), "--model", f"openai-compatible:{MODEL}", "--base-url", server.base_url,
            "--out", str(out), "--backend", backend, *extra]


def write_prompts(path: Path, count: int) -> list[str]:
    """Objects with contexts, and every fourth line a bare string (id ``item-N``)."""
    lines, ids = [], []
    for n in range(count):
        if n % 4 == 3:
            lines.append(json.dumps(f"bare prompt {n}"))
            ids.append(f"item-{len(ids)}")
        else:
            lines.append(json.dumps({"id": f"q{n}", "prompt": f"prompt {n}", "context": {"n": n}}))
            ids.append(f"q{n}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return ids


def records(path: Path) -> list[dict[str, Any]]:
    """Every line after the header, parsed (so every line must be whole JSON)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    assert json.loads(lines[0])["kind"] == "header"
    return [json.loads(line) for line in lines[1:]]


async def load(path: Path) -> dict[str, Any]:
    """The newest record per id, read back through the store (so the file is loadable)."""
    async with JsonlArtifactStore(path, identity=IDENTITY) as store:
        return await store.load()


# --- run --------------------------------------------------------------------------------


async def test_run_writes_every_id_once(anyio_backend: str, tmp_path: Path) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(source, 12)
    async with serve_mock(MockServerConfig(model=MODEL)) as server:
        async with spawn(*run_args(server, source, out, anyio_backend, "--concurrency", "4")) as cli:
            pass
        assert server.stats.requests == 12
    assert cli.returncode == 0, cli.output
    stored = records(out)
    assert sorted(r["item_id"] for r in stored) == sorted(ids)
    by_id = {r["item_id"]: r["result"] for r in stored}
    assert by_id["q0"]["output"] == "echo: prompt 0" and by_id["q0"]["context"] == {"n": 0}
    assert by_id["item-3"]["output"] == "echo: bare prompt 3" and by_id["item-3"]["context"] is None
    assert all(r["success"] for r in by_id.values())
    output = cli.output
    assert "Batch completed" in output and "succeeded 12" in output
    # stderr is not a terminal: progress comes as log lines, never a redrawn bar
    assert "trio-batch-llm: finished: 12/12 (100%)" in output and "\r" not in output
    assert "resume" not in output


async def test_interrupt_drains_then_resume_completes(anyio_backend: str, tmp_path: Path) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(source, 40)
    async with serve_mock(MockServerConfig(model=MODEL, latency=0.05)) as server:
        args = run_args(server, source, out, anyio_backend, "--concurrency", "2")
        async with spawn(*args) as cli:
            await server.wait_for(lambda stats: stats.succeeded >= 4)
            cli.send_signal(signal.SIGINT)
        assert cli.returncode == 130, cli.output
        assert "SIGINT: stopping: no new calls start" in cli.output
        assert f"resume with: trio-batch-llm run {source}" in cli.output and "--resume" in cli.output
        first = await load(out)
        kept = {item_id for item_id, record in first.items() if record.success}
        assert 4 <= len(kept) < 40
        # the rest were recorded as not executed (the queue) or never admitted: all rerun by --resume
        assert all(r.result["error_category"] == "not_executed" for r in first.values() if not r.success)
        requests_before = server.stats.requests

        async with spawn(*args, "--resume") as again:
            pass
        assert again.returncode == 0, again.output
        assert f"replayed {len(kept)}" in again.output
        assert server.stats.requests - requests_before == 40 - len(kept)  # no stored success ran again
    final = await load(out)
    assert sorted(final) == sorted(ids) and all(record.success for record in final.values())
    successes: dict[str, int] = {}
    for record in records(out):
        if record["result"]["success"]:
            successes[record["item_id"]] = successes.get(record["item_id"], 0) + 1
    assert successes == dict.fromkeys(ids, 1)  # every id succeeded exactly once across both runs


async def test_second_sigint_forces_the_stop(anyio_backend: str, tmp_path: Path) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(source, 10)
    async with serve_mock(MockServerConfig(model=MODEL, hang_rate=1.0)) as server:
        args = run_args(server, source, out, anyio_backend, "--concurrency", "2")
        async with spawn(*args) as cli:
            await server.wait_for_requests(2)  # both workers are in calls that never answer
            cli.send_signal(signal.SIGINT)
            await cli.wait_for_text("SIGINT: stopping")
            cli.send_signal(signal.SIGINT)
    assert cli.returncode == 130, cli.output
    assert "second SIGINT: forced stop: abandoning 2 call(s) in flight" in cli.output
    assert "forced stop by SIGINT: 0 of 10 item(s) succeeded" in cli.output
    assert "resume with:" in cli.output
    assert await load(out) == {}  # loadable; the abandoned calls left no result


async def test_sigterm_stops_like_the_first_ctrl_c(anyio_backend: str, tmp_path: Path) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(source, 30)
    async with serve_mock(MockServerConfig(model=MODEL, latency=0.05)) as server:
        args = run_args(server, source, out, anyio_backend, "--concurrency", "2")
        async with spawn(*args) as cli:
            await server.wait_for(lambda stats: stats.succeeded >= 2)
            cli.send_signal(signal.SIGTERM)
    assert cli.returncode == 128 + signal.SIGTERM, cli.output
    assert "SIGTERM: stopping" in cli.output and "--resume" in cli.output
    assert sum(record.success for record in (await load(out)).values()) >= 2


# --- progress in a terminal ---------------------------------------------------------------


def read_until_eof(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the terminal's other side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


async def test_progress_bar_in_a_terminal(anyio_backend: str, tmp_path: Path) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(source, 20)
    async with serve_mock(MockServerConfig(model=MODEL, latency=0.01)) as server:
        controller, terminal = os.openpty()
        try:
            process = await anyio.open_process(
                command(*run_args(server, source, out, anyio_backend, "--concurrency", "4")),
                stdin=terminal, stdout=terminal, stderr=terminal, env=ENV,
            )
        finally:
            os.close(terminal)
        try:
            with anyio.fail_after(WAIT):
                screen = await anyio.to_thread.run_sync(read_until_eof, controller)
                await process.wait()
        finally:
            os.close(controller)
            if process.returncode is None:
                process.kill()
            with anyio.CancelScope(shield=True):
                await process.aclose()
    assert process.returncode == 0, screen.decode(errors="replace")
    # the bar (rich's or the plain one) and its counters, drawn for the known total
    assert "━".encode() in screen or b"[####" in screen
    assert b"20/20" in screen and b"items/s" in screen
    assert b"Batch completed" in screen


# --- demo and serve-mock --------------------------------------------------------------------


async def test_demo_runs_against_the_bundled_mock_server(anyio_backend: str) -> None:
    result = await anyio.run_process(command("demo", "--items", "30", "--concurrency", "8",
                                             "--backend", anyio_backend), check=False, env=ENV)
    output = (result.stdout + result.stderr).decode()
    assert result.returncode == 0, output
    assert f"backend {anyio_backend}" in output
    assert "Batch completed" in output and "items               30   succeeded 30" in output
    assert "mock server: " in output and "requests" in output


async def test_serve_mock_prints_its_base_url_and_stops_on_ctrl_c(anyio_backend: str) -> None:
    async with spawn("serve-mock", "--port", "0", "--backend", anyio_backend, "--latency", "0") as cli:
        await cli.wait_for_text("/v1\n")
        base_url = cli.output.strip().splitlines()[0]
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        async with httpx2.AsyncClient() as client:
            reply = await client.post(f"{base_url}/chat/completions",
                                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert reply.json()["choices"][0]["message"]["content"] == "echo: hi"
        cli.send_signal(signal.SIGINT)
    assert cli.returncode == 0, cli.output
