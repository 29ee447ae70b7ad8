"""The command line's providers: --model anthropic:/gemini:/openrouter:, --api chat|responses, and the key
rules of issue 16 for every provider (a key in the environment goes only to its own provider's host)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import anyio
import pytest

from trio_batch_llm import OpenAICompatibleStrategy
from trio_batch_llm._cli._command import UsageError
from trio_batch_llm._cli._main import build_parser, main
from trio_batch_llm._cli._run import RunPlan, plan_run
from trio_batch_llm.testing import MockServerConfig, serve_mock

from .test_cli import ENV, command

pytestmark = pytest.mark.anyio

MOCK_URL = "http://127.0.0.1:9/v1"  # never called by the planning tests
ENV_KEY = "sk-env-key-MUST-NOT-TRAVEL-0123456789"
NAMED_KEY = "sk-named-gateway-key-0123456789"


def _source(tmp_path: Path, n: int = 2) -> Path:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"prompt {i}"}) + "\n" for i in range(n)),
                      encoding="utf-8")
    return source


def _argv(tmp_path: Path, model: str, *extra: str) -> list[str]:
    return ["run", str(_source(tmp_path)), "--model", model, "--out", str(tmp_path / "out.jsonl"), *extra]


def _plan(tmp_path: Path, model: str, *extra: str) -> RunPlan:
    argv = _argv(tmp_path, model, *extra)
    return plan_run(build_parser().parse_args(argv), argv)


def test_help_names_every_provider_and_which_api(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for provider in ("openai-compatible", "openai", "anthropic", "gemini", "openrouter"):
        assert provider in text
    assert "--api {chat,responses}" in text
    assert "Chat Completions API" in text and "Responses API" in text
    assert "OPENROUTER_API_KEY" in text and "ANTHROPIC_API_KEY" in text


@pytest.mark.parametrize(
    ("model", "variable"),
    [("openrouter:vendor/some-model", "OPENROUTER_API_KEY"), ("openai-compatible:m", "OPENAI_API_KEY")],
)
def test_a_providers_key_in_the_environment_is_not_sent_to_another_base_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str, variable: str
) -> None:
    monkeypatch.setenv(variable, ENV_KEY)
    monkeypatch.setenv("GATEWAY_KEY", NAMED_KEY)
    strategy = _plan(tmp_path, model, "--base-url", MOCK_URL).strategy
    assert isinstance(strategy, OpenAICompatibleStrategy)
    assert strategy.secret is None
    named = _plan(tmp_path, model, "--base-url", MOCK_URL, "--api-key-env", "GATEWAY_KEY").strategy
    assert isinstance(named, OpenAICompatibleStrategy)
    assert named.secret is not None and named.secret.reveal() == NAMED_KEY


def test_openrouter_sends_its_own_key_to_openrouter_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENROUTER_API_KEY", ENV_KEY)
    monkeypatch.setenv("OPENAI_API_KEY", NAMED_KEY)
    plan = _plan(tmp_path, "openrouter:vendor/some-model")
    strategy = plan.strategy
    assert isinstance(strategy, OpenAICompatibleStrategy)
    assert strategy.base_url == "https://openrouter.ai/api/v1"
    assert strategy.secret is not None and strategy.secret.reveal() == ENV_KEY
    assert plan.endpoint == ("model openrouter:vendor/some-model, Chat Completions API at "
                             "https://openrouter.ai/api/v1")


def _secret_of(strategy: object) -> str | None:
    secret = getattr(strategy, "_secret", None)
    return secret.reveal() if secret is not None else None


@pytest.mark.skipif(importlib.util.find_spec("anthropic") is None, reason="the anthropic SDK is missing")
def test_anthropic_key_is_not_sent_to_a_mock_base_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", ENV_KEY)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    monkeypatch.setenv("GATEWAY_KEY", NAMED_KEY)
    # The SDK needs a key; ANTHROPIC_API_KEY is not for this host, so the run is refused before it starts.
    refused = "ANTHROPIC_API_KEY is sent only to https://api.anthropic.com"
    with pytest.raises(UsageError, match=refused) as info:
        _plan(tmp_path, "anthropic:claude-haiku-4-5", "--base-url", MOCK_URL)
    assert ENV_KEY not in str(info.value)
    plan = _plan(tmp_path, "anthropic:claude-haiku-4-5", "--base-url", MOCK_URL,
                 "--api-key-env", "GATEWAY_KEY")
    assert _secret_of(plan.strategy) == NAMED_KEY
    assert plan.endpoint == f"model anthropic:claude-haiku-4-5, Messages API at {MOCK_URL}"
    assert _secret_of(_plan(tmp_path, "anthropic:claude-haiku-4-5").strategy) == ENV_KEY


def test_gemini_is_refused_clearly_or_keeps_its_key_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", ENV_KEY)
    monkeypatch.setenv("GOOGLE_API_KEY", ENV_KEY)
    monkeypatch.setenv("GATEWAY_KEY", NAMED_KEY)
    if importlib.util.find_spec("trio_batch_llm._strategies.gemini._strategy") is None:
        with pytest.raises(UsageError, match=r"--model gemini:gemini-2.5-flash: .*trio-batch-llm\[gemini\]"):
            _plan(tmp_path, "gemini:gemini-2.5-flash", "--base-url", MOCK_URL)
        return
    refusal = ""
    try:
        strategy = _plan(tmp_path, "gemini:gemini-2.5-flash", "--base-url", MOCK_URL).strategy
    except UsageError as exc:  # a strategy that needs a key refuses, as Anthropic's does
        refusal = str(exc)
    else:
        assert _secret_of(strategy) is None
    assert ENV_KEY not in refusal
    named = _plan(tmp_path, "gemini:gemini-2.5-flash", "--base-url", MOCK_URL, "--api-key-env", "GATEWAY_KEY")
    assert _secret_of(named.strategy) == NAMED_KEY


@pytest.mark.parametrize("model", ["anthropic:claude-haiku-4-5", "gemini:gemini-2.5-flash"])
def test_api_is_for_openais_wire_format_only(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, model: str
) -> None:
    code = main(_argv(tmp_path, model, "--base-url", MOCK_URL, "--api-key-env", "PATH", "--api", "responses"))
    output = capsys.readouterr().err
    assert code == 2
    assert "--api responses applies to OpenAI's wire format" in output
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.skipif(importlib.util.find_spec("anthropic") is None, reason="the anthropic SDK is missing")
def test_a_request_flag_a_provider_cannot_send_is_refused_by_its_flag(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = _argv(tmp_path, "anthropic:claude-haiku-4-5", "--base-url", MOCK_URL, "--api-key-env", "PATH",
                 "--temperature", "0.3")
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert "--temperature is not supported with --model anthropic:claude-haiku-4-5" in error, error
    assert not (tmp_path / "out.jsonl").exists()


def test_an_unknown_provider_names_the_known_ones(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(_argv(tmp_path, "mistral:large")) == 2
    assert "known: openai-compatible, openai, anthropic, gemini, openrouter" in capsys.readouterr().err


async def _cli(*args: str, env: dict[str, str]) -> tuple[int, str]:
    with anyio.fail_after(60):
        done = await anyio.run_process(command(*args), env=env, check=False)
    return done.returncode, done.stdout.decode() + done.stderr.decode()


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_a_cli_run_says_which_api_and_keeps_the_key_home(
    anyio_backend: str, tmp_path: Path, api: str
) -> None:
    # The mock accepts exactly the key in the environment: had the CLI sent it, the calls would succeed.
    env = {**ENV, "OPENROUTER_API_KEY": ENV_KEY, "GATEWAY_KEY": ENV_KEY}
    async with serve_mock(MockServerConfig(api_key=ENV_KEY)) as server:
        argv = _argv(tmp_path, "openrouter:vendor/mock-model", "--base-url", server.base_url, "--api", api,
                     "--backend", anyio_backend)
        code, output = await _cli(*argv, env=env)
        assert code != 0, output
        assert "authentication" in output
        assert "OPENROUTER_API_KEY goes only to https://openrouter.ai" in output
        api_name = "Chat Completions API" if api == "chat" else "Responses API"
        assert f"model openrouter:vendor/mock-model, {api_name} at {server.base_url}" in output
        assert ENV_KEY not in output
        paths = {request.path for request in server.requests}
        assert paths == {"/v1/chat/completions" if api == "chat" else "/v1/responses"}

        (tmp_path / "out.jsonl").unlink()
        code, output = await _cli(*argv, "--api-key-env", "GATEWAY_KEY", env=env)
        assert code == 0, output
        assert re.search(r"succeeded 2\b", output), output


async def test_runs_start_says_which_api_it_drove(anyio_backend: str, tmp_path: Path) -> None:
    env = {**ENV, "GATEWAY_KEY": NAMED_KEY}
    async with serve_mock(MockServerConfig(api_key=NAMED_KEY)) as server:
        argv = ["runs", "start", str(tmp_path / "runs.db"), "r1", str(_source(tmp_path)), "--model",
                "openai-compatible:mock-model", "--base-url", server.base_url, "--api", "responses",
                "--api-key-env", "GATEWAY_KEY", "--backend", anyio_backend]
        code, output = await _cli(*argv, env=env)
    assert code == 0, output
    assert f"model openai-compatible:mock-model, Responses API at {server.base_url}" in output
    assert {request.path for request in server.requests} == {"/v1/responses"}
