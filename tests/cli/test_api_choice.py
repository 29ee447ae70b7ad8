"""Issue 35, point 5: ``--model openai:NAME`` says which OpenAI API it speaks, and ``--api`` chooses.

``openai:`` speaks the Responses API unless ``--api chat`` (the library's
``OpenAIStrategy`` default, kept); ``openai-compatible:`` and ``openrouter:``
speak Chat Completions. The help says so per provider, the summary names the
API spoken, and pointed at another endpoint (a gateway) without ``--api`` the
run says before its first call which API it will speak and how to choose the
other. The mock server records the endpoint each request hit.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from trio_batch_llm._cli._main import main
from trio_batch_llm.testing import MockServerConfig, serve_mock

from .test_cli import ENV, command

pytestmark = pytest.mark.anyio

KEY = "sk-gateway-key-0123456789"


def test_help_says_which_api_each_provider_speaks_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "default: responses for openai:, chat for openai-compatible: and openrouter:" in text
    assert "chat (the Chat Completions API, POST /chat/completions)" in text
    assert "responses (the Responses API, POST /responses)" in text
    assert "the Chat Completions API, the default" not in text  # it was wrong for openai:
    assert "openai: speaks OpenAI's Responses API unless --api chat" in text  # --model's own help


async def _run(tmp_path: Path, base_url: str, backend: str, *extra: str) -> tuple[int, str, str]:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"prompt {i}"}) + "\n" for i in range(3)),
                      encoding="utf-8")
    out.unlink(missing_ok=True)
    argv = ["run", str(source), "--model", "openai:gpt-4o-mini", "--base-url", base_url, "--api-key-env",
            "GATEWAY_KEY", "--out", str(out), "--backend", backend, "--no-progress", *extra]
    with anyio.fail_after(60):
        done = await anyio.run_process(command(*argv), env={**ENV, "GATEWAY_KEY": KEY}, check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


@pytest.mark.parametrize(
    ("flags", "path", "name"),
    [((), "/v1/responses", "Responses API"),
     (("--api", "responses"), "/v1/responses", "Responses API"),
     (("--api", "chat"), "/v1/chat/completions", "Chat Completions API")],
    ids=["default", "responses", "chat"],
)
async def test_openai_speaks_the_api_asked_for_and_says_which(
    anyio_backend: str, tmp_path: Path, flags: tuple[str, ...], path: str, name: str
) -> None:
    async with serve_mock(MockServerConfig(api_key=KEY)) as server:
        code, out, err = await _run(tmp_path, server.base_url, anyio_backend, *flags)
        hit = [request.path for request in server.requests]
    assert code == 0, out + err
    assert hit == [path] * 3
    assert f"  model openai:gpt-4o-mini, {name} at {server.base_url}" in out.splitlines()
    note = [line for line in err.splitlines() if "note: --model openai:gpt-4o-mini speaks" in line]
    if flags:  # chosen: nothing to point out
        assert note == [], err
    else:  # the default, through an endpoint that is not OpenAI's: said before the first call
        assert note == [
            "trio-batch-llm: note: --model openai:gpt-4o-mini speaks the Responses API (POST /responses) "
            f"to {server.base_url}; a gateway that translates it may count several times the tokens of "
            "--api chat (the Chat Completions API); pass --api responses or --api chat to choose"
        ], err
        assert err.splitlines()[0] == note[0]  # before anything of the run itself
