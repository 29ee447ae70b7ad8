"""GeminiStrategy end to end against the served mock's Gemini dialect, on both backends.

The mock's Gemini dialect is written from Google's documented wire format and shares no
code with the strategy, so a wire mistake on our side fails here. Real sockets, real
clock: nothing sleeps to pass (retry waits are a fraction of a second, asserted as
outcomes and counts, not as durations).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from pydantic import BaseModel

from trio_batch_llm import (
    ErrorCategory,
    GeminiContextCache,
    GeminiStrategy,
    ProcessorConfig,
    ProviderError,
    RetryConfig,
    StopReason,
    call,
    llm,
    process_prompts,
    process_stream,
)
from trio_batch_llm.mock import MockOpenAIApp, MockServer, MockServerConfig, serve_mock

from .._paths import ROOT
from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio

KEY = "gm-mock-KEY-never-shown-77"
MODEL = "gemini-2.5-flash"
HANDBOOK = "Staff handbook, chapter one: the office opens at nine and closes at five. " * 30


class Capital(BaseModel):
    city: str


def strategy_for(server: MockServer, **kwargs: Any) -> GeminiStrategy:
    kwargs.setdefault("api_key", KEY)
    return GeminiStrategy(MODEL, base_url=server.url, **kwargs)


def fast_retries(**kwargs: Any) -> ProcessorConfig:
    return ProcessorConfig(retry=RetryConfig(max_attempts=3, initial_wait=0.01, max_wait=0.05, **kwargs))


async def caches_left(server: MockServer) -> list[Any]:
    async with httpx2.AsyncClient() as client:
        reply = await client.get(f"{server.url}/v1beta/cachedContents", headers={"x-goog-api-key": KEY})
    assert reply.status_code == 200, reply.text
    return list(reply.json().get("cachedContents") or [])


async def test_process_prompts_stream_and_call_speak_the_gemini_dialect() -> None:
    async with serve_mock(MockServerConfig(api_key=KEY)) as server:
        strategy = strategy_for(server, system_prompt="Answer briefly.", max_output_tokens=64)
        batch = await process_prompts(strategy, [f"question {n}" for n in range(5)], concurrency=3)
        assert [r.success for r in batch] == [True] * 5, [r.error for r in batch]
        first = batch.in_input_order()[0]
        assert first.output and first.token_usage["input_tokens"] > 0
        assert first.token_usage["output_tokens"] > 0
        assert first.metadata["model"] and first.details is not None
        async with process_stream(strategy, ["s1", "s2", "s3"], concurrency=2) as results:
            streamed = [r async for r in results]
        assert sorted(r.item_id for r in streamed if r.success) == ["item-0", "item-1", "item-2"]
        assert isinstance(await call(strategy, "one more"), str)
        assert all(r.path.endswith(f"/models/{MODEL}:generateContent") for r in server.requests)
        assert all(KEY not in json.dumps(r.body) for r in server.requests)


async def test_structured_output_is_answered_in_the_schema_and_validated() -> None:
    async with serve_mock(MockServerConfig(api_key=KEY)) as server:
        strategy = strategy_for(server, response_model=Capital)
        answer: Any = await call(strategy, "capital of Norway?")
        assert isinstance(answer, Capital)
        batch = await process_prompts(strategy, ["a [[schema_violationx1]]", "b"], config=fast_retries())
        assert all(isinstance(r.output, Capital) for r in batch), [r.error for r in batch]
        assert [r.attempts for r in batch.in_input_order()] == [2, 1]  # the bad answer failed to parse


async def test_a_per_minute_429_is_waited_out_and_a_503_retried() -> None:
    async with serve_mock(MockServerConfig(api_key=KEY, retry_after=0.3)) as server:
        strategy = strategy_for(server)
        await strategy.prepare()
        try:
            with pytest.raises(ProviderError) as caught:
                await strategy.execute("direct [[fail:429x1]]", 1, None)
        finally:
            await strategy.cleanup()
        assert caught.value.category is ErrorCategory.RATE_LIMIT
        assert caught.value.retry_after == pytest.approx(0.3)  # RetryInfo.retryDelay "0.3s", in the body
        assert caught.value.stops_batch is None
        batch = await process_prompts(strategy, ["minute [[fail:429x1]]", "busy [[fail:503x1]]"],
                                      config=fast_retries())
        results = {r.item_id: r for r in batch}
        assert results["item-0"].success and results["item-0"].attempts == 2
        # The retry waited out Gemini's retryDelay, not only the 0.05 s backoff cap of fast_retries().
        waited = results["item-0"].timing.cooldown + results["item-0"].timing.backoff
        assert waited >= 0.3 - 0.01
        assert results["item-1"].success and results["item-1"].attempts == 2


async def test_a_per_day_429_says_it_stops_the_batch() -> None:
    async with serve_mock(MockServerConfig(api_key=KEY, gemini_daily_request_limit=1)) as server:
        strategy = strategy_for(server)
        assert isinstance(await call(strategy, "the day's only request"), str)
        await strategy.prepare()
        try:
            with pytest.raises(ProviderError) as caught:
                await strategy.execute("one too many", 1, None)
        finally:
            await strategy.cleanup()
        error = caught.value
        assert error.category is ErrorCategory.INSUFFICIENT_BALANCE and error.status_code == 429
        assert error.stops_batch is not None and "PerDay" in error.stops_batch
        one_at_a_time = dataclasses.replace(fast_retries(), concurrency=1)
        batch = await process_prompts(strategy, ["x", "y", "z"], config=one_at_a_time, preserve_order=True)
        assert [(r.success, r.error_category, r.stop_reason) for r in batch] == [
            (False, ErrorCategory.INSUFFICIENT_BALANCE, StopReason.PROVIDER_RETIRED),
            (False, ErrorCategory.NOT_EXECUTED, StopReason.PROVIDER_RETIRED),
            (False, ErrorCategory.NOT_EXECUTED, StopReason.PROVIDER_RETIRED),
        ]
        assert sum(r.attempts for r in batch) == 1  # never retried, nothing after it called
        assert batch.termination.kind == "provider_retired" and batch.termination.item_id == "item-0"
        assert "PerDay" in (batch.termination.reason or "")


async def test_the_context_cache_is_created_once_used_and_deleted() -> None:
    async with serve_mock(MockServerConfig(api_key=KEY)) as server:
        strategy = strategy_for(server, system_prompt=HANDBOOK, context_cache=GeminiContextCache(ttl=600))
        batch = await process_prompts(strategy, [f"q{n}" for n in range(6)], concurrency=3)
        assert all(r.success for r in batch), [r.error for r in batch]
        creates = [r for r in server.requests if r.method == "POST" and r.path.endswith("/cachedContents")]
        assert len(creates) == 1
        names = {r.metadata["cached_content"] for r in batch}
        assert len(names) == 1
        assert all(r.token_usage["cached_input_tokens"] > 0 for r in batch)
        assert all(r.token_usage["input_tokens"] > r.token_usage["cached_input_tokens"] for r in batch)
        assert await caches_left(server) == []
        stats = server.app.gemini.cache_statistics()
        assert (stats.created, stats.deleted, stats.used, stats.missing) == (1, 1, 6, 0)


async def test_the_context_cache_is_deleted_when_the_batch_is_cancelled() -> None:
    async with serve_mock(MockServerConfig(api_key=KEY)) as server:
        strategy = strategy_for(server, system_prompt=HANDBOOK, context_cache=True)
        with anyio.move_on_after(30) as scope:  # a bound only: the cancel comes from the wait below
            async with anyio.create_task_group() as group:
                async def run() -> None:
                    await process_prompts(strategy, ["never answers [[hang]]", "nor this [[hang]]"])

                group.start_soon(run)
                await server.wait_for_requests(2)  # the cache's create (and list) went out
                while not any(r.path.endswith(":generateContent") for r in server.requests):
                    await server.wait_for_requests(len(server.requests) + 1)
                group.cancel_scope.cancel()
        assert not scope.cancelled_caught
        assert await caches_left(server) == []


async def test_a_cache_gemini_refuses_fails_the_batch_before_any_call_and_leaves_nothing() -> None:
    async with serve_mock(MockServerConfig(api_key=KEY, gemini_min_cache_tokens=100_000)) as server:
        strategy = strategy_for(server, system_prompt=HANDBOOK, context_cache=True)
        with pytest.raises(ProviderError) as caught:
            await process_prompts(strategy, ["a", "b"])
        assert caught.value.category is ErrorCategory.INVALID_REQUEST and "too small" in str(caught.value)
        assert not any(r.path.endswith(":generateContent") for r in server.requests)
        assert await caches_left(server) == []
        stats = server.app.gemini.cache_statistics()
        assert (stats.created, stats.refused_small) == (0, 1)


@pytest.mark.parametrize("anyio_backend", [pytest.param(trio_virtual_clock(), id="trio-virtual")])
async def test_the_mock_sees_the_cache_renewed_before_its_ttl_runs_out() -> None:
    """The mock's app in process (no sockets), on Trio's virtual clock: hours of batch in no real time.
    The mock expires caches by its own clock, so a late renewal would show as an expired cache."""
    app = MockOpenAIApp(MockServerConfig(api_key=KEY))
    client = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app))
    strategy = GeminiStrategy(MODEL, base_url="http://mock", client=client, api_key=KEY,
                              system_prompt=HANDBOOK, context_cache=GeminiContextCache(ttl=600))
    started = anyio.current_time()
    batch = await process_prompts(strategy, ["a short batch"])
    assert batch.in_input_order()[0].success

    async def slow_source() -> Any:  # a longer batch: one item a minute for 41 minutes
        for n in range(41):
            await anyio.sleep(60)
            yield f"minute {n}"

    async with process_stream(strategy, slow_source()) as results:
        finished = [r async for r in results]
    assert len(finished) == 41 and all(r.success for r in finished), [r.error for r in finished][:3]
    stats = app.gemini.cache_statistics()
    assert (stats.expired, stats.missing) == (0, 0)  # never used after its TTL
    assert stats.created == 2 and stats.deleted == 2  # one per batch, each deleted at its end
    short, long = app.gemini.caches.records
    assert short.renewals == [] and short.created == started
    # 41 minutes on a 10-minute TTL, renewed by the first call once half of it is gone: every 5 minutes.
    assert [t - long.created for t in long.renewals] == [300.0 * n for n in range(1, 9)]
    await client.aclose()


async def test_a_google_genai_client_runs_on_both_backends_over_our_httpx2_client() -> None:
    genai = pytest.importorskip("google.genai")
    config = MockServerConfig(api_key=KEY, retry_after=0.2)
    async with serve_mock(config) as server, httpx2.AsyncClient() as http:
        client = genai.Client(api_key=KEY, http_options=genai.types.HttpOptions(
            base_url=server.url, api_version="v1beta", httpx_async_client=http))
        strategy = GeminiStrategy(MODEL, client=client, response_model=Capital)
        answer: Any = await call(strategy, "capital of Chile?")
        assert isinstance(answer, Capital)
        with pytest.raises(ProviderError) as caught:
            await strategy.execute("slow down [[fail:429]]", 1, None)
        assert (caught.value.category, caught.value.retry_after) == (ErrorCategory.RATE_LIMIT, 0.2)
        sent = next(r.body for r in server.requests if r.path.endswith(":generateContent"))
        assert sent["generationConfig"]["responseMimeType"] == "application/json"


async def test_llm_spec_builds_the_strategy() -> None:
    strategy = llm(f"gemini:{MODEL}", base_url="http://127.0.0.1:9", api_key=KEY)
    assert isinstance(strategy, GeminiStrategy) and strategy.model_name == MODEL


def test_the_docs_example_runs() -> None:
    path = ROOT / "docs" / "examples" / "provider_gemini.py"
    spec = importlib.util.spec_from_file_location("provider_gemini_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = io.StringIO()
    with redirect_stdout(out):
        anyio.run(module.main, backend="trio")
    text = out.getvalue()
    assert "'systemInstruction': {'parts': [{'text': 'Answer in one word.'}]}" in text
    assert "'generationConfig': {'temperature': 0.0, 'maxOutputTokens': 16}" in text
    assert "[True, True]" in text and "Capital" in text
    assert "succeeded: 4 cached tokens > 0: True" in text
    assert "GeminiStrategy gemini-2.5-flash" in text


def test_a_cli_run_with_a_gemini_model(tmp_path: Path) -> None:
    from trio_batch_llm._cli import _args

    try:
        from trio_batch_llm._cli import _providers  # type: ignore[attr-defined,unused-ignore]

        providers = _providers.PROVIDERS
    except ImportError:
        providers = _args.PROVIDERS
    if "gemini" not in providers:
        pytest.skip("the CLI does not take --model gemini:NAME yet (router's part of issue 33)")
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    rows = [json.dumps({"id": f"q{n}", "prompt": f"prompt {n}"}) for n in range(3)]
    source.write_text("\n".join(rows) + "\n")

    async def main() -> subprocess.CompletedProcess[bytes]:
        async with serve_mock(MockServerConfig(api_key=KEY)) as server:
            env = {k: v for k, v in os.environ.items() if k not in ("GEMINI_API_KEY", "GOOGLE_API_KEY")}
            env["MY_GEMINI_KEY"] = KEY
            return await anyio.run_process(
                [sys.executable, "-m", "trio_batch_llm", "run", str(source), "--model", f"gemini:{MODEL}",
                 "--base-url", server.url, "--api-key-env", "MY_GEMINI_KEY", "--out", str(out)],
                env=env, check=False)

    done = anyio.run(main, backend="trio")
    assert done.returncode == 0, (done.stdout, done.stderr)
    lines = [json.loads(line) for line in out.read_text().splitlines()[1:]]
    assert sorted(line.get("item_id") or line.get("id") for line in lines) == ["q0", "q1", "q2"]
