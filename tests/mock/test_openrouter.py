"""The mock's OpenRouter flavour of the OpenAI dialect: errors inside a 200, and no provider available.

OpenRouter documents its error body as ``{"error": {"code": <number>, "message",
"metadata"}}``; an error met once the model started comes with HTTP 200.
"""

from __future__ import annotations

from typing import Any

import httpx2
import pytest

from trio_batch_llm.mock import MockOpenAIApp, MockServerConfig, serve_mock

pytestmark = pytest.mark.anyio


def chat(prompt: str) -> dict[str, Any]:
    return {"model": "openai/gpt-x", "messages": [{"role": "user", "content": prompt}]}


def client_of(app: MockOpenAIApp) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://mock/v1")


async def test_an_error_inside_a_200_has_openrouters_shape() -> None:
    app = MockOpenAIApp(clock=lambda: 0.0)
    async with client_of(app) as client:
        limited = await client.post("/chat/completions", json=chat("q [[error_in_200:429x1]]"))
        again = await client.post("/chat/completions", json=chat("q [[error_in_200:429x1]]"))
        failed = await client.post("/chat/completions", json=chat("r [[error_in_200:502]]"))
    assert limited.status_code == 200
    error = limited.json()["error"]
    assert error["code"] == 429 and isinstance(error["message"], str)
    assert error["metadata"]["provider_name"] == "MockProvider"
    assert "retry-after" not in limited.headers
    assert "choices" not in limited.json()
    assert again.status_code == 200 and again.json()["choices"][0]["message"]["content"].startswith("echo:")
    assert (failed.status_code, failed.json()["error"]["code"]) == (200, 502)
    stats = app.statistics()
    assert (stats.rate_limited, stats.server_errors, stats.succeeded) == (1, 1, 1)


async def test_no_provider_available_is_a_502_in_openrouters_shape() -> None:
    async with serve_mock(MockServerConfig()) as server, \
            httpx2.AsyncClient(base_url=server.base_urls["openai"]) as client:
        down = await client.post("/chat/completions", json=chat("q [[no_provider]]"))
        routing = await client.post("/chat/completions", json=chat("q [[no_provider:503]]"))
    assert down.status_code == 502
    error = down.json()["error"]
    assert error["code"] == 502 and "no_provider_available" in error["message"]
    assert error["metadata"]["reason"] == "no_provider_available"
    assert (routing.status_code, routing.json()["error"]["code"]) == (503, 503)
    assert routing.headers["retry-after"] == "1"  # OpenRouter may send Retry-After with a 503
    assert server.stats.server_errors == 2
