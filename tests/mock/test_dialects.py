"""The mock's dialects together: one port, each dialect's base URL, the documented wire examples, faults.

The examples under ``tests/data/wire/`` are the providers' documented bodies, in
our own words and values; the mock's answers must carry the same fields.
"""

from __future__ import annotations

import json
import signal
from typing import Any

import httpx2
import pytest

from trio_batch_llm._cli._main import build_parser
from trio_batch_llm.mock import MockOpenAIApp, MockServerConfig, serve_mock

from .._paths import TESTS
from ..cli.test_cli import spawn

pytestmark = pytest.mark.anyio

WIRE = TESTS / "data" / "wire"
VERSION = {"anthropic-version": "2023-06-01"}


def wire(name: str) -> Any:
    return json.loads((WIRE / name).read_text(encoding="utf-8"))


def keys(value: Any, prefix: str = "") -> set[str]:
    """Every key path of a JSON value (lists: their first item), to compare shapes, not values."""
    if isinstance(value, dict):
        return {p for k, v in value.items() for p in {prefix + k} | keys(v, prefix + k + ".")}
    if isinstance(value, list) and value:
        return keys(value[0], prefix)
    return set()


@pytest.mark.parametrize(("path", "request_file", "response_file", "headers"), [
    ("/v1/chat/completions", "openai_chat_request.json", "openai_chat_response.json", {}),
    ("/v1/responses", "openai_responses_request.json", "openai_responses_response.json", {}),
    ("/v1/messages", "anthropic_messages_request.json", "anthropic_messages_response.json",
     {"anthropic-version": "2023-06-01"}),
    ("/v1/messages", "anthropic_tool_request.json", "anthropic_tool_response.json",
     {"anthropic-version": "2023-06-01"}),
])
async def test_answers_carry_the_documented_fields(path: str, request_file: str, response_file: str,
                                                   headers: dict[str, str]) -> None:
    app = MockOpenAIApp(clock=lambda: 0.0)
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://mock") as client:
        reply = await client.post(path, json=wire(request_file), headers=headers)
    assert reply.status_code == 200, reply.text
    documented = wire(response_file)
    missing = keys(documented) - keys(reply.json())
    assert missing == set()
    # and values of the same JSON types where both have them
    assert {k: type(v) for k, v in reply.json().items() if k in documented and documented[k] is not None} == {
        k: type(v) for k, v in documented.items() if v is not None}


@pytest.mark.parametrize(("path", "marker", "error_file", "headers"), [
    ("/v1/chat/completions", "[[fail:429]]", "openai_error_429.json", {}),
    ("/v1/messages", "[[fail:429]]", "anthropic_error_429.json", VERSION),
    ("/v1/messages", "[[fail:529]]", "anthropic_error_529.json", VERSION),
    ("/v1/messages", "[[spend_limit]]", "anthropic_error_spend_limit.json", VERSION),
    ("/v1/chat/completions", "[[error_in_200:429]]", "openrouter_error_in_200.json", {}),
])
async def test_errors_carry_the_documented_fields(path: str, marker: str, error_file: str,
                                                  headers: dict[str, str]) -> None:
    payload = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": f"x {marker}"}]}
    app = MockOpenAIApp(clock=lambda: 0.0)
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://mock") as client:
        reply = await client.post(path, json=payload, headers=headers)
    documented = wire(error_file)
    assert keys(documented) - keys(reply.json()) == set()
    code = documented["error"].get("code")
    assert reply.status_code == (200 if marker.startswith("[[error_in_200") else int(marker[7:10]) if
                                 marker.startswith("[[fail") else 429)
    if isinstance(code, int):
        assert reply.json()["error"]["code"] == code


async def test_every_dialect_is_served_on_one_port_and_faults_apply_to_each() -> None:
    config = MockServerConfig(rate_limit_rate=1.0, retry_after=4.0)
    async with serve_mock(config) as server, httpx2.AsyncClient() as client:
        assert set(server.base_urls) >= {"openai", "anthropic"}
        assert server.base_urls["openai"] == server.base_url
        openai = await client.post(server.base_urls["openai"] + "/chat/completions",
                                   json={"model": "m", "messages": [{"role": "user", "content": "a"}]})
        claude = await client.post(server.base_urls["anthropic"] + "/v1/messages", headers=VERSION, json={
            "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "a"}]})
        wrong_method = await client.get(server.base_urls["anthropic"] + "/v1/messages")
    assert (openai.status_code, openai.json()["error"]["code"]) == (429, "rate_limit_exceeded")
    assert (claude.status_code, claude.json()["error"]["type"]) == (429, "rate_limit_error")
    assert openai.headers["retry-after"] == claude.headers["retry-after"] == "4"
    assert "retry-after-ms" in openai.headers and "retry-after-ms" not in claude.headers
    assert wrong_method.status_code == 405
    assert server.stats.rate_limited == 2


async def test_a_hang_on_the_anthropic_route_ends_when_the_client_gives_up() -> None:
    async with serve_mock(MockServerConfig()) as server:
        async with httpx2.AsyncClient(base_url=server.base_urls["anthropic"], timeout=0.2) as client:
            with pytest.raises(httpx2.TimeoutException):
                await client.post("/v1/messages", headers={"anthropic-version": "2023-06-01"},
                                  json={"model": "m", "max_tokens": 8,
                                        "messages": [{"role": "user", "content": "x [[hang]]"}]})
        stats = await server.wait_for(lambda s: s.disconnects == 1)
    assert stats.hangs == 1 and server.requests[0].client_disconnected


async def test_the_spend_limit_knob_speaks_openais_quota_error_on_its_routes() -> None:
    app = MockOpenAIApp(MockServerConfig(spend_limit_after=0), clock=lambda: 0.0)
    transport = httpx2.ASGITransport(app=app)
    async with httpx2.AsyncClient(transport=transport, base_url="http://mock/v1") as client:
        reply = await client.post("/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "a"}]})
    assert reply.status_code == 429
    assert reply.json()["error"]["code"] == "insufficient_quota"
    assert "retry-after" not in reply.headers


def test_serve_mock_knobs_reach_the_config() -> None:
    args = build_parser().parse_args(["serve-mock", "--spend-limit-after", "3", "--input-tpm-limit", "500",
                                      "--output-tpm-limit", "90"])
    assert (args.spend_limit_after, args.input_tpm_limit, args.output_tpm_limit) == (3, 500, 90)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve-mock", "--spend-limit-after", "-1"])


async def test_serve_mock_prints_each_dialects_base_url(anyio_backend: str) -> None:
    async with spawn("serve-mock", "--port", "0", "--backend", anyio_backend) as cli:
        await cli.wait_for_text("anthropic ")
        lines = cli.output.strip().splitlines()
        base = lines[0]
        urls = dict(line.split() for line in lines[1:] if line.split()[0] in ("openai", "anthropic"))
        assert urls == {"openai": base, "anthropic": base.removesuffix("/v1")}
        # a request answered first: the server is serving (and its signal receiver is in place)
        async with httpx2.AsyncClient(base_url=urls["anthropic"]) as client:
            reply = await client.post("/v1/messages", headers=VERSION, json={
                "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
        assert reply.json()["content"][0]["text"] == "echo: hi"
        cli.send_signal(signal.SIGINT)
    assert cli.returncode == 0, cli.output
