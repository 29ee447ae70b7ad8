"""Fail closed when the provider is gone (issue 32, point 4): the circuit breaker on every surface.

A refused connection, a 401, a dead endpoint that recovers, a flaky one that must not
trip it; through ``process_prompts``, ``process_stream``, ``LLMCallPool``/``call_result``,
durable runs and the CLI. Both backends; Trio on its virtual clock where the pause and
backoffs matter, asyncio with short ones.
"""

from __future__ import annotations

import json
import random
import socket
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from trio_batch_llm import (
    CircuitBreakerConfig,
    ErrorCategory,
    LLMCallError,
    LLMCallPool,
    LLMCallStrategy,
    OpenAICompatibleStrategy,
    ProcessorConfig,
    ProviderError,
    RetryConfig,
    RetryState,
    StopReason,
    call_result,
    process_prompts,
    process_stream,
)
from trio_batch_llm._runs import open_run
from trio_batch_llm.mock import MockOpenAIApp, MockServerConfig

from .._runs_child import IDENTITY
from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio

RETRY = RetryConfig(initial_wait=0.01, max_wait=0.05, jitter_seed=7)
BREAKER = CircuitBreakerConfig(threshold=10, pause=0.05, probes=1)


@pytest.fixture(
    scope="module",
    params=[pytest.param("asyncio", id="asyncio"), pytest.param(trio_virtual_clock(threads=True), id="trio")],
)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


def _config(**kwargs: Any) -> ProcessorConfig:
    kwargs.setdefault("retry", RETRY)
    kwargs.setdefault("circuit_breaker", BREAKER)
    kwargs.setdefault("concurrency", 8)
    return ProcessorConfig(**kwargs)


def _refused() -> ProviderError:
    """What the HTTP strategies raise for a refused connection: a ProviderError from the socket's error."""
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except ConnectionRefusedError as exc:
            raise ProviderError("ConnectError: connection refused", category=ErrorCategory.TRANSIENT) from exc
    except ProviderError as caught:
        return caught


class Endpoint(LLMCallStrategy[str]):
    """Answers unless ``outcome(call_number)`` names a failure: "refused", "500", "429"."""

    def __init__(self, outcome: Callable[[int], str | None]) -> None:
        self.outcome = outcome
        self.calls = 0

    async def execute(self, prompt: str, attempt: int, timeout: float | None,
                      state: RetryState | None = None) -> tuple[str, Any, Any]:
        self.calls += 1
        verdict = self.outcome(self.calls)
        await anyio.sleep(0.001)
        if verdict == "refused":
            raise _refused()
        if verdict == "500":
            raise ProviderError("HTTP 500", category=ErrorCategory.SERVER, status_code=500)
        if verdict == "429":
            raise ProviderError("HTTP 429", category=ErrorCategory.RATE_LIMIT, status_code=429,
                                retry_after=0.01)
        return "out: " + prompt, {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}, None


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed on leaving: nothing listens there now


class CountingTransport(httpx2.AsyncBaseTransport):
    """Counts the requests that reach the network layer (each one a connection attempt here)."""

    def __init__(self) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.requests = 0

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        self.requests += 1
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _assert_retired(results: list[Any], *, attempts_at_most: int) -> None:
    assert sum(r.attempts for r in results) <= attempts_at_most
    for result in results:
        assert not result.success
        if result.stop_reason is StopReason.PROVIDER_RETIRED:
            expected = ErrorCategory.NOT_EXECUTED if result.attempts == 0 else ErrorCategory.ABORTED
            assert result.error_category is expected
            assert "provider retired" in (result.error or "")
        else:  # ran to its own end before the breaker opened (a non-retryable 401, its last attempt)
            assert result.stop_reason is None and result.attempts > 0


# --- the acceptance test: a refused connection -----------------------------------------------------


