"""The command line's request flags (--system, --temperature, --max-tokens, --response-schema), the
identity that covers them, and the estimated cost in its summary."""

from __future__ import annotations

import json
import re
from pathlib import Path

import anyio
import pytest

from trio_batch_llm import OpenAICompatibleStrategy, infer_artifact_identity, open_run
from trio_batch_llm._cli._main import build_parser, main
from trio_batch_llm._cli._request_flags import _takes_response_model, checkpoint_identity
from trio_batch_llm._cli._run import plan_run
from trio_batch_llm.testing import MockServerConfig, serve_mock

from .test_cli import records, spawn

pytestmark = pytest.mark.anyio

MODEL = "gpt-4o-mini"  # in the built-in rate table: the summary prices it
DEAD_URL = "http://127.0.0.1:9/v1"
FLAGS = ("--system", "Be brief.", "--temperature", "0.3", "--max-tokens", "17")


def _source(tmp_path: Path, n: int = 3) -> Path:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"prompt {i}"}) + "\n" for i in range(n)),
                      encoding="utf-8")
    return source


def _run_argv(tmp_path: Path, *extra: str, base_url: str = DEAD_URL) -> list[str]:
    return ["run", str(_source(tmp_path)), "--model", f"openai-compatible:{MODEL}", "--base-url", base_url,
            "--out", str(tmp_path / "out.jsonl"), *extra]


def _main(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_flags_become_the_strategy_defaults_and_part_of_the_identity(tmp_path: Path) -> None:
    argv = _run_argv(tmp_path, *FLAGS)
    plan = plan_run(build_parser().parse_args(argv), argv)
    strategy = plan.strategy
    assert isinstance(strategy, OpenAICompatibleStrategy)
    settings = (strategy.system_prompt, strategy.temperature, strategy.max_output_tokens)
    assert settings == ("Be brief.", 0.3, 17)
    assert plan.identity == checkpoint_identity("openai-compatible", MODEL, strategy)
    assert plan.identity.prompt_version == infer_artifact_identity(strategy).prompt_version is not None
    bare_argv = _run_argv(tmp_path)
    bare = plan_run(build_parser().parse_args(bare_argv), bare_argv).identity
    # Without request flags the identity is the bare (provider, model) of earlier checkpoints.
    assert (bare.provider, bare.model, bare.prompt_version, bare.parser_version) == (
        "openai-compatible", MODEL, None, None)


SCHEMA_CASES = [
    ("missing", None, "schema.json: no such file"),
    ("not json", '{"type": "object",\n  "properties": }', "schema.json: not JSON (line 2, column 17"),
    ("not an object", "[1, 2]", "schema.json: a JSON schema must be a non-empty JSON object, got list"),
    ("not a schema", '{"name": "x"}', 'schema.json: not a JSON schema (no "type"'),
]


@pytest.mark.parametrize(("case", "text", "message"), SCHEMA_CASES, ids=[c[0] for c in SCHEMA_CASES])
def test_a_bad_response_schema_is_refused_before_anything_runs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str, text: str | None, message: str
) -> None:
    schema = tmp_path / "schema.json"
    if text is not None:
        schema.write_text(text, encoding="utf-8")
    code, output = _main(capsys, _run_argv(tmp_path, "--response-schema", str(schema)))
    assert code == 2, output
    assert f"--response-schema {schema}" in output and message in output
    assert not (tmp_path / "out.jsonl").exists()


def test_a_good_response_schema_reaches_the_strategy(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    schema = tmp_path / "schema.json"
    body = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}
    schema.write_text(json.dumps(body), encoding="utf-8")
    argv = _run_argv(tmp_path, "--response-schema", str(schema))
    if not _takes_response_model():  # structured output comes with the requests work of issue 18
        code, output = _main(capsys, argv)
        assert code == 2 and "no structured output" in output
        return
    plan = plan_run(build_parser().parse_args(argv), argv)
    assert getattr(plan.strategy, "response_model", None) == body
    assert plan.identity.parser_version is not None


