"""A command-line run on Claude against the served mock's Anthropic route, on both backends.

``--model anthropic:NAME`` is parsed by the command line's provider table (``_cli``); until that
lands (fix33-router) the test is skipped, and it runs as soon as the CLI knows the provider.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import anyio
import pytest

from trio_batch_llm._cli import _args
from trio_batch_llm.mock import MockServerConfig, serve_mock

from ..cli.test_cli import ENV, command

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif("anthropic" not in getattr(_args, "PROVIDERS", ("anthropic",)),
                       reason="the command line's anthropic: models land with fix33-router"),
]

SHELL_KEY = "sk-ant-shell-key-MUST-NOT-TRAVEL-0001"
GATEWAY_KEY = "sk-ant-gateway-key-0002"


async def test_a_cli_run_on_claude_answers_every_row_with_the_named_key(anyio_backend: str,
                                                                          tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    rows = (json.dumps({"id": f"q{i}", "prompt": f"question {i}"}) + "\n" for i in range(3))
    source.write_text("".join(rows), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    env = {**ENV, "ANTHROPIC_API_KEY": SHELL_KEY, "MY_CLAUDE_KEY": GATEWAY_KEY}
    env.pop("ANTHROPIC_BASE_URL", None)
    async with serve_mock(MockServerConfig(api_key=GATEWAY_KEY)) as server:
        argv = ["run", str(source), "--model", "anthropic:claude-haiku-4-5", "--base-url",
                server.base_urls["anthropic"], "--api-key-env", "MY_CLAUDE_KEY", "--out", str(out),
                "--backend", anyio_backend]
        with anyio.fail_after(60):
            done = await anyio.run_process(command(*argv), env=env, check=False)
        output = done.stdout.decode() + done.stderr.decode()
        assert done.returncode == 0, output
        assert re.search(r"succeeded 3\b", output), output
        assert {request.path for request in server.requests} == {"/v1/messages"}
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    results = [line["result"] for line in lines if line["kind"] == "result"]
    assert sorted((r["item_id"], r["output"]) for r in results) == \
        [(f"q{i}", f"echo: question {i}") for i in range(3)]
    assert all(line["identity"]["provider"] == "anthropic" for line in lines if line["kind"] == "header")
    assert SHELL_KEY not in output and GATEWAY_KEY not in output
