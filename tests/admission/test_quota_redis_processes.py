"""Three CLI processes sharing one Redis quota (``--quota``) at an RPM limit, against the mock server.

Shortened rather than accelerated: 12 items want to go, the limit lets 6 go in
a minute, and each process stops after a few seconds (``--batch-timeout``).
The mock's own count says how many arrived in its busiest 60 s window. The
children run on both event loops (trio, asyncio, trio), so one run covers both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from trio_batch_llm.testing import MockServerConfig, serve_mock

from .._servers.redis import PASSWORD

pytestmark = pytest.mark.anyio

RPM = 6
PROCESSES = 3
ITEMS = 4  # per process: 12 in all, twice what the limit lets through in a window


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "trio"  # the test's own loop only serves the mock; the children use both loops


async def test_three_processes_never_exceed_one_shared_rpm(redis_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("OPENAI_API_KEY", None)
    async with serve_mock(MockServerConfig()) as server:
        commands = []
        for n, backend in enumerate(["trio", "asyncio", "trio"][:PROCESSES]):
            source = tmp_path / f"in{n}.jsonl"
            source.write_text("".join(json.dumps(f"process {n} prompt {i}") + "\n" for i in range(ITEMS)))
            commands.append([
                sys.executable, "-m", "trio_batch_llm", "run", str(source), "--model",
                "openai-compatible:mock-model", "--base-url", server.base_url, "--out",
                str(tmp_path / f"out{n}.jsonl"), "--backend", backend, "--rpm", str(RPM),
                "--quota", redis_url,
                "--batch-timeout", "6", "--max-attempts", "1", "--no-progress",
            ])
        outputs: list[str] = []

        async def run(argv: list[str]) -> None:
            done = await anyio.run_process(argv, env=env, check=False, stdin=subprocess.DEVNULL)
            outputs.append((done.stdout + done.stderr).decode())

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for argv in commands:
                    tg.start_soon(run, argv)
        stats = server.statistics()
    for output in outputs:
        assert "Traceback" not in output and "error:" not in output, output
        assert PASSWORD not in output
    assert stats.max_arrivals_per_window <= RPM
    # The limit was used, not just respected (a child slow to start on a loaded machine may
    # still be connecting when its deadline cancels a call it was admitted for).
    assert RPM - 2 <= stats.requests <= RPM, "\n".join(outputs)