async def test_run_sends_the_flags_prices_the_run_and_refuses_other_settings_on_resume(
    anyio_backend: str, tmp_path: Path
) -> None:
    out = tmp_path / "out.jsonl"
    async with serve_mock(MockServerConfig(model=MODEL)) as server:
        argv = [*_run_argv(tmp_path, *FLAGS, base_url=server.base_url), "--backend", anyio_backend]
        async with spawn(*argv) as cli:
            pass
        assert cli.returncode == 0, cli.output
        bodies = [request.body for request in server.requests]
        assert len(bodies) == 3
        for sent in bodies:
            assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
            assert sent["temperature"] == 0.3
            assert 17 in (sent.get("max_tokens"), sent.get("max_completion_tokens"))
        # gpt-4o-mini: $0.15 per million input tokens, $0.60 per million output tokens.
        usages = [r["result"]["token_usage"] for r in records(out)]
        dollars = sum(u["input_tokens"] * 0.15 + u["output_tokens"] * 0.60 for u in usages) / 1e6
        assert dollars > 0
        shown = re.search(r"cost +\$(\d+\.\d{4}) +estimated, built-in rates of \d{4}-\d{2}-\d{2}", cli.output)
        assert shown is not None, cli.output
        assert float(shown.group(1)) == pytest.approx(dollars, abs=5e-5)

        other = [*_run_argv(tmp_path, "--system", "Be verbose.", base_url=server.base_url), "--resume",
                 "--backend", anyio_backend]
        async with spawn(*other) as again:
            pass
        assert again.returncode == 2, again.output
        assert "written with other request settings" in again.output
        assert len(server.requests) == 3  # nothing was sent


def test_runs_start_refuses_other_request_settings_than_the_stored_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db, source = tmp_path / "runs.sqlite", _source(tmp_path)

    async def create() -> None:
        strategy = OpenAICompatibleStrategy(MODEL, base_url=DEAD_URL, system_prompt="A")
        identity = checkpoint_identity("openai-compatible", MODEL, strategy)
        async with await open_run(db, "r", strategy, None, identity=identity):
            pass

    anyio.run(create)
    base = ["runs", "start", str(db), "r", str(source), "--model", f"openai-compatible:{MODEL}",
            "--base-url", DEAD_URL]
    code, output = _main(capsys, [*base, "--system", "B"])
    assert code == 2, output
    assert "run 'r' was started with other request settings (--system, --temperature" in output


def test_the_help_lists_the_request_flags(capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["run"], ["runs", "start"]):
        assert main([*command, "--help"]) == 0
        shown = capsys.readouterr().out
        for flag in ("--system", "--temperature", "--max-tokens", "--response-schema"):
            assert flag in shown


def test_runs_status_prices_a_live_run_by_its_model(tmp_path: Path) -> None:
    import dataclasses

    from trio_batch_llm import read_run_snapshot
    from trio_batch_llm._cli._render import describe

    db = tmp_path / "runs.sqlite"

    async def create() -> None:
        strategy = OpenAICompatibleStrategy(MODEL, base_url=DEAD_URL)
        async with await open_run(db, "r", strategy, None):
            pass

    anyio.run(create)
    snap = dataclasses.replace(read_run_snapshot(db, "r"), input_tokens=2_000_000, output_tokens=500_000)
    # gpt-4o-mini: 2,000,000 x $0.15/M + 500,000 x $0.60/M = $0.30 + $0.30
    assert "  cost: at most $0.6000 estimated (built-in rates of" in "\n".join(describe(snap))
    other = dataclasses.replace(snap, identity=dataclasses.replace(snap.identity, model="mock-model"))
    assert not any("cost" in line for line in describe(other))
    batch = dataclasses.replace(snap, mode="provider-batch")
    assert not any("cost" in line for line in describe(batch))
