"""Durable runs through Anthropic's Message Batches (issue 33, point 5), against the served mock.

Both backends on real clocks (served sockets need one); nothing waits on a
wall-clock sleep to pass: batches end at the first request after their
creation (``batch_latency=0``) and polls are 50 ms apart.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from trio_batch_llm import ErrorCategory, ProcessorConfig, ProviderBatchConfig, RetryConfig
from trio_batch_llm._cli import _args as _cli_args
from trio_batch_llm._runs import Run, iter_run_results, open_run
from trio_batch_llm._strategies._batch import BatchInfo
from trio_batch_llm._strategies.anthropic._batch_api import AnthropicBatchEndpoint, custom_id_of
from trio_batch_llm._strategies.anthropic._strategy import AnthropicStrategy
from trio_batch_llm.mock import MockServer, MockServerConfig, serve_mock

from .._runs_child import IDENTITY
from ..cli.test_cli import ENV as CLI_ENV
from ..cli.test_cli import command as cli_command

pytestmark = pytest.mark.anyio

RETRY = RetryConfig(max_attempts=3, initial_wait=0.05, max_wait=0.05, jitter=False)
KEY = "sk-ant-mock-key-123456"


def _strategy(server: MockServer) -> AnthropicStrategy:
    return AnthropicStrategy("claude-mock", base_url=server.url, api_key=KEY)


async def _open(db: Path, strategy: Any, source: Any, *, request_timeout: float = 5.0) -> Run:
    return await open_run(
        db, "run", strategy, source, mode="provider-batch", identity=IDENTITY,
        config=ProcessorConfig(concurrency=4, retry=RETRY), poll_interval=0.05,
        batch=ProviderBatchConfig(poll_interval=0.05, request_timeout=request_timeout),
    )


def _results(db: Path) -> dict[str, Any]:
    results = list(iter_run_results(db, "run"))
    assert Counter(r.item_id for r in results) == Counter({r.item_id: 1 for r in results})  # exactly once
    return {r.item_id: r.result for r in results}


async def test_a_run_maps_succeeded_errored_and_expired_lines(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    prompts = ["p0", "p1 [[fail:400]]", "p2 [[fail:529]]", "p3", "p4", "p5"]
    async with serve_mock(MockServerConfig(batch_outcomes=("expired",), api_key=KEY)) as server:
        async with await _open(db, _strategy(server), prompts) as run:
            assert (await run.wait()).status == "completed"
        batches = server.app.provider_batches.anthropic.batches
    results = _results(db)
    assert sorted(results) == [f"item-{i}" for i in range(6)]
    # The first batch expired after its first half: p3..p5 went into a later batch, with no attempt used.
    assert batches[0]["request_counts"] == {"processing": 0, "succeeded": 1, "errored": 2, "canceled": 0,
                                            "expired": 3}
    assert [results[f"item-{i}"].attempts for i in (3, 4, 5)] == [1, 1, 1]
    assert results["item-0"].success and results["item-0"].output == "echo: p0"
    assert results["item-0"].token_usage["input_tokens"] > 0
    assert results["item-0"].metadata["batch_id"] == batches[0]["id"]
    refused = results["item-1"]
    assert not refused.success and refused.error_category is ErrorCategory.INVALID_REQUEST
    assert refused.attempts == 1  # a 400 is final
    overloaded = results["item-2"]  # 529 overloaded: retried in a new batch, until attempts run out
    assert not overloaded.success and overloaded.attempts == 3
    assert all(results[f"item-{i}"].success for i in (0, 3, 4, 5))


async def test_an_unknown_create_is_found_once_its_batch_has_ended(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    config = MockServerConfig(batch_create_faults=("hang_after_create",))
    async with serve_mock(config) as server:
        async with await _open(db, _strategy(server), ["p0", "p1", "p2"], request_timeout=1.0) as run:
            assert (await run.wait()).status == "completed"
        batches = server.app.provider_batches.anthropic.batches
    assert len(batches) == 1  # found by its tagged custom ids, never submitted twice
    assert all(r.success and r.metadata["batch_id"] == batches[0]["id"] for r in _results(db).values())


async def test_an_unknown_create_that_made_nothing_waits_for_the_operator(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    config = MockServerConfig(batch_create_faults=("hang_before_create",))
    async with serve_mock(config) as server:
        async with await _open(db, _strategy(server), ["p0", "p1"], request_timeout=0.5) as run:
            with pytest.raises(TimeoutError):
                await run.wait(timeout=2)
            snap = await run.snapshot()
            assert snap.unresolved_submission is not None and snap.done == 0
            assert server.app.provider_batches.anthropic.batches == []  # nothing new was submitted
            await run.resolve_submission(created=False)
            assert (await run.wait()).status == "completed"
        assert len(server.app.provider_batches.anthropic.batches) == 1
    assert all(r.success for r in _results(db).values())


async def test_a_new_handle_finds_the_batch_a_stopped_one_created(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    config = MockServerConfig(batch_create_faults=("hang_after_create",))
    async with serve_mock(config) as server:
        strategy = _strategy(server)
        # The handle stops while its create hangs (as a crash would leave it: the intent recorded,
        # the batch made); the next handle resolves the intent by finding the batch.
        async with await _open(db, strategy, ["p0", "p1", "p2"], request_timeout=30.0) as run:
            with pytest.raises(TimeoutError):
                await run.wait(timeout=1)
        assert len(server.app.provider_batches.anthropic.batches) == 1
        async with await _open(db, strategy, ["p0", "p1", "p2"]) as again:
            assert (await again.wait()).status == "completed"
        assert len(server.app.provider_batches.anthropic.batches) == 1
    assert len(_results(db)) == 3


async def test_cancel_cancels_the_open_batch_at_the_provider(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    async with serve_mock(MockServerConfig(batch_latency=3600.0)) as server:
        async with await _open(db, _strategy(server), ["p0", "p1"]) as run:
            with pytest.raises(TimeoutError):
                await run.wait(timeout=1)
            await run.cancel()
        [batch] = server.app.provider_batches.anthropic.batches
    assert batch["processing_status"] in ("canceling", "ended")
    assert batch["cancel_initiated_at"] is not None


def _line(custom_id: str, result: dict[str, Any]) -> bytes:
    return json.dumps({"custom_id": "tag_" + custom_id, "result": result}).encode() + b"\n"


def test_canceled_and_expired_lines_never_ran_and_errored_lines_read_as_live_errors() -> None:
    endpoint = AnthropicBatchEndpoint(AnthropicStrategy("claude-mock", base_url="http://mock",
                                                        api_key=KEY))
    ids = ["a", "b", "c", "d"]
    error = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
    content = (_line(custom_id_of("a"), {"type": "canceled"}) + _line(custom_id_of("b"), {"type": "expired"})
               + _line(custom_id_of("c"), {"type": "errored", "error": error}) + b"not json\n")
    outcomes = endpoint.decode_results(BatchInfo(id="msgbatch_1", status="ended", terminal=True),
                                       [content], ids)
    assert sorted(outcomes) == ["a", "b", "c"]  # "d" has no readable line: it is tried again
    assert not outcomes["a"].executed and not outcomes["b"].executed
    assert outcomes["c"].executed and outcomes["c"].error is not None
    assert outcomes["c"].error.category is ErrorCategory.RATE_LIMIT


def test_custom_ids_fit_anthropics_pattern_whatever_the_item_id() -> None:
    for item_id in ("item-1", "a/b c?é", "x" * 500):
        custom_id = custom_id_of(item_id)
        assert len("t" * 20 + "_" + custom_id) <= 64
        assert custom_id.isalnum()


async def test_find_never_adopts_another_clients_batch(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    config = MockServerConfig(batch_create_faults=("ok", "hang_before_create"))
    async with serve_mock(config) as server:
        # Someone else's batch on the same key, of the same size, already ended.
        async with httpx2.AsyncClient(base_url=server.url) as client:
            params = {"model": "claude-mock", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
            body = {"requests": [{"custom_id": f"theirs-{i}", "params": params} for i in range(2)]}
            made = await client.post("/v1/messages/batches", json=body,
                                     headers={"anthropic-version": "2023-06-01"})
            assert made.status_code == 200
            await client.get(f"/v1/messages/batches/{made.json()['id']}")  # it ends
        async with await _open(db, _strategy(server), ["p0", "p1"], request_timeout=0.5) as run:
            with pytest.raises(TimeoutError):
                await run.wait(timeout=2)
            assert (await run.snapshot()).unresolved_submission is not None  # not "found" in theirs
        assert len(server.app.provider_batches.anthropic.batches) == 1


@pytest.mark.skipif("anthropic" not in getattr(_cli_args, "PROVIDERS", ("anthropic",)),
                    reason="the command line's anthropic: models land with fix33-router")
async def test_runs_start_in_provider_batch_mode_on_the_command_line(anyio_backend: str,
                                                                    tmp_path: Path) -> None:
    db, source = tmp_path / "runs.sqlite", tmp_path / "in.jsonl"
    rows = (json.dumps({"id": f"q{i}", "prompt": f"question {i}"}) + "\n" for i in range(5))
    source.write_text("".join(rows), encoding="utf-8")
    env = {**CLI_ENV, "MY_KEY": KEY}
    async with serve_mock(MockServerConfig(api_key=KEY)) as server:
        argv = ["runs", "start", str(db), "cli-run", str(source), "--model", "anthropic:claude-haiku-4-5",
                "--base-url", server.base_urls["anthropic"], "--api-key-env", "MY_KEY",
                "--mode", "provider-batch", "--batch-size", "2", "--poll-interval", "0.05",
                "--backend", anyio_backend]
        with anyio.fail_after(120):
            done = await anyio.run_process(cli_command(*argv), env=env, check=False)
        output = done.stdout.decode() + done.stderr.decode()
        assert done.returncode == 0, output
        assert len(server.app.provider_batches.anthropic.batches) == 3  # 2 + 2 + 1 requests
        assert KEY not in output
    results = {r.item_id: r.result for r in iter_run_results(db, "cli-run")}
    assert sorted(results) == [f"q{i}" for i in range(5)] and all(r.success for r in results.values())
