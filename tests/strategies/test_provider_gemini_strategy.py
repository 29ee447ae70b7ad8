"""GeminiStrategy against a scripted Gemini (httpx2.MockTransport), on both backends.

The fake below answers ``generateContent`` and the ``cachedContents`` routes as Google
documents them; it records what the strategy sent so the tests can assert bodies,
headers, and the context cache's lifecycle (created once, renewed, deleted).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import anyio
import httpx2
import pytest

from trio_batch_llm import (
    ErrorCategory,
    GeminiContextCache,
    GeminiErrorClassifier,
    GeminiStrategy,
    ProviderError,
    call,
    process_prompts,
)
from trio_batch_llm._strategies._clients import client_registry

from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio

KEY = "gm-KEY-do-not-leak-4242"
BASE = "http://gemini.test"
SYSTEM = "You are a terse assistant. " * 20


class FakeGemini:
    """Gemini's REST routes, scripted: answers, errors to return first, and a cache store."""

    def __init__(self) -> None:
        self.requests: list[httpx2.Request] = []
        self.caches: dict[str, dict[str, Any]] = {}
        self.errors: list[tuple[int, dict[str, Any]]] = []
        self.create_status = 200
        self.hang = False
        self.generating = anyio.Event()
        self.created = 0

    def routes(self, method: str) -> list[str]:
        return [r.url.path for r in self.requests if r.method == method]

    def bodies(self, suffix: str) -> list[Any]:
        return [json.loads(r.content) for r in self.requests if r.url.path.endswith(suffix) and r.content]

    async def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        path = request.url.path
        if path.endswith(":generateContent"):
            if self.errors:
                status, body = self.errors.pop(0)
                return httpx2.Response(status, json=body)
            if self.hang:
                self.generating.set()
                await anyio.sleep_forever()
            body = json.loads(request.content)
            name = body.get("cachedContent")
            if name is not None and name not in self.caches:
                gone = "CachedContent not found (or permission denied)"
                return httpx2.Response(403, json={"error": {"code": 403, "status": "PERMISSION_DENIED",
                                                            "message": gone}})
            text = body["contents"][-1]["parts"][0]["text"]
            usage = {"promptTokenCount": 900, "candidatesTokenCount": 3, "totalTokenCount": 903}
            if name is not None:
                usage["cachedContentTokenCount"] = 800
            return httpx2.Response(200, json={
                "candidates": [{"content": {"role": "model", "parts": [{"text": f"echo {text}"}]},
                                "finishReason": "STOP"}],
                "usageMetadata": usage, "modelVersion": "gemini-test-001", "responseId": "r-1"})
        if path.endswith("/cachedContents") and request.method == "POST":
            if self.create_status != 200:
                return httpx2.Response(self.create_status, json={"error": {
                    "code": self.create_status, "status": "INTERNAL", "message": "cache store down"}})
            self.created += 1
            body = json.loads(request.content)
            name = f"cachedContents/c{self.created}"
            self.caches[name] = {**body, "name": name}
            return httpx2.Response(200, json=self.caches[name])
        if path.endswith("/cachedContents") and request.method == "GET":
            return httpx2.Response(200, json={"cachedContents": list(self.caches.values())})
        name = path.split("/v1beta/", 1)[1]
        if name not in self.caches:
            return httpx2.Response(404, json={"error": {"code": 404, "status": "NOT_FOUND", "message": name}})
        if request.method == "PATCH":
            self.caches[name]["ttl"] = json.loads(request.content)["ttl"]
            return httpx2.Response(200, json=self.caches[name])
        if request.method == "DELETE":
            del self.caches[name]
            return httpx2.Response(200, json={})
        return httpx2.Response(405)


def gemini(fake: FakeGemini, **kwargs: Any) -> GeminiStrategy:
    kwargs.setdefault("api_key", KEY)
    client = httpx2.AsyncClient(transport=httpx2.MockTransport(fake))
    return GeminiStrategy("gemini-test", base_url=BASE, client=client, **kwargs)


def quota_body(quota_id: str, delay: str) -> dict[str, Any]:
    return {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "quota exceeded", "details": [
        {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [
            {"quotaId": quota_id, "quotaDimensions": {"model": "gemini-test"}}]},
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}]}}


