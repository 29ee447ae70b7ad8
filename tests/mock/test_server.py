"""The OpenAI-compatible mock server: the ASGI app in-process, then served by hypercorn.

In-process tests drive the app through httpx2.ASGITransport with a manual clock
for the RPM/TPM windows (exact on both backends) and Trio's virtual clock for
latency. Served tests run on the real clock over 127.0.0.1 and never sleep to
pass: they wait on the server's own counters (``wait_for``).
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
from typing import Any

import anyio
import httpx2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_batch_llm import ConfigurationError
from trio_batch_llm.mock import MockOpenAIApp, MockServerConfig, serve_mock
from trio_batch_llm.mock._state import SlidingWindow, mock_token_count

from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def chat(prompt: str, model: str = "m") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": prompt}]}


def in_process(app: MockOpenAIApp) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://mock/v1")


# -- the public package ----------------------------------------------------------------------------


def test_the_public_package_names_itself_as_the_module_of_what_it_exports() -> None:
    import trio_batch_llm.mock as mock
    import trio_batch_llm.testing as testing

    assert mock.__all__ == sorted(mock.__all__)
    shown = {name: getattr(mock, name).__module__ for name in mock.__all__}
    assert shown == dict.fromkeys(mock.__all__, "trio_batch_llm.mock")
    # methods too, so a traceback or help() names no private module; and testing re-exports the same objects
    methods = (mock.MockServer.wait_for, mock.MockOpenAIApp.statistics, mock.MockServerConfig.__post_init__)
    assert {method.__module__ for method in methods} == {"trio_batch_llm.mock"}
    assert all(getattr(testing, name) is getattr(mock, name) for name in mock.__all__)
    config = MockServerConfig(seed=7, latency=(0.0, 0.1))
    assert pickle.loads(pickle.dumps(config)) == config  # pickles by the public path


# -- pure parts ----------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    limit=st.integers(1, 6),
    gaps=st.lists(st.floats(0.0, 30.0, allow_nan=False), min_size=1, max_size=40),
    weights=st.lists(st.integers(1, 6), min_size=40, max_size=40),
)
def test_sliding_window_never_admits_over_the_limit(
    limit: int, gaps: list[float], weights: list[int]
) -> None:
    window, now, admitted = SlidingWindow(60.0), 0.0, []
    for gap, weight in zip(gaps, weights, strict=False):
        now += gap
        weight = min(weight, limit)
        wait = window.wait_for_room(now, weight, limit)
        if wait == 0.0:
            window.add(now, weight)
            admitted.append((now, weight))
        else:
            assert wait > 0
            # the promised wait is enough (up to float rounding of now + wait)
            assert window.wait_for_room(now + wait, weight, limit) <= 1e-9
    for start, _ in admitted:  # every 60 s window ending at an admission holds at most `limit`
        assert sum(w for t, w in admitted if t + 60.0 > start >= t) <= limit  # the window's own arithmetic
    assert window.max_total <= limit


def test_config_validation_names_the_field() -> None:
    bad: list[dict[str, Any]] = [
        {"hang_rate": 1.5}, {"reset_rate": -0.1}, {"latency": -1.0}, {"latency": (2.0, 1.0)},
        {"rpm_limit": 0}, {"tpm_limit": 2.5}, {"server_error_status": 404}, {"limit_window": 0.0},
        {"output_tokens": 0}, {"retry_after": -1.0},
    ]
    for kwargs in bad:
        with pytest.raises(ConfigurationError) as info:
            MockServerConfig(**kwargs)
        assert info.value.field == next(iter(kwargs)), kwargs
    with pytest.raises(ConfigurationError, match="rates"):
        MockServerConfig(hang_rate=0.6, reset_rate=0.6)
    assert "sk-hidden" not in repr(MockServerConfig(api_key="sk-hidden"))


# -- the app, in process -----------------------------------------------------------------------


class TestApp:
    @pytest.fixture(scope="class", params=[pytest.param("asyncio", id="asyncio"),
                                           pytest.param(trio_virtual_clock(), id="trio")])
    @classmethod
    def anyio_backend(cls, request: pytest.FixtureRequest) -> Any:
        return request.param

    async def test_answers_are_deterministic_with_usage(self) -> None:
        first, second, reseeded = MockOpenAIApp(), MockOpenAIApp(), MockOpenAIApp(MockServerConfig(seed=1))
        bodies = []
        for app in (first, second, reseeded):
            async with in_process(app) as client:
                chat_reply = await client.post("/chat/completions", json=chat("hello there", "gpt-x"))
                resp_reply = await client.post("/responses", json={"model": "m", "input": "hello there"})
            bodies.append((chat_reply.json(), resp_reply.json()))
        assert bodies[0] == bodies[1]
        assert bodies[0][0]["id"] != bodies[2][0]["id"]
        chat_body, resp_body = bodies[0]
        assert chat_body["model"] == "gpt-x"
        assert chat_body["choices"][0]["message"]["content"] == "echo: hello there"
        prompt_tokens = mock_token_count("hello there")
        completion_tokens = mock_token_count("echo: hello there")
        assert chat_body["usage"]["prompt_tokens"] == prompt_tokens
        assert chat_body["usage"]["completion_tokens"] == completion_tokens
        assert chat_body["usage"]["total_tokens"] == prompt_tokens + completion_tokens
        assert resp_body["output"][0]["content"][0]["text"] == "echo: hello there"
        assert resp_body["usage"]["input_tokens"] == prompt_tokens
        stats = first.statistics()
        assert (stats.requests, stats.succeeded) == (2, 2)
        assert stats.prompt_tokens == 2 * prompt_tokens
        assert stats.completion_tokens == 2 * completion_tokens

    async def test_output_tokens_knob(self) -> None:
        app = MockOpenAIApp(MockServerConfig(output_tokens=(3, 9), seed=5))
        async with in_process(app) as client:
            replies = [(await client.post("/chat/completions", json=chat(f"p{i}"))).json() for i in range(6)]
            again = (await client.post("/chat/completions", json=chat("p0"))).json()
        for reply in replies:
            words = reply["choices"][0]["message"]["content"].split()
            assert 3 <= len(words) <= 9
            assert reply["usage"]["completion_tokens"] == len(words)
        assert again["choices"] == replies[0]["choices"]  # the same prompt gets the same words

    async def test_records_requests_without_secrets(self) -> None:
        clock = ManualClock()
        app = MockOpenAIApp(MockServerConfig(api_key="sk-right"), clock=clock)
        async with in_process(app) as client:
            clock.now = 12.5
            sent = {"authorization": "Bearer sk-right", "x-api-key": "k", "x-trace": "1"}
            ok = await client.post("/chat/completions", json=chat("hi"), headers=sent)
            wrong = await client.post("/responses", json={"model": "m", "input": "hi"},
                                      headers={"authorization": "Bearer sk-wrong"})
            missing = await client.post("/chat/completions", json=chat("hi"))
        assert [ok.status_code, wrong.status_code, missing.status_code] == [200, 401, 401]
        assert wrong.json()["error"]["code"] == "invalid_api_key"
        first, second, _ = app.requests
        assert (first.method, first.path) == ("POST", "/v1/chat/completions")
        assert (first.arrival, first.prompt) == (12.5, "hi")
        assert first.body == chat("hi")
        assert first.outcome == "ok"
        assert first.headers["x-trace"] == "1"
        assert "authorization" not in first.headers
        assert "x-api-key" not in first.headers
        assert second.outcome == "error:401"
        assert app.statistics().client_errors == 2

    async def test_markers_force_faults_for_n_occurrences(self) -> None:
        app = MockOpenAIApp()
        async with in_process(app) as client:
            statuses = [(await client.post("/chat/completions", json=chat("[[fail:503x2]] q"))).status_code
                        for _ in range(3)]
            limited = await client.post("/responses",
                                        json={"model": "m", "input": "[[fail:429]] [[retry_after:2.5]]"})
            context = await client.post("/chat/completions", json=chat("[[context_length]]"))
            policy = await client.post("/chat/completions", json=chat("[[content_policy]]"))
            malformed = await client.post("/chat/completions", json=chat("[[malformed]]"))
        assert statuses == [503, 503, 200]
        assert limited.status_code == 429
        assert (limited.headers["retry-after"], limited.headers["retry-after-ms"]) == ("3", "2500")
        assert limited.json()["error"]["code"] == "rate_limit_exceeded"
        assert (context.status_code, context.json()["error"]["code"]) == (400, "context_length_exceeded")
        assert (policy.status_code, policy.json()["error"]["code"]) == (400, "content_policy_violation")
        assert malformed.status_code == 200
        with pytest.raises(json.JSONDecodeError):
            malformed.json()
        stats = app.statistics()
        assert (stats.server_errors, stats.rate_limited, stats.client_errors, stats.malformed) == (2, 1, 2, 1)
        assert [r.outcome for r in app.requests] == ["error:503", "error:503", "ok", "error:429", "error:400",
                                                     "error:400", "malformed"]

    async def test_seeded_fault_rates_are_reproducible(self) -> None:
        config = MockServerConfig(server_error_rate=0.3, rate_limit_rate=0.3, malformed_rate=0.1, seed=7)
        runs = []
        for seed in (7, 7, 8):
            app = MockOpenAIApp(config if seed == 7 else MockServerConfig(server_error_rate=0.3, seed=seed))
            async with in_process(app) as client:
                runs.append([(await client.post("/chat/completions", json=chat(f"p{i % 10}"))).status_code
                             for i in range(40)])
        assert runs[0] == runs[1]
        assert runs[0] != runs[2]
        assert {500, 429, 200} <= set(runs[0])
        everything = MockOpenAIApp(MockServerConfig(server_error_rate=1.0, server_error_status=502))
        async with in_process(everything) as client:
            assert (await client.post("/chat/completions", json=chat("x"))).status_code == 502

    async def test_enforced_rpm_over_a_sliding_window(self) -> None:
        clock = ManualClock()
        app = MockOpenAIApp(MockServerConfig(rpm_limit=3), clock=clock)
        async with in_process(app) as client:
            async def status_at(t: float) -> httpx2.Response:
                clock.now = t
                return await client.post("/chat/completions", json=chat(f"at {t}"))

            assert [(await status_at(t)).status_code for t in (0.0, 5.0, 10.0)] == [200, 200, 200]
            refused = await status_at(20.0)
            assert refused.status_code == 429
            assert refused.headers["retry-after-ms"] == "40000"  # until the request at t=0 leaves the window
            assert refused.headers["retry-after"] == "40"
            assert (await status_at(59.999)).status_code == 429
            assert (await status_at(60.0)).status_code == 200
            assert (await status_at(64.0)).status_code == 429
            assert (await status_at(65.0)).status_code == 200
        stats = app.statistics()
        assert (stats.rate_limited, stats.rate_limited_enforced, stats.succeeded) == (3, 3, 5)
        assert stats.max_served_per_window == 3
        assert stats.max_arrivals_per_window == 6  # t = 10 .. 65 are all within (5, 65]
        assert [r.outcome for r in app.requests].count("rate_limited_enforced") == 3

    async def test_enforced_tpm(self) -> None:
        clock = ManualClock()
        per_request = mock_token_count("abcd") + mock_token_count("echo: abcd")  # 1 + 3
        app = MockOpenAIApp(MockServerConfig(tpm_limit=2 * per_request), clock=clock)
        async with in_process(app) as client:
            first = await client.post("/chat/completions", json=chat("abcd"))
            clock.now = 30.0
            second = await client.post("/chat/completions", json=chat("abcd"))
            third = await client.post("/chat/completions", json=chat("abcd"))
            huge = await client.post("/chat/completions", json=chat("x" * 400))
        assert [first.status_code, second.status_code, third.status_code] == [200, 200, 429]
        assert third.headers["retry-after-ms"] == "30000"
        assert (huge.status_code, huge.json()["error"]["code"]) == (400, "request_too_large")

    async def test_latency(self, anyio_backend: Any) -> None:
        on_trio = anyio_backend != "asyncio"
        fixed = 2.5 if on_trio else 0.05
        app = MockOpenAIApp(MockServerConfig(latency=fixed))
        async with in_process(app) as client:
            start = anyio.current_time()
            await client.post("/chat/completions", json=chat("x"))
            elapsed = anyio.current_time() - start
            start = anyio.current_time()
            await client.post("/chat/completions", json=chat(f"[[latency:{fixed * 2}]]"))
            marked = anyio.current_time() - start
        if on_trio:  # virtual time: exact
            assert (elapsed, marked) == (2.5, 5.0)
        else:
            assert elapsed >= fixed
            assert marked >= 2 * fixed

    async def test_wait_for_and_shutdown_release_hangs(self) -> None:
        app = MockOpenAIApp()
        statuses: list[int] = []
        async with in_process(app) as client:
            async def call(prompt: str) -> None:
                statuses.append((await client.post("/chat/completions", json=chat(prompt))).status_code)

            async with anyio.create_task_group() as tg:
                tg.start_soon(call, "[[hang]] a")
                tg.start_soon(call, "[[latency:1000]] b")
                stats = await app.wait_for(lambda s: s.in_flight == 2 and s.hangs == 1)
                assert stats.max_in_flight == 2
                app.begin_shutdown()
            await call("after")
        assert statuses == [503, 503, 503]
        assert app.statistics().in_flight == 0

    async def test_bad_requests_and_routes(self) -> None:
        app = MockOpenAIApp(MockServerConfig(model="mock-1"))
        async with in_process(app) as client:
            not_json = await client.post("/chat/completions", content=b"{nope")
            no_messages = await client.post("/chat/completions", json={"model": "m"})
            streamed = await client.post("/chat/completions", json={**chat("x"), "stream": True})
            unknown = await client.post("/embeddings", json={})
            wrong_method = await client.get("/chat/completions")
            models = await client.get("/models")
        assert [r.status_code for r in (not_json, no_messages, streamed, unknown, wrong_method)] == [
            400, 400, 400, 404, 405]
        assert models.json()["data"][0]["id"] == "mock-1"
        assert app.requests[0].body == "{nope"
        assert app.statistics().requests == 3
        quiet = MockOpenAIApp(MockServerConfig(record_requests=False))
        async with in_process(quiet) as client:
            await client.post("/chat/completions", json=chat("x"))
        assert quiet.requests == []
        assert quiet.statistics().succeeded == 1


# -- served by hypercorn on 127.0.0.1 -------------------------------------------------------------


def port_is_closed(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
    except OSError:
        return True
    return False


async def test_serve_mock_binds_serves_and_closes() -> None:
    async with serve_mock() as server:
        assert server.port != 0
        assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
        async with httpx2.AsyncClient(base_url=server.base_url) as client:
            reply = await client.post("/chat/completions", json=chat("hello"))
        assert reply.json()["choices"][0]["message"]["content"] == "echo: hello"
        assert server.stats.succeeded == 1
        assert server.requests[0].headers["host"] == f"127.0.0.1:{server.port}"
    assert port_is_closed(server.port)


async def test_body_exception_propagates_unwrapped() -> None:
    with pytest.raises(ValueError, match="from the body") as info:
        async with serve_mock() as server:
            raise ValueError("from the body")
    assert type(info.value) is ValueError
    assert port_is_closed(server.port)


async def test_shutdown_releases_hangs_and_closes_connections() -> None:
    statuses: list[int] = []
    async with httpx2.AsyncClient() as client:
        async def call(url: str, prompt: str) -> None:
            statuses.append((await client.post(url, json=chat(prompt))).status_code)

        async with anyio.create_task_group() as tg, serve_mock() as server:
            url = server.base_url + "/chat/completions"
            tg.start_soon(call, url, "[[hang]] one")
            tg.start_soon(call, url, "[[hang]] two")
            await server.wait_for(lambda s: s.in_flight == 2)
        # the context exit released both hangs with a 503 instead of waiting for them
    assert statuses == [503, 503]
    assert server.stats.in_flight == 0
    assert port_is_closed(server.port)


async def test_reset_closes_without_a_response() -> None:
    async with serve_mock() as server, httpx2.AsyncClient(base_url=server.base_url) as client:
        with pytest.raises(httpx2.RemoteProtocolError, match="without sending a response"):
            await client.post("/chat/completions", json=chat("[[reset]]"))
        assert (await client.post("/chat/completions", json=chat("fine"))).status_code == 200
        stats = server.stats
    assert (stats.resets, stats.succeeded) == (1, 1)


async def test_counters_track_concurrency_and_client_disconnects() -> None:
    async with serve_mock() as server, httpx2.AsyncClient(base_url=server.base_url) as client:
        async def hang(i: int) -> None:
            await client.post("/chat/completions", json=chat(f"[[hang]] {i}"))

        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(hang, i)
            await server.wait_for(lambda s: s.in_flight == 3)
            tg.cancel_scope.cancel()
        stats = await server.wait_for(lambda s: s.in_flight == 0)
        assert (stats.hangs, stats.disconnects, stats.max_in_flight, stats.requests) == (3, 3, 3, 3)
        assert all(r.client_disconnected for r in server.requests)


async def test_served_rpm_limit_returns_429_with_retry_after() -> None:
    async with serve_mock(MockServerConfig(rpm_limit=2)) as server, \
            httpx2.AsyncClient(base_url=server.base_url) as client:
        replies = [await client.post("/chat/completions", json=chat(f"p{i}")) for i in range(3)]
    assert [r.status_code for r in replies] == [200, 200, 429]
    assert replies[2].headers["retry-after"] == "60"
    assert 59_000 < int(replies[2].headers["retry-after-ms"]) <= 60_000
    stats = server.stats
    assert stats.rate_limited_enforced == 1
    assert (stats.max_served_per_window, stats.max_arrivals_per_window) == (2, 3)


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_run_mock_server_serves_until_ctrl_c(backend: str) -> None:
    code = (
        "from trio_batch_llm.mock import run_mock_server\n"
        f"run_mock_server('127.0.0.1', 0, backend={backend!r}, "
        "on_ready=lambda server: print(server.base_url, flush=True))\n"
        "print('clean exit', flush=True)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert process.stdout is not None
        base_url = process.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:")
        reply = httpx2.post(base_url + "/chat/completions", json=chat("from the cli"))
        assert reply.json()["choices"][0]["message"]["content"] == "echo: from the cli"
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=20)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 0, err
    assert out.strip() == "clean exit"
