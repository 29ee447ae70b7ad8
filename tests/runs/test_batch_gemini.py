"""Durable runs through Gemini's batch mode (issue 33, point 5), against the served mock.

Both backends on real clocks (served sockets need one); nothing waits on a
wall-clock sleep to pass: batches finish at the first request after their
creation (``batch_latency=0``) and polls are 50 ms apart.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

from trio_batch_llm import ErrorCategory, ProcessorConfig, ProviderBatchConfig, RetryConfig
from trio_batch_llm._cli import _args as _cli_args
from trio_batch_llm._runs import Run, iter_run_results, open_run
from trio_batch_llm._strategies._batch import BatchInfo
from trio_batch_llm._strategies.gemini._batch_api import GeminiBatchEndpoint
from trio_batch_llm._strategies.gemini._strategy import GeminiStrategy
from trio_batch_llm.mock import MockServer, MockServerConfig, serve_mock

from .._runs_child import IDENTITY
from ..cli.test_cli import ENV as CLI_ENV
from ..cli.test_cli import command as cli_command

pytestmark = pytest.mark.anyio

RETRY = RetryConfig(max_attempts=3, initial_wait=0.05, max_wait=0.05, jitter=False)
KEY = "gemini-mock-key-123456"


def _strategy(server: MockServer) -> GeminiStrategy:
    return GeminiStrategy("gemini-mock", base_url=server.url, api_key=KEY)


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


def _batches(server: MockServer) -> list[dict[str, Any]]:
    return server.app.provider_batches.gemini.batches


async def test_a_run_maps_answered_failed_and_expired_requests(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    prompts = ["p0", "p1 [[fail:400]]", "p2 [[fail:503]]", "p3", "p4", "p5"]
    async with serve_mock(MockServerConfig(batch_outcomes=("expired",), api_key=KEY)) as server:
        async with await _open(db, _strategy(server), prompts) as run:
            assert (await run.wait()).status == "completed"
        batches = _batches(server)
    results = _results(db)
    assert sorted(results) == [f"item-{i}" for i in range(6)]
    first = batches[0]["metadata"]
    assert first["state"] == "BATCH_STATE_EXPIRED"
    assert len(first["output"]["inlinedResponses"]["inlinedResponses"]) == 3
    # p3..p5 never ran in the expired batch: a later batch answered them, with no attempt used.
    assert [results[f"item-{i}"].attempts for i in (3, 4, 5)] == [1, 1, 1]
    assert results["item-0"].success and results["item-0"].output == "echo: p0"
    assert results["item-0"].token_usage["input_tokens"] > 0
    assert results["item-0"].metadata["batch_id"] == batches[0]["name"]
    refused = results["item-1"]
    assert not refused.success and refused.error_category is ErrorCategory.INVALID_REQUEST
    assert refused.attempts == 1  # INVALID_ARGUMENT is final
    unavailable = results["item-2"]  # 503 UNAVAILABLE: retried in new batches until attempts run out
    assert not unavailable.success and unavailable.attempts == 3
    assert all(results[f"item-{i}"].success for i in (0, 3, 4, 5))


async def test_an_unknown_create_is_found_by_its_display_name(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    config = MockServerConfig(batch_create_faults=("hang_after_create",))
    async with serve_mock(config) as server:
        async with await _open(db, _strategy(server), ["p0", "p1", "p2"], request_timeout=1.0) as run:
            assert (await run.wait()).status == "completed"
        batches = _batches(server)
    assert len(batches) == 1  # never submitted twice
    assert all(r.success and r.metadata["batch_id"] == batches[0]["name"] for r in _results(db).values())


async def test_an_unknown_create_that_made_nothing_waits_for_the_operator(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    config = MockServerConfig(batch_create_faults=("hang_before_create",))
    async with serve_mock(config) as server:
        async with await _open(db, _strategy(server), ["p0", "p1"], request_timeout=0.5) as run:
            with pytest.raises(TimeoutError):
                await run.wait(timeout=2)
            snap = await run.snapshot()
            assert snap.unresolved_submission is not None and snap.done == 0
            assert _batches(server) == []  # nothing new was submitted
            await run.resolve_submission(created=False)
            assert (await run.wait()).status == "completed"
        assert len(_batches(server)) == 1
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
        assert len(_batches(server)) == 1
        async with await _open(db, strategy, ["p0", "p1", "p2"]) as again:
            assert (await again.wait()).status == "completed"
        assert len(_batches(server)) == 1
    assert len(_results(db)) == 3


async def test_cancel_cancels_the_open_batch_at_the_provider(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    async with serve_mock(MockServerConfig(batch_latency=3600.0)) as server:
        async with await _open(db, _strategy(server), ["p0", "p1"]) as run:
            with pytest.raises(TimeoutError):
                await run.wait(timeout=1)
            await run.cancel()
        [batch] = _batches(server)
    assert batch["metadata"]["state"] == "BATCH_STATE_CANCELLED"


def test_a_cancelled_batch_s_unanswered_requests_never_ran_and_errors_read_as_live() -> None:
    endpoint = GeminiBatchEndpoint(GeminiStrategy("gemini-mock", base_url="http://mock", api_key=KEY))
    quota = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "30s"}
    operation = {"name": "batches/b1", "metadata": {"state": "BATCH_STATE_CANCELLED", "output": {
        "inlinedResponses": {"inlinedResponses": [
            {"error": {"code": 8, "message": "quota", "details": [quota]}, "metadata": {"key": "a"}},
        ]}}}}
    info = BatchInfo(id="batches/b1", status="BATCH_STATE_CANCELLED", terminal=True)
    outcomes = endpoint.decode_results(info, [json.dumps(operation).encode()], ["a", "b"])
    assert outcomes["a"].executed and outcomes["a"].error is not None
    assert outcomes["a"].error.category is ErrorCategory.RATE_LIMIT
    assert outcomes["a"].error.retry_after == 30.0
    assert not outcomes["b"].executed  # cancelled before it ran: no attempt used


async def test_batches_stay_under_the_endpoint_s_own_request_size_cap(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Gemini takes inline requests up to its cap (20 MB) per batch, far under max_file_bytes' default
    # (OpenAI's 200 MB): a run must chunk by the smaller, or every create is refused. Here a 600-byte cap.
    monkeypatch.setattr(GeminiBatchEndpoint, "max_file_bytes", 600)
    db = tmp_path / "runs.sqlite"
    async with serve_mock() as server:
        async with await _open(db, _strategy(server), [f"p{i}" for i in range(8)]) as run:
            assert (await run.wait()).status == "completed"
        batches = _batches(server)
    assert len(batches) > 1
    assert all(len(json.dumps(b["metadata"]["output"])) > 0 for b in batches)
    assert len(_results(db)) == 8 and all(r.success for r in _results(db).values())


def test_the_display_name_keeps_the_submission_pair_and_stays_short() -> None:
    from trio_batch_llm._strategies.gemini._batch_api import display_name_of

    name = display_name_of({"trio_batch_llm_submission": "a" * 32, "run_id": "r" * 512})
    assert json.loads(name) == {"trio_batch_llm_submission": "a" * 32} and len(name) <= 128
    assert json.loads(display_name_of({"s": "1", "run_id": "run"})) == {"s": "1", "run_id": "run"}


@pytest.mark.skipif("gemini" not in getattr(_cli_args, "PROVIDERS", ("gemini",)),
                    reason="the command line's gemini: models land with fix33-router")
async def test_runs_start_in_provider_batch_mode_on_the_command_line(anyio_backend: str,
                                                                    tmp_path: Path) -> None:
    db, source = tmp_path / "runs.sqlite", tmp_path / "in.jsonl"
    rows = (json.dumps({"id": f"q{i}", "prompt": f"question {i}"}) + "\n" for i in range(5))
    source.write_text("".join(rows), encoding="utf-8")
    env = {**CLI_ENV, "MY_KEY": KEY}
    async with serve_mock(MockServerConfig(api_key=KEY)) as server:
        argv = ["runs", "start", str(db), "cli-run", str(source), "--model", "gemini:gemini-2.5-flash",
                "--base-url", server.base_urls["gemini"], "--api-key-env", "MY_KEY",
                "--mode", "provider-batch", "--batch-size", "2", "--poll-interval", "0.05",
                "--backend", anyio_backend]
        with anyio.fail_after(120):
            done = await anyio.run_process(cli_command(*argv), env=env, check=False)
        output = done.stdout.decode() + done.stderr.decode()
        assert done.returncode == 0, output
        assert len(server.app.provider_batches.gemini.batches) == 3  # 2 + 2 + 1 requests
        assert KEY not in output
    results = {r.item_id: r.result for r in iter_run_results(db, "cli-run")}
    assert sorted(results) == [f"q{i}" for i in range(5)] and all(r.success for r in results.values())