async def test_a_batch_posts_generate_content_with_the_key_header_and_reads_usage() -> None:
    fake = FakeGemini()
    strategy = gemini(fake, system_prompt="Be brief.", max_output_tokens=32)
    result = await process_prompts(strategy, ["one", "two", "three"], concurrency=2)
    assert sorted(r.output for r in result if r.output) == ["echo one", "echo three", "echo two"]
    assert set(fake.routes("POST")) == {"/v1beta/models/gemini-test:generateContent"}
    assert all(r.headers["x-goog-api-key"] == KEY for r in fake.requests)
    assert all(KEY not in str(r.url) for r in fake.requests)
    assert sorted(fake.bodies(":generateContent"), key=str) == sorted(
        (strategy.request_body(p) for p in ("one", "two", "three")), key=str)
    first = next(iter(result))
    assert first.token_usage["input_tokens"] == 900 and first.token_usage["output_tokens"] == 3
    assert first.metadata["model"] == "gemini-test-001"


def test_strategy_settings_reach_the_generation_config() -> None:
    strategy = GeminiStrategy("gemini-x", base_url=BASE, temperature=0.0, max_output_tokens=8,
                              params={"top_p": 0.5, "stop": ["END"]})
    assert strategy.request_body("q")["generationConfig"] == {
        "temperature": 0.0, "topP": 0.5, "stopSequences": ["END"], "maxOutputTokens": 8}
    assert strategy.params == {"temperature": 0.0, "top_p": 0.5, "stop": ["END"]}
    alone = GeminiStrategy("gemini-x", base_url=BASE, temperature=0.0)  # no params= beside it
    assert alone.request_body("q")["generationConfig"] == {"temperature": 0.0}


