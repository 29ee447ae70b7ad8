"""OpenRouter through every surface, on both backends, against the served mock's OpenRouter flavour
(issue 33): ``process_prompts``, ``process_stream``, ``call``, structured output, a durable run and a
command-line run, each meeting an error inside an HTTP 200 answer and retrying past it.

OpenRouter has no Batch API: its durable runs are live runs (docs/guides/providers.md#openrouter).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import BaseModel

from trio_batch_llm import (
    ArtifactIdentity,
    ProcessorConfig,
    RateLimitConfig,
    RetryConfig,
    call,
    llm,
    open_run,
    process_prompts,
    process_stream,
)
from trio_batch_llm.mock import MockServer, MockServerConfig, serve_mock

from ..cli.test_cli import ENV as CLI_ENV
from ..cli.test_cli import command as cli_command

pytestmark = pytest.mark.anyio

KEY = "sk-or-v1-surfaces-0123456789"
FAST = ProcessorConfig(concurrency=4, retry=RetryConfig(max_attempts=3, initial_wait=0.0, max_wait=0.0),
                       rate_limit=RateLimitConfig(cooldown_seconds=0.05, slow_start_seconds=0.0))
PROMPTS = ["a [[error_in_200:429x1]]", "b [[no_provider:502x1]]", "c plain"]


class Verdict(BaseModel):
    label: str
    score: int


def _router(server: MockServer, **kwargs: Any) -> Any:
    return llm("openrouter:vendor/mock-model", base_url=server.base_urls["openai"], api_key=KEY, **kwargs)


def _check(results: dict[str, Any]) -> None:
    assert sorted(results) == sorted(PROMPTS)
    assert all(r.success for r in results.values()), [r.error for r in results.values()]
    assert [results[p].attempts for p in PROMPTS] == [2, 2, 1]  # each error inside a 200 retried once
    assert all(str(r.output).startswith("echo:") for r in results.values())


async def test_process_prompts(anyio_backend: str) -> None:
    async with serve_mock(MockServerConfig(api_key=KEY)) as server:
        batch = await process_prompts(_router(server), PROMPTS, config=FAST)
    _check({PROMPTS[int(r.item_id.split("-")[1])]: r for r in batch.results})


async def test_process_stream(anyio_backend: str) -> None:
    async with serve_mock(MockServerConfig(api_key=KEY)) as server:  # a fresh server: markers fire again
        streamed = process_stream(_router(server), [(p, p) for p in PROMPTS], config=FAST)
        async with streamed as results:
            _check({r.item_id: r async for r in results})


async def test_call_and_structured_output(anyio_backend: str) -> None:
    async with serve_mock(MockServerConfig(api_key=KEY)) as server:
        assert await call(_router(server), "hello [[error_in_200:429x1]]", config=FAST) == \
            "echo: hello [[error_in_200:429x1]]"
        structured = _router(server, response_model=Verdict)
        verdict = await call(structured, "rate this [[error_in_200:502x1]]", config=FAST)
        assert isinstance(verdict, Verdict)


async def test_a_durable_run(anyio_backend: str, tmp_path: Path) -> None:
    async with serve_mock(MockServerConfig(api_key=KEY)) as server:
        identity = ArtifactIdentity(provider="openrouter", model="vendor/mock-model")
        async with await open_run(tmp_path / "runs.sqlite", "run", _router(server),
                                  [(p, p) for p in PROMPTS], identity=identity, config=FAST) as run:
            snap = await run.wait()
            results = {r.item_id: r.result for r in await run.read_results()}
    assert (snap.status, snap.succeeded) == ("completed", 3)
    _check(results)


async def test_a_command_line_run(anyio_backend: str, tmp_path: Path) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps({"id": p, "prompt": p}) + "\n" for p in PROMPTS))
    async with serve_mock(MockServerConfig(api_key=KEY)) as server:
        argv = ["run", str(source), "--model", "openrouter:vendor/mock-model",
                "--base-url", server.base_urls["openai"], "--api-key-env", "ROUTER_KEY",
                "--out", str(out), "--backend", anyio_backend, "--max-attempts", "3"]
        with anyio.fail_after(60):
            done = await anyio.run_process(cli_command(*argv), env={**CLI_ENV, "ROUTER_KEY": KEY},
                                           check=False)
    output = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 0, output
    assert KEY not in output and KEY not in out.read_text()
    records = [json.loads(line) for line in out.read_text().splitlines()]
    rows = {row["item_id"]: row for row in records if row["kind"] == "result"}
    assert sorted(rows) == sorted(PROMPTS), records
    assert all(row["result"]["success"] for row in rows.values()), records