async def test_a_refused_connection_ends_a_10000_item_batch_after_threshold_plus_probe_attempts(
    anyio_backend: Any,
) -> None:
    if anyio_backend != "asyncio":
        pytest.skip("a real socket needs a real clock (the Trio run is the virtual-clock tests below)")
    transport = CountingTransport()
    async with httpx2.AsyncClient(transport=transport) as client:
        strategy = OpenAICompatibleStrategy("m", base_url=f"http://127.0.0.1:{_closed_port()}/v1",
                                            api_key="sk-test", client=client)
        batch = await process_prompts(strategy, [f"p{i}" for i in range(10_000)],
                                      config=_config(concurrency=32))
    assert transport.requests <= 11  # threshold + one probe
    assert sum(r.attempts for r in batch.results) == transport.requests
    termination = batch.termination
    assert termination.kind == "provider_retired"
    assert termination.reason is not None
    assert termination.reason.startswith("provider retired: connection refused")
    assert "first error: ProviderError: ConnectError" in termination.reason
    assert termination.item_id in {r.item_id for r in batch.results if r.attempts}
    assert len(batch.results) == 10_000
    assert Counter(r.stop_reason for r in batch.results) == {StopReason.PROVIDER_RETIRED: 10_000}
    _assert_retired(batch.results, attempts_at_most=11)


def test_a_refused_connection_on_the_trio_socket_path_too() -> None:
    """The same closed port, on Trio's own sockets (anyio groups the refusals there), real clock."""
    async def main() -> None:
        async with httpx2.AsyncClient() as client:
            strategy = OpenAICompatibleStrategy("m", base_url=f"http://127.0.0.1:{_closed_port()}/v1",
                                                api_key="sk-test", client=client)
            batch = await process_prompts(strategy, [f"p{i}" for i in range(2_000)],
                                          config=_config(concurrency=32))
        assert batch.termination.kind == "provider_retired"
        assert batch.termination.reason is not None and "connection refused" in batch.termination.reason
        _assert_retired(batch.results, attempts_at_most=11)

    anyio.run(main, backend="trio")


async def test_a_dead_endpoint_costs_threshold_plus_probes_on_the_virtual_clock(anyio_backend: Any) -> None:
    virtual = anyio_backend != "asyncio"  # the default backoffs and a 30 s pause take no time on Trio's
    strategy = Endpoint(lambda n: "refused")
    breaker = CircuitBreakerConfig(threshold=10, pause=30.0 if virtual else 0.05, probes=3)
    started = anyio.current_time()
    batch = await process_prompts(strategy, [f"p{i}" for i in range(10_000)],
                                  config=_config(concurrency=64, circuit_breaker=breaker,
                                                 retry=RetryConfig() if virtual else RETRY))
    assert strategy.calls == 13
    assert batch.termination.kind == "provider_retired"
    assert batch.termination.reason is not None
    assert "connection refused (quota scope" in batch.termination.reason
    assert f"3 probes after {breaker.pause:g} s" in batch.termination.reason
    if virtual:  # 10 attempts, then 3 pauses of 30 s; the backoffs (<= 60 s) of items in flight end it
        assert 90.0 <= anyio.current_time() - started <= 160.0
    _assert_retired(batch.results, attempts_at_most=13)


# --- 401 from the mock ---------------------------------------------------------------------------


async def test_a_401_from_the_mock_trips_it() -> None:
    app = MockOpenAIApp(MockServerConfig(api_key="sk-right"))
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app)) as client:
        strategy = OpenAICompatibleStrategy("mock-model", base_url="http://mock/v1", api_key="sk-wrong",
                                            client=client)
        batch = await process_prompts(strategy, [f"p{i}" for i in range(500)], config=_config())
    assert app.statistics().requests == 11
    assert batch.termination.kind == "provider_retired"
    assert batch.termination.reason is not None and batch.termination.reason.startswith(
        "provider retired: HTTP 401")
    assert "sk-wrong" not in batch.termination.reason and "sk-right" not in batch.termination.reason
    own = [r for r in batch.results if r.stop_reason is None]
    assert len(own) == 11 and {r.error_category for r in own} == {ErrorCategory.AUTHENTICATION}
    assert batch.termination.item_id in {r.item_id for r in own}
    _assert_retired(batch.results, attempts_at_most=11)


