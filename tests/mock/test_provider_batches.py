"""The mock's Anthropic Message Batches and Gemini batch mode: the stores as state machines, and their routes.

The stores are synchronous (time passed in), so most tests drive them directly
with an injected line answer; a few go through the served app for routing,
keys, dialect error bodies and the lines answered by the live dialects.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic.types.messages as sdk_batches
import httpx2
import pytest

from trio_batch_llm.mock import MockServerConfig, serve_mock
from trio_batch_llm.mock._anthropic_batches import AnthropicBatchStore
from trio_batch_llm.mock._gemini_batches import GeminiBatchStore

KEY = "mock-key-123456"


def _message(params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    text = params["messages"][0]["content"]
    if "fail" in text:
        return 429, {"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}}
    return 200, {"id": "msg_1", "type": "message", "role": "assistant", "model": params.get("model", "m"),
                 "content": [{"type": "text", "text": "re: " + text}], "stop_reason": "end_turn",
                 "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 2}}


def _generate(model: str, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    text = request["contents"][0]["parts"][0]["text"]
    if "fail" in text:
        return 429, {"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED",
                               "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo",
                                            "retryDelay": "5s"}]}}
    return 200, {"candidates": [{"content": {"parts": [{"text": f"{model}: {text}"}]}}]}


def _anthropic_body(*texts: str, ids: list[str] | None = None) -> bytes:
    ids = ids or [f"r{i}" for i in range(len(texts))]
    requests = [{"custom_id": cid, "params": {"model": "m", "max_tokens": 5,
                                              "messages": [{"role": "user", "content": t}]}}
                for cid, t in zip(ids, texts, strict=True)]
    return json.dumps({"requests": requests}).encode()


def _gemini_body(*texts: str, name: str = "run-1") -> bytes:
    requests = [{"request": {"contents": [{"role": "user", "parts": [{"text": t}]}]},
                 "metadata": {"key": f"k{i}"}} for i, t in enumerate(texts)]
    batch = {"displayName": name, "inputConfig": {"requests": {"requests": requests}}}
    return json.dumps({"batch": batch}).encode()


# --- Anthropic ------------------------------------------------------------------------------


def test_a_message_batch_processes_then_ends_with_one_result_line_per_request() -> None:
    store = AnthropicBatchStore(MockServerConfig(batch_latency=10.0), _message)
    created = store.create(_anthropic_body("a", "b fail"), now=0.0).payload
    assert created["processing_status"] == "in_progress" and created["results_url"] is None
    assert created["request_counts"]["processing"] == 2
    assert store.results(created["id"], now=5.0).status == 400  # not ended yet
    store.advance(10.0)
    ended = store.get(created["id"]).payload
    assert ended["processing_status"] == "ended" and ended["ended_at"] is not None
    assert ended["request_counts"] == {"processing": 0, "succeeded": 1, "errored": 1, "canceled": 0,
                                       "expired": 0}
    content = store.results(created["id"], now=11.0).content or b""
    lines = [json.loads(line) for line in content.splitlines()]
    assert [line["custom_id"] for line in lines] == ["r0", "r1"]
    answer = _message({"model": "m", "messages": [{"content": "a"}]})[1]
    assert lines[0]["result"] == {"type": "succeeded", "message": answer}
    assert lines[1]["result"]["type"] == "errored"
    assert lines[1]["result"]["error"]["error"]["type"] == "rate_limit_error"
    # The SDK's own types read what the store wrote.
    sdk_batches.MessageBatch.model_validate(ended)
    for line in lines:
        sdk_batches.MessageBatchIndividualResponse.model_validate(line)


def test_expired_and_canceled_batches_say_so_per_line() -> None:
    store = AnthropicBatchStore(MockServerConfig(batch_outcomes=("expired",), batch_latency=10.0), _message)
    expired = store.create(_anthropic_body("a", "b", "c", "d"), now=0.0).payload["id"]
    canceled = store.create(_anthropic_body("e"), now=1.0).payload["id"]
    canceling = store.cancel(canceled, now=2.0).payload
    assert canceling["processing_status"] == "canceling" and canceling["cancel_initiated_at"] is not None
    store.advance(10.0)
    content = store.results(expired, 11.0).content or b""
    kinds = [json.loads(x)["result"]["type"] for x in content.splitlines()]
    assert kinds == ["succeeded", "succeeded", "expired", "expired"]
    assert store.get(canceled).payload["request_counts"]["canceled"] == 1


def test_a_message_batch_refuses_bad_custom_ids_and_the_enqueued_limit() -> None:
    store = AnthropicBatchStore(MockServerConfig(batch_enqueued_token_limit=3), _message)
    assert "custom_id" in store.create(_anthropic_body("a", ids=["no spaces"]), now=0).message
    assert "more than one" in store.create(_anthropic_body("a", "b", ids=["x", "x"]), now=0).message
    refused = store.create(_anthropic_body("a" * 100), now=0)
    assert refused.status == 429 and refused.payload["error"]["type"] == "rate_limit_error"


def test_the_listing_pages_newest_first_and_deleting_needs_an_ended_batch() -> None:
    store = AnthropicBatchStore(MockServerConfig(batch_latency=10.0), _message)
    ids = [store.create(_anthropic_body(str(i)), now=0).payload["id"] for i in range(3)]
    first = store.list("limit=2").payload
    assert [b["id"] for b in first["data"]] == ids[::-1][:2] and first["has_more"]
    rest = store.list(f"limit=2&after_id={first['last_id']}").payload
    assert [b["id"] for b in rest["data"]] == [ids[0]] and not rest["has_more"]
    assert store.delete(ids[0]).status == 400  # still in progress
    store.advance(10.0)
    assert store.delete(ids[0]).payload == {"id": ids[0], "type": "message_batch_deleted"}
    assert store.get(ids[0]).status == 404


# --- Gemini ---------------------------------------------------------------------------------


def test_a_gemini_batch_answers_inline_in_input_order_with_the_metadata() -> None:
    store = GeminiBatchStore(MockServerConfig(batch_latency=10.0), _generate)
    created = store.create("gemini-x", _gemini_body("a", "b fail"), now=0.0).payload
    assert created["name"].startswith("batches/") and created["metadata"]["state"] == "BATCH_STATE_PENDING"
    assert "done" not in created and "output" not in created["metadata"]
    store.advance(10.0)
    done = store.get(created["name"].removeprefix("batches/")).payload
    assert done["done"] and done["metadata"]["state"] == "BATCH_STATE_SUCCEEDED"
    answers = done["metadata"]["output"]["inlinedResponses"]["inlinedResponses"]
    assert answers[0] == {"response": _generate("gemini-x", {"contents": [{"parts": [{"text": "a"}]}]})[1],
                          "metadata": {"key": "k0"}}
    assert answers[1]["error"]["code"] == 8  # RESOURCE_EXHAUSTED, as a google.rpc.Status
    assert answers[1]["error"]["details"][0]["retryDelay"] == "5s"
    assert done["metadata"]["batchStats"] == {"requestCount": "2", "successfulRequestCount": "1",
                                              "failedRequestCount": "1"}


def test_the_genai_sdk_reads_a_finished_gemini_batch() -> None:
    from google.genai import batches as sdk

    store = GeminiBatchStore(MockServerConfig(), _generate)
    name = store.create("gemini-x", _gemini_body("a"), now=0.0).payload["name"]
    store.advance(0.0)
    job = sdk._BatchJob_from_mldev(store.get(name.removeprefix("batches/")).payload)
    assert job["name"] == name and job["state"] == "JOB_STATE_SUCCEEDED" and job["display_name"] == "run-1"
    assert job["dest"]["inlined_responses"][0]["metadata"] == {"key": "k0"}


def test_gemini_batches_list_cancel_delete_and_refuse_bad_input() -> None:
    store = GeminiBatchStore(MockServerConfig(batch_latency=10.0, batch_enqueued_token_limit=45), _generate)
    names = [store.create("m", _gemini_body(str(i), name=f"n{i}"), now=0).payload["name"] for i in range(3)]
    page = store.list("pageSize=2").payload
    assert [op["name"] for op in page["operations"]] == names[::-1][:2]
    rest = store.list(f"pageSize=2&pageToken={page['nextPageToken']}").payload
    assert [op["name"] for op in rest["operations"]] == [names[0]] and "nextPageToken" not in rest
    bare = names[0].removeprefix("batches/")
    assert store.cancel(bare, now=1).payload == {}
    assert store.get(bare).payload["metadata"]["state"] == "BATCH_STATE_CANCELLED"
    assert store.delete(bare).payload == {} and store.get(bare).status == 404
    assert "displayName" in store.create("m", _gemini_body("a", name=""), now=0).message
    over = store.create("m", _gemini_body("x" * 100), now=0)
    assert over.status == 429 and over.payload["error"]["status"] == "RESOURCE_EXHAUSTED"


# --- served -------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_served_routes_check_the_dialect_key_and_answer_lines_by_the_live_dialect() -> None:
    config = MockServerConfig(api_key=KEY)
    async with serve_mock(config) as server, httpx2.AsyncClient(base_url=server.url) as client:
        bad = await client.post("/v1/messages/batches", content=_anthropic_body("a"),
                                headers={"x-api-key": "wrong"})
        assert bad.status_code == 401 and bad.json()["type"] == "error"
        headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
        created = (await client.post("/v1/messages/batches", content=_anthropic_body("hello"),
                                     headers=headers)).json()
        results = await client.get(f"/v1/messages/batches/{created['id']}/results", headers=headers)
        [line] = [json.loads(x) for x in results.content.splitlines()]
        assert line["result"]["type"] == "succeeded"
        assert line["result"]["message"]["usage"]["input_tokens"] > 0
        assert (await client.put("/v1/messages/batches", headers=headers)).status_code == 405
        google = {"x-goog-api-key": KEY}
        made = (await client.post("/v1beta/models/gemini-x:batchGenerateContent", content=_gemini_body("hi"),
                                  headers=google)).json()
        done = (await client.get(f"/v1beta/{made['name']}", headers=google)).json()
        [answer] = done["metadata"]["output"]["inlinedResponses"]["inlinedResponses"]
        assert answer["metadata"] == {"key": "k0"} and answer["response"]["candidates"]
        missing = await client.get("/v1beta/batches/nope", headers=google)
        assert missing.status_code == 404 and missing.json()["error"]["status"] == "NOT_FOUND"