async def test_structured_output_sends_a_json_schema_and_validates_the_answer() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    fake_answer = httpx2.Response(200, json={"candidates": [
        {"content": {"parts": [{"text": '{"city": "Oslo"}'}]}, "finishReason": "STOP"}]})
    client = httpx2.AsyncClient(transport=httpx2.MockTransport(lambda request: fake_answer))
    strategy = GeminiStrategy("gemini-test", base_url=BASE, client=client, response_model=schema)
    answer: Any = await call(strategy, "capital of Norway?")
    assert answer == {"city": "Oslo"}
    config = strategy.request_body("q")["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert config["responseJsonSchema"]["properties"] == {"city": {"type": "string"}}


async def test_a_per_minute_429_is_a_rate_limit_and_a_per_day_429_stops_the_batch() -> None:
    fake = FakeGemini()
    fake.errors = [(429, quota_body("GenerateRequestsPerMinutePerProjectPerModel", "3.5s")),
                   (429, quota_body("GenerateRequestsPerDayPerProjectPerModel", "20s"))]
    strategy = gemini(fake)
    await strategy.prepare()
    try:
        with pytest.raises(ProviderError) as minute:
            await strategy.execute("a", 1, None)
        assert (minute.value.category, minute.value.retry_after, minute.value.stops_batch) == (
            ErrorCategory.RATE_LIMIT, 3.5, None)
        with pytest.raises(ProviderError) as day:
            await strategy.execute("b", 1, None)
        assert day.value.category is ErrorCategory.INSUFFICIENT_BALANCE
        assert day.value.stops_batch is not None and "GenerateRequestsPerDayPerProjectPerModel" in \
            day.value.stops_batch and "gemini-test" in day.value.stops_batch
        assert KEY not in str(day.value)
    finally:
        await strategy.cleanup()


async def test_a_key_from_the_environment_goes_only_to_googles_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", "env-key-123456789")
    monkeypatch.setenv("MY_GEMINI", "named-key-123456789")
    assert GeminiStrategy("gemini-x", base_url=BASE).secret is None
    assert GeminiStrategy("gemini-x").secret is not None
    assert GeminiStrategy("gemini-x").secret.reveal() == "env-key-123456789"  # type: ignore[union-attr]
    named = GeminiStrategy("gemini-x", base_url=BASE, api_key_env="MY_GEMINI")
    assert named.secret is not None and named.secret.reveal() == "named-key-123456789"
    assert "named-key" not in repr(named)


async def test_what_gemini_cannot_take_is_refused_at_input_before_any_call() -> None:
    fake = FakeGemini()
    strategy = gemini(fake)
    with pytest.raises(ValueError, match=r"prompts\[1\].*params\['logprobs'\]"):
        await process_prompts(strategy, ["fine", {"prompt": "x", "params": {"logprobs": True}}])
    assert fake.requests == []


# -- context cache ------------------------------------------------------------------------------


async def test_one_cache_is_created_for_many_items_and_deleted_at_the_end() -> None:
    fake = FakeGemini()
    strategy = gemini(fake, system_prompt=SYSTEM, context_cache=GeminiContextCache(ttl=600))
    result = await process_prompts(strategy, [f"q{i}" for i in range(6)], concurrency=3)
    assert all(r.success for r in result)
    assert fake.created == 1
    bodies = fake.bodies(":generateContent")
    assert len(bodies) == 6
    assert {b["cachedContent"] for b in bodies} == {"cachedContents/c1"}
    assert all("systemInstruction" not in b for b in bodies)
    created = fake.bodies("/cachedContents")[0]
    assert created["systemInstruction"] == {"parts": [{"text": SYSTEM}]}
    assert created["model"] == "models/gemini-test" and created["ttl"] == "600s"
    assert created["displayName"].startswith("trio-batch-llm-")
    assert fake.caches == {}  # deleted at cleanup
    assert fake.routes("DELETE") == ["/v1beta/cachedContents/c1"]
    assert {r.metadata["cached_content"] for r in result} == {"cachedContents/c1"}
    assert {r.token_usage["cached_input_tokens"] for r in result} == {800}


async def test_the_cache_is_deleted_when_the_batch_is_cancelled() -> None:
    fake = FakeGemini()
    fake.hang = True
    strategy = gemini(fake, system_prompt=SYSTEM, context_cache=True)
    async with anyio.create_task_group() as tg:
        async def run() -> None:
            await process_prompts(strategy, ["a", "b"])

        tg.start_soon(run)
        await fake.generating.wait()
        assert len(fake.caches) == 1
        tg.cancel_scope.cancel()
    assert fake.caches == {}
    assert fake.routes("DELETE") == ["/v1beta/cachedContents/c1"]


async def test_a_failed_cache_creation_leaves_nothing_behind() -> None:
    fake = FakeGemini()
    fake.create_status = 500
    strategy = gemini(fake, system_prompt=SYSTEM, context_cache=True)
    with pytest.raises(ProviderError) as caught:
        await strategy.prepare()
    assert caught.value.category is ErrorCategory.SERVER
    assert strategy.lease_identity() not in client_registry()
    assert fake.caches == {}
    await strategy.cleanup()  # nothing to do, and no error
    with pytest.raises(ProviderError, match="cache store down"):
        await process_prompts(strategy, ["a"])
    assert fake.caches == {}
    assert fake.routes("POST").count("/v1beta/models/gemini-test:generateContent") == 0


async def test_a_cache_found_by_display_name_is_reused_renewed_and_left_to_its_owner() -> None:
    fake = FakeGemini()
    option = GeminiContextCache(display_name="shared-prefix")
    strategy = gemini(fake, system_prompt=SYSTEM, context_cache=option)
    fake.caches["cachedContents/theirs"] = {"name": "cachedContents/theirs", "displayName": "shared-prefix",
                                            "model": "models/gemini-test", "ttl": "60s"}
    result = await process_prompts(strategy, ["a", "b"])
    assert all(r.success for r in result)
    assert fake.created == 0
    assert fake.routes("PATCH") == ["/v1beta/cachedContents/theirs"]
    assert fake.caches["cachedContents/theirs"]["ttl"] == "3600s"
    assert fake.routes("DELETE") == []


async def test_a_cache_gone_before_its_time_is_made_again_by_the_retry() -> None:
    fake = FakeGemini()
    strategy = gemini(fake, system_prompt=SYSTEM, context_cache=True)
    await strategy.prepare()
    try:
        fake.caches.clear()  # deleted elsewhere, or expired early on Google's side
        with pytest.raises(ProviderError) as caught:
            await strategy.execute("a", 1, None)
        assert caught.value.category is ErrorCategory.TRANSIENT and caught.value.status_code is None
        assert "cachedContents/c1 is gone" in str(caught.value)
        text, _, metadata = await strategy.execute("a", 2, None)
        assert text == "echo a" and metadata["cached_content"] == "cachedContents/c2"
    finally:
        await strategy.cleanup()
    assert fake.caches == {}


def test_an_item_may_not_override_what_the_cache_holds() -> None:
    from trio_batch_llm import LLMRequest

    strategy = GeminiStrategy("gemini-x", base_url=BASE, system_prompt=SYSTEM, context_cache=True)
    assert "context_cache" in str(strategy.request_problem(LLMRequest("x", {"system": "other"})))
    assert strategy.request_problem(LLMRequest("x", {"temperature": 0.5})) is None
    with pytest.raises(ValueError, match="context_cache"):
        GeminiStrategy("gemini-x", base_url=BASE, context_cache=True)  # nothing to cache
    with pytest.raises(ValueError, match=r"context_cache\.ttl"):
        GeminiContextCache(ttl=5)


@pytest.mark.parametrize("anyio_backend", [pytest.param(trio_virtual_clock(), id="trio-virtual")])
async def test_the_cache_is_renewed_before_its_ttl_runs_out_and_recreated_after() -> None:
    fake = FakeGemini()
    strategy = gemini(fake, system_prompt=SYSTEM, context_cache=GeminiContextCache(ttl=600))
    await strategy.prepare()
    try:
        await strategy.execute("a", 1, None)
        await anyio.sleep(200)
        await strategy.execute("b", 1, None)
        assert fake.routes("PATCH") == []  # two thirds of the TTL left
        await anyio.sleep(150)
        await strategy.execute("c", 1, None)
        assert fake.routes("PATCH") == ["/v1beta/cachedContents/c1"]  # under half left: renewed
        await anyio.sleep(250)
        await strategy.execute("d", 1, None)
        assert len(fake.routes("PATCH")) == 1 and fake.created == 1  # renewed at 350 s: fresh at 600 s
        await anyio.sleep(1000)  # idle past the TTL: Gemini dropped it
        fake.caches.clear()
        await strategy.execute("e", 1, None)
        assert fake.created == 2 and strategy.cache_name == "cachedContents/c2"
    finally:
        await strategy.cleanup()
    assert fake.caches == {}


# -- the SDK and the classifier -----------------------------------------------------------------


async def test_a_google_genai_client_is_used_as_is() -> None:
    genai = pytest.importorskip("google.genai")
    fake = FakeGemini()
    http = httpx2.AsyncClient(transport=httpx2.MockTransport(fake))
    client = genai.Client(api_key=KEY, http_options=genai.types.HttpOptions(
        base_url=BASE, api_version="v1beta", httpx_async_client=http))
    strategy = GeminiStrategy("gemini-test", client=client, system_prompt="Be brief.")
    assert await call(strategy, "hello") == "echo hello"
    sent = fake.bodies(":generateContent")[0]
    assert sent["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    fake.errors = [(429, quota_body("GenerateRequestsPerMinutePerProjectPerModel", "4s"))]
    with pytest.raises(ProviderError) as caught:
        await strategy.execute("again", 1, None)
    assert (caught.value.category, caught.value.retry_after) == (ErrorCategory.RATE_LIMIT, 4.0)
    sdk_error = caught.value.__cause__
    assert isinstance(sdk_error, Exception)
    info = GeminiErrorClassifier().classify(sdk_error)
    assert info is not None and info.is_rate_limit and info.suggested_wait == 4.0


def test_the_classifier_reads_an_sdk_per_day_error_as_final() -> None:
    errors = pytest.importorskip("google.genai.errors")
    exc = errors.ClientError(429, quota_body("GenerateRequestsPerDayPerProjectPerModel", "9s"))
    info = GeminiErrorClassifier().classify(exc)
    assert info is not None
    assert (info.is_retryable, info.is_rate_limit) == (False, False)
    assert info.error_category == "insufficient_balance"
    assert info.hint is not None and "per-day quota" in info.hint
    busy = {"error": {"code": 503, "status": "UNAVAILABLE", "message": "busy"}}
    unavailable = errors.ServerError(503, busy)
    server = GeminiErrorClassifier().classify(unavailable)
    assert server is not None and server.is_retryable and server.error_category == "server"


def test_importing_the_library_imports_neither_the_sdk_nor_httpx2() -> None:
    code = ("import sys, trio_batch_llm; trio_batch_llm.GeminiContextCache; "
            "print(sorted(m for m in sys.modules if m.startswith(('google', 'httpx2'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert out.stdout.strip() == "[]"