# --- attacks: what must not trip it -----------------------------------------------------------------


async def test_a_flaky_endpoint_does_not_trip_it() -> None:
    """Random 5xx and 429s from the mock, and random refusals between answers: no retirement."""
    app = MockOpenAIApp(MockServerConfig(server_error_rate=0.2, rate_limit_rate=0.2, retry_after=0.01,
                                         seed=3))
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app)) as client:
        strategy = OpenAICompatibleStrategy("mock-model", base_url="http://mock/v1", api_key="sk",
                                            client=client)
        config = _config(circuit_breaker=CircuitBreakerConfig(threshold=2, pause=0.05),
                         retry=RetryConfig(initial_wait=0.01, max_wait=0.05, max_attempts=10))
        batch = await process_prompts(strategy, [f"p{i}" for i in range(300)], config=config)
    assert batch.termination.kind == "completed"
    assert all(r.stop_reason is None for r in batch.results)
    assert app.statistics().rate_limited > 0 and app.statistics().server_errors > 0

    rng = random.Random(5)
    draws = {n: rng.choice(["refused", "500", "429", None, None, None]) for n in range(1, 100_000)}
    flaky = Endpoint(lambda n: draws[n] if n % 4 else None)  # never 10 refusals in a row
    batch = await process_prompts(flaky, [f"p{i}" for i in range(1_000)],
                                  config=_config(retry=RetryConfig(initial_wait=0.01, max_wait=0.05,
                                                                   max_attempts=20)))
    assert batch.termination.kind == "completed"
    assert batch.succeeded == 1_000


async def test_a_probe_that_answers_closes_it_and_the_waiting_items_spent_no_attempts() -> None:
    strategy = Endpoint(lambda n: "refused" if n <= 11 else None)
    breaker = CircuitBreakerConfig(threshold=10, pause=1.0, probes=2)
    batch = await process_prompts(strategy, [f"p{i}" for i in range(200)],
                                  config=_config(circuit_breaker=breaker,
                                                 retry=RetryConfig(initial_wait=0.01, max_attempts=5)))
    assert batch.termination.kind == "completed"
    assert batch.succeeded == 200
    assert strategy.calls == 200 + 11  # the 11 refused (10, then the first probe); nothing else failed


async def test_off_it_retries_every_item_on_its_own_as_before() -> None:
    strategy = Endpoint(lambda n: "refused")
    batch = await process_prompts(strategy, [f"p{i}" for i in range(40)],
                                  config=_config(circuit_breaker=None))
    assert batch.termination.kind == "completed"
    assert strategy.calls == 40 * 3
    assert {(r.error_category, r.stop_reason) for r in batch.results} == {(ErrorCategory.TRANSIENT, None)}


# --- the other surfaces --------------------------------------------------------------------------


async def test_process_stream_ends_provider_retired() -> None:
    strategy = Endpoint(lambda n: "refused")
    results = []
    async with process_stream(strategy, (f"p{i}" for i in range(3_000)), config=_config()) as stream:
        async for result in stream:
            results.append(result)
        termination = stream.termination
    assert termination.kind == "provider_retired"
    assert strategy.calls == 11
    assert len(results) <= 3_000  # a lazy source is read no further once the batch stopped
    _assert_retired(results, attempts_at_most=11)


async def test_a_pool_ends_every_request_with_one_typed_result_and_then_refuses_at_once() -> None:
    strategy = Endpoint(lambda n: "refused")
    results: list[Any] = []
    async with LLMCallPool(strategy, config=_config(concurrency=4)) as pool:
        async def one(i: int) -> None:
            results.append(await pool.submit_result(f"p{i}"))

        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(one, i)
        assert len(results) == 40
        assert strategy.calls == 11
        _assert_retired(results, attempts_at_most=11)
        assert any(r.stop_reason is StopReason.PROVIDER_RETIRED for r in results)
        late = await pool.submit_result("late")  # retired: ends at once, no call
        assert (late.error_category, late.stop_reason, late.attempts) == (
            ErrorCategory.NOT_EXECUTED, StopReason.PROVIDER_RETIRED, 0)
        with pytest.raises(LLMCallError) as info:
            await pool.submit("later")
        assert info.value.result is not None
        assert info.value.result.stop_reason is StopReason.PROVIDER_RETIRED
    assert strategy.calls == 11


async def test_call_result_with_a_low_threshold_ends_provider_retired() -> None:
    """One call is bounded by its own max_attempts; a threshold below it retires the provider."""
    strategy = Endpoint(lambda n: "refused")
    config = _config(circuit_breaker=CircuitBreakerConfig(threshold=1, pause=0.05, probes=1),
                     retry=RetryConfig(initial_wait=0.01, max_attempts=5))
    result = await call_result(strategy, "p", config=config)
    assert strategy.calls == 2
    assert (result.error_category, result.stop_reason, result.attempts) == (
        ErrorCategory.ABORTED, StopReason.PROVIDER_RETIRED, 2)


async def test_a_durable_run_stops_with_its_items_pending_and_resumes_when_the_endpoint_is_back(
    tmp_path: Path,
) -> None:
    down = True
    strategy = Endpoint(lambda n: "refused" if down else None)
    db = tmp_path / "runs.sqlite"
    async with await open_run(db, "run", strategy, [f"p{i}" for i in range(100)], identity=IDENTITY,
                              config=_config(concurrency=4, retry=RetryConfig(initial_wait=0.01,
                                                                              max_attempts=12))) as run:
        snap = await run.wait()
        assert snap.status == "failed"
        assert snap.termination is not None and snap.termination.kind == "provider_retired"
        assert snap.termination.reason is not None and "connection refused" in snap.termination.reason
        assert snap.pending == 100 and snap.done == 0  # nothing ran to its own end: all to resume
        assert strategy.calls == 11
        down = False
        await run.resume()
        again = await run.wait()
    assert again.status == "completed" and again.succeeded == 100


# --- the CLI -------------------------------------------------------------------------------------


def test_the_cli_says_the_provider_was_retired_and_exits_69(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from trio_batch_llm._cli import _command
    from trio_batch_llm.cli import main

    real = _command.CircuitBreakerConfig
    monkeypatch.setattr(_command, "CircuitBreakerConfig", lambda **kw: real(**{"pause": 0.05, **kw}))
    monkeypatch.setenv("BREAKER_KEY", "sk-test")
    def args(items: int, out: str) -> list[str]:
        source = tmp_path / f"{out}.in.jsonl"
        lines = (json.dumps({"id": f"q{i}", "prompt": f"p{i}"}) + "\n" for i in range(items))
        source.write_text("".join(lines))
        return ["run", str(source), "--model", "openai-compatible:m", "--api-key-env", "BREAKER_KEY",
                "--base-url", f"http://127.0.0.1:{_closed_port()}/v1", "--backend", "asyncio",
                "--concurrency", "4", "--max-attempts", "1", "--out", str(tmp_path / f"{out}.jsonl")]

    code = main([*args(300, "a"), "--circuit-breaker", "3"])
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert code == 69, text
    assert "Batch stopped: provider retired: connection refused" in text
    assert "first error:" in text
    assert "the provider was retired" in text

    code = main([*args(6, "b"), "--circuit-breaker", "0"])  # off: every item tried, the batch completes
    text = "".join(capsys.readouterr())
    assert code == 1, text
    assert "Batch completed" in text
