"""The mock server's Files and Batch APIs: wire format, lazy advancement, token limit, faults, records.

Most tests drive the app in-process with a manual clock (exact on both
backends); one checks the default clock on Trio's virtual clock, one drives
the openai SDK against it, and the reset fault runs over a served socket.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx2
import openai
import pytest

from trio_batch_llm import ConfigurationError
from trio_batch_llm.mock import MockOpenAIApp, MockServerConfig, MockServerStats, serve_mock
from trio_batch_llm.mock._batch_store import EPOCH
from trio_batch_llm.mock._state import mock_token_count

from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def in_process(app: MockOpenAIApp) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://mock")


def request_line(custom_id: str, prompt: str, url: str = CHAT) -> dict[str, Any]:
    body: dict[str, Any] = (
        {"model": "m", "messages": [{"role": "user", "content": prompt}]} if url == CHAT
        else {"model": "m", "input": prompt}
    )
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def jsonl(entries: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(entry).encode() + b"\n" for entry in entries)


def prompts_file(prompts: list[str], url: str = CHAT) -> bytes:
    return jsonl([request_line(f"item-{i}", prompt, url) for i, prompt in enumerate(prompts)])


async def upload(client: httpx2.AsyncClient, content: bytes) -> str:
    reply = await client.post("/v1/files", data={"purpose": "batch"},
                              files={"file": ("input.jsonl", content, "application/jsonl")})
    assert reply.status_code == 200, reply.text
    return str(reply.json()["id"])


async def create(client: httpx2.AsyncClient, file_id: str, *, endpoint: str = CHAT,
                 metadata: dict[str, str] | None = None) -> httpx2.Response:
    request: dict[str, Any] = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"}
    if metadata is not None:
        request["metadata"] = metadata
    return await client.post("/v1/batches", json=request)


async def submit(client: httpx2.AsyncClient, content: bytes, **kwargs: Any) -> dict[str, Any]:
    reply = await create(client, await upload(client, content), **kwargs)
    assert reply.status_code == 200, reply.text
    batch: dict[str, Any] = reply.json()
    return batch


async def look(client: httpx2.AsyncClient, batch_id: str) -> dict[str, Any]:
    reply = await client.get(f"/v1/batches/{batch_id}")
    assert reply.status_code == 200, reply.text
    batch: dict[str, Any] = reply.json()
    return batch


async def lines_of(client: httpx2.AsyncClient, file_id: str | None) -> dict[str, dict[str, Any]]:
    """A result file's lines by custom_id ({} for a file that does not exist)."""
    if file_id is None:
        return {}
    reply = await client.get(f"/v1/files/{file_id}/content")
    assert reply.headers["content-type"] == "application/octet-stream"
    entries = [json.loads(line) for line in reply.content.splitlines()]
    return {entry["custom_id"]: entry for entry in entries}


def test_config_validation_names_the_field() -> None:
    bad: list[dict[str, Any]] = [
        {"batch_latency": -1.0}, {"batch_latency": float("inf")}, {"batch_create_faults": ("boom",)},
        {"batch_create_faults": ("error:200",)}, {"batch_create_faults": ["ok"]},
        {"batch_outcomes": ("done",)}, {"batch_enqueued_token_limit": 0},
        {"batch_enqueued_token_limit": True},
    ]
    for kwargs in bad:
        with pytest.raises(ConfigurationError) as info:
            MockServerConfig(**kwargs)
        assert info.value.field == next(iter(kwargs)), kwargs
    every_fault = ("ok", "error:429", "hang_before_create", "hang_after_create", "reset_after_create")
    MockServerConfig(batch_create_faults=every_fault, batch_outcomes=("completed", "expired", "failed"))
    # existing constructors keep working: the new counters have defaults
    assert MockServerStats(*range(16)).batches_created == 0


class TestBatchApi:
    @pytest.fixture(scope="class", params=[pytest.param("asyncio", id="asyncio"),
                                           pytest.param(trio_virtual_clock(), id="trio")])
    @classmethod
    def anyio_backend(cls, request: pytest.FixtureRequest) -> Any:
        return request.param

    async def test_completes_exactly_at_latency_with_live_bodies(self) -> None:
        clock = ManualClock()
        app = MockOpenAIApp(MockServerConfig(batch_latency=60.0), clock=clock)
        prompts = ["hello", "[[fail:429x1]] again", "[[context_length]] long", "[[fail:500]] broken", "bye"]
        content = prompts_file(prompts)
        async with in_process(app) as client:
            clock.now = 10.0
            uploaded = (await client.post("/v1/files", data={"purpose": "batch"},
                                          files={"file": ("in.jsonl", content)})).json()
            assert uploaded == {"id": uploaded["id"], "object": "file", "bytes": len(content),
                                "created_at": EPOCH + 10, "filename": "in.jsonl", "purpose": "batch"}
            assert (await client.get(f"/v1/files/{uploaded['id']}")).json() == uploaded
            assert (await client.get(f"/v1/files/{uploaded['id']}/content")).content == content
            clock.now = 20.5
            created = (await create(client, uploaded["id"], metadata={"run": "r1"})).json()
            assert created["status"] == "in_progress"
            assert (created["created_at"], created["in_progress_at"]) == (EPOCH + 20, EPOCH + 20)
            assert created["expires_at"] == EPOCH + 20 + 24 * 3600
            assert created["metadata"] == {"run": "r1"}
            assert created["request_counts"] == {"total": 5, "completed": 0, "failed": 0}
            assert [created[k] for k in ("output_file_id", "error_file_id", "errors")] == [None, None, None]
            clock.now = 80.499
            assert (await look(client, created["id"]))["status"] == "in_progress"
            assert app.statistics().batch_lines == 0
            clock.now = 80.5  # exactly created + batch_latency
            done = await look(client, created["id"])
            outputs = await lines_of(client, done["output_file_id"])
            errors = await lines_of(client, done["error_file_id"])
            again = await client.post(CHAT, json=request_line("x", prompts[1])["body"])
            output_file = (await client.get(f"/v1/files/{done['output_file_id']}")).json()
        assert done["status"] == "completed"
        assert (done["finalizing_at"], done["completed_at"]) == (EPOCH + 80, EPOCH + 80)
        assert done["request_counts"] == {"total": 5, "completed": 2, "failed": 3}
        assert set(outputs) == {"item-0", "item-4"}
        assert {cid: e["response"]["status_code"] for cid, e in errors.items()} == {
            "item-1": 429, "item-2": 400, "item-3": 500}
        assert errors["item-1"]["response"]["body"]["error"]["code"] == "rate_limit_exceeded"
        assert errors["item-2"]["response"]["body"]["error"]["code"] == "context_length_exceeded"
        assert errors["item-3"]["response"]["body"]["error"]["type"] == "server_error"
        assert all(e["error"] is None and e["id"].startswith("batch_req_") for e in [*outputs.values(),
                                                                                      *errors.values()])
        assert again.status_code == 200  # the batch line took the prompt's one scripted 429
        live = MockOpenAIApp()
        async with in_process(live) as client:
            for cid, index in (("item-0", 0), ("item-4", 4)):
                expected = (await client.post(CHAT, json=request_line(cid, prompts[index])["body"])).json()
                assert outputs[cid]["response"]["status_code"] == 200
                assert outputs[cid]["response"]["body"] == expected
                assert outputs[cid]["response"]["request_id"].startswith("req_")
        assert output_file["purpose"] == "batch_output"
        stats = app.statistics()
        assert (stats.files_uploaded, stats.batches_created, stats.batches_completed, stats.batch_lines) == (
            1, 1, 1, 5)
        assert stats.enqueued_tokens == 0
        assert stats.max_enqueued_tokens == sum(mock_token_count(p) for p in prompts)

    async def test_responses_endpoint_and_time_ordered_occurrences(self) -> None:
        clock = ManualClock()
        app = MockOpenAIApp(MockServerConfig(batch_latency=10.0), clock=clock)
        url = "/v1/responses"
        async with in_process(app) as client:
            batch = await submit(client, prompts_file(["[[fail:503x1]] shared", "plain", "[[malformed]] m",
                                                       "[[hang]] h"], url), endpoint=url)
            clock.now = 11.0
            # a live request after the batch's time: the batch's lines go first, whatever looks when
            live = await client.post(url, json={"model": "m", "input": "[[fail:503x1]] shared"})
            clock.now = 50.0
            done = await look(client, batch["id"])
            outputs = await lines_of(client, done["output_file_id"])
            errors = await lines_of(client, done["error_file_id"])
        assert live.status_code == 200
        assert errors["item-0"]["response"]["status_code"] == 503
        # hang/reset/malformed plans cannot happen inside a batch: they become 500 lines
        assert [errors[cid]["response"]["body"]["error"]["type"] for cid in ("item-2", "item-3")] == [
            "server_error", "server_error"]
        assert [errors[cid]["response"]["status_code"] for cid in ("item-2", "item-3")] == [500, 500]
        assert outputs["item-1"]["response"]["body"]["output"][0]["content"][0]["text"] == "echo: plain"
        assert done["completed_at"] == EPOCH + 10

    async def test_default_clock_is_the_event_loop_clock(self, anyio_backend: Any) -> None:
        latency = 3600.0 if anyio_backend != "asyncio" else 0.05
        app = MockOpenAIApp(MockServerConfig(batch_latency=latency))
        async with in_process(app) as client:
            start = anyio.current_time()
            batch = await submit(client, prompts_file(["a"]))
            if anyio_backend != "asyncio":  # virtual time: exact
                await anyio.sleep(latency - 0.001)
                assert (await look(client, batch["id"]))["status"] == "in_progress"
                await anyio.sleep_until(start + latency)
            else:
                await anyio.sleep(latency * 2)
            assert (await look(client, batch["id"]))["status"] == "completed"

    async def test_expired_and_failed_outcomes(self) -> None:
        clock = ManualClock()
        app = MockOpenAIApp(MockServerConfig(batch_latency=5.0, batch_outcomes=("expired", "failed")),
                            clock=clock)
        async with in_process(app) as client:
            five = ["ok one", "[[fail:500]] x", "three", "four", "five"]
            expired = await submit(client, prompts_file(five))
            failed = await submit(client, prompts_file(["never run"]))
            normal = await submit(client, prompts_file(["default outcome"]))
            assert app.statistics().enqueued_tokens > 0
            clock.now = 5.0
            expired, failed, normal = [await look(client, b["id"]) for b in (expired, failed, normal)]
            outputs = await lines_of(client, expired["output_file_id"])
            errors = await lines_of(client, expired["error_file_id"])
        assert (expired["status"], expired["expired_at"]) == ("expired", EPOCH + 5)
        assert set(outputs) == {"item-0"}
        assert errors["item-1"]["response"]["status_code"] == 500
        assert [cid for cid, e in errors.items() if e["response"] is None] == ["item-2", "item-3", "item-4"]
        assert all(errors[cid]["error"]["code"] == "batch_expired" for cid in ("item-2", "item-3", "item-4"))
        assert expired["request_counts"] == {"total": 5, "completed": 1, "failed": 1}
        assert (failed["status"], failed["failed_at"]) == ("failed", EPOCH + 5)
        assert [e["code"] for e in failed["errors"]["data"]] == ["server_error"]
        assert (failed["output_file_id"], failed["error_file_id"]) == (None, None)
        assert normal["status"] == "completed"
        stats = app.statistics()
        assert (stats.batches_expired, stats.batches_failed, stats.batches_completed) == (1, 1, 1)
        assert (stats.batch_lines, stats.enqueued_tokens) == (3, 0)

    async def test_validation_failure_names_lines(self) -> None:
        app = MockOpenAIApp()
        good = request_line("a", "fine")
        bad_lines = [
            json.dumps(good).encode(), b"{not json", b"", json.dumps(good).encode(),  # 4: duplicate id
            json.dumps({**request_line("b", "x"), "url": "/v1/responses"}).encode(),
            json.dumps({**request_line("c", "x"), "method": "GET"}).encode(),
            json.dumps({**request_line("d", "x"), "body": {"model": "m"}}).encode(),
            json.dumps({"method": "POST", "url": CHAT, "body": good["body"]}).encode(),
        ]
        async with in_process(app) as client:
            failed = await submit(client, b"\n".join(bad_lines) + b"\n")
            empty = await submit(client, b"\n")
        assert failed["status"] == "failed"
        assert [(e["code"], e["line"]) for e in failed["errors"]["data"]] == [
            ("invalid_request", n) for n in (2, 4, 5, 6, 7, 8)]
        assert "not unique" in failed["errors"]["data"][1]["message"]
        assert failed["request_counts"]["total"] == 0
        assert [(e["code"], e["line"]) for e in empty["errors"]["data"]] == [("invalid_request", None)]
        stats = app.statistics()
        assert (stats.batches_created, stats.batches_failed, stats.max_enqueued_tokens) == (2, 2, 0)

    async def test_create_request_errors(self) -> None:
        app = MockOpenAIApp(MockServerConfig(batch_outcomes=("completed",)))
        async with in_process(app) as client:
            file_id = await upload(client, prompts_file(["x"]))
            replies = [
                await create(client, "file-nope"),
                await create(client, file_id, endpoint="/v1/embeddings"),
                await client.post("/v1/batches", json={"input_file_id": file_id, "endpoint": CHAT,
                                                       "completion_window": "1h"}),
                await create(client, file_id, metadata={f"k{i}": "v" for i in range(17)}),
                await client.post("/v1/batches", content=b"{nope"),
            ]
            created = await submit(client, prompts_file(["y"]))
            assert created["status"] == "in_progress"  # the create answers before any look
            output_id = (await look(client, created["id"]))["output_file_id"]  # latency 0: due at once
            assert output_id is not None
            from_output = await create(client, output_id)
        assert [r.status_code for r in replies] == [404, 400, 400, 400, 400]
        assert all(r.json()["error"]["type"] == "invalid_request_error" for r in replies)
        assert from_output.status_code == 400
        assert app.statistics().batches_created == 1

    async def test_enqueued_token_limit(self) -> None:
        clock = ManualClock()
        first_prompts, second_prompts = ["a" * 40, "b" * 40], ["c" * 40]  # 10 tokens each
        app = MockOpenAIApp(MockServerConfig(batch_latency=100.0, batch_enqueued_token_limit=25),
                            clock=clock)
        async with in_process(app) as client:
            first = await submit(client, prompts_file(first_prompts))
            assert app.statistics().enqueued_tokens == 20
            refused = await submit(client, prompts_file(second_prompts))
            clock.now = 99.0
            refused_again = await submit(client, prompts_file(second_prompts))
            clock.now = 100.0  # the first completes at this look and frees its tokens
            fits = await submit(client, prompts_file(second_prompts))
            stats = app.statistics()
            assert (await look(client, first["id"]))["status"] == "completed"
        for batch in (refused, refused_again):
            assert batch["status"] == "failed"
            assert [e["code"] for e in batch["errors"]["data"]] == ["token_limit_exceeded"]
        assert fits["status"] == "in_progress"
        assert (stats.enqueued_tokens, stats.max_enqueued_tokens) == (10, 20)
        assert (stats.batches_token_limited, stats.batches_failed, stats.batches_created) == (2, 2, 4)

    async def test_scripted_create_faults_in_process(self) -> None:
        faults = ("error:429", "error:500", "hang_before_create", "hang_after_create")
        app = MockOpenAIApp(MockServerConfig(batch_create_faults=faults, batch_latency=50.0, retry_after=2.0))
        statuses: list[int] = []
        async with in_process(app) as client:
            file_id = await upload(client, prompts_file(["x"]))
            limited, broken = await create(client, file_id), await create(client, file_id)
            assert app.batches == []

            async def create_and_keep_status(metadata: dict[str, str]) -> None:
                statuses.append((await create(client, file_id, metadata=metadata)).status_code)

            async with anyio.create_task_group() as tg:
                tg.start_soon(create_and_keep_status, {"submission": "s-before"})
                await app.wait_for(lambda s: s.hangs == 1)
                assert app.batches == []
                tg.start_soon(create_and_keep_status, {"submission": "s-after"})
                await app.wait_for(lambda s: s.hangs == 2)
                listed = (await client.get("/v1/batches")).json()["data"]
                found = [b for b in listed if b["metadata"] == {"submission": "s-after"}]
                app.begin_shutdown()  # releases both hangs with a 503
        assert (limited.status_code, limited.headers["retry-after"]) == (429, "2")
        assert limited.json()["error"]["code"] == "rate_limit_exceeded"
        assert broken.status_code == 500
        assert len(listed) == 1
        assert [b["status"] for b in found] == ["in_progress"]
        assert statuses == [503, 503]
        stats = app.statistics()
        assert (stats.batches_created, stats.hangs, stats.in_flight) == (1, 2, 0)
        assert [r.outcome for r in app.requests if r.path == "/v1/batches" and r.method == "POST"] == [
            "error:429", "error:500", "hang", "hang"]

    async def test_list_pagination_and_batch_list_off(self) -> None:
        clock = ManualClock()
        app = MockOpenAIApp(MockServerConfig(batch_latency=1000.0), clock=clock)
        async with in_process(app) as client:
            ids = [(await submit(client, prompts_file([f"p{i}"])))["id"] for i in range(5)]
            pages, after = [], None
            while True:
                query: dict[str, Any] = {"limit": 2, **({"after": after} if after else {})}
                page = (await client.get("/v1/batches", params=query)).json()
                pages.append(page)
                if not page["has_more"]:
                    break
                after = page["last_id"]
            everything = (await client.get("/v1/batches")).json()
            bad = [await client.get("/v1/batches", params=params)
                   for params in ({"limit": 0}, {"limit": 101}, {"limit": "x"}, {"after": "batch_nope"})]
        newest_first = ids[::-1]
        assert [[b["id"] for b in page["data"]] for page in pages] == [
            newest_first[0:2], newest_first[2:4], newest_first[4:5]]
        assert [(p["first_id"], p["last_id"], p["has_more"]) for p in pages] == [
            (newest_first[0], newest_first[1], True), (newest_first[2], newest_first[3], True),
            (newest_first[4], newest_first[4], False)]
        assert everything["object"] == "list"
        assert [b["id"] for b in everything["data"]] == newest_first
        assert [r.status_code for r in bad] == [400, 400, 400, 400]
        assert [b["id"] for b in app.batches] == ids
        hidden = MockOpenAIApp(MockServerConfig(batch_list=False))
        async with in_process(hidden) as client:
            batch = await submit(client, prompts_file(["x"]))
            assert (await client.get("/v1/batches")).status_code == 404
            assert (await look(client, batch["id"]))["id"] == batch["id"]

    async def test_cancel(self) -> None:
        clock = ManualClock()
        app = MockOpenAIApp(MockServerConfig(batch_latency=100.0), clock=clock)
        async with in_process(app) as client:
            batch = await submit(client, prompts_file(["one", "two"]))
            clock.now = 30.0
            cancelling = (await client.post(f"/v1/batches/{batch['id']}/cancel")).json()
            assert app.statistics().enqueued_tokens > 0  # cancelling still holds until the next look
            clock.now = 31.0
            cancelled = await look(client, batch["id"])
            errors = await lines_of(client, cancelled["error_file_id"])
            again = await client.post(f"/v1/batches/{batch['id']}/cancel")
            unknown = await client.post("/v1/batches/batch_nope/cancel")
        assert (cancelling["status"], cancelling["cancelling_at"]) == ("cancelling", EPOCH + 30)
        assert (cancelled["status"], cancelled["cancelled_at"]) == ("cancelled", EPOCH + 31)
        assert cancelled["output_file_id"] is None
        assert {cid: (e["response"], e["error"]["code"]) for cid, e in errors.items()} == {
            "item-0": (None, "batch_cancelled"), "item-1": (None, "batch_cancelled")}
        assert (again.status_code, unknown.status_code) == (400, 404)
        stats = app.statistics()
        assert (stats.batches_cancelled, stats.batch_lines, stats.enqueued_tokens) == (1, 0, 0)

    async def test_generic_faults_auth_and_recording(self) -> None:
        clock = ManualClock()
        broken = MockOpenAIApp(MockServerConfig(server_error_rate=1.0), clock=clock)
        async with in_process(broken) as client:
            clock.now = 7.25
            refused = await client.post("/v1/files", data={"purpose": "batch"},
                                        files={"file": ("in.jsonl", prompts_file(["x"]))})
            listed = await client.get("/v1/batches")
        assert (refused.status_code, listed.status_code) == (500, 500)
        assert (broken.statistics().files_uploaded, broken.statistics().server_errors) == (0, 2)
        records = broken.requests
        assert [(r.method, r.path, r.arrival, r.prompt, r.outcome) for r in records] == [
            ("POST", "/v1/files", 7.25, None, "error:500"), ("GET", "/v1/batches", 7.25, None, "error:500")]
        limited = MockOpenAIApp(MockServerConfig(rate_limit_rate=1.0, retry_after=3.0))
        async with in_process(limited) as client:
            reply = await client.get("/v1/batches/batch_x")
        assert (reply.status_code, reply.headers["retry-after"]) == (429, "3")
        keyed = MockOpenAIApp(MockServerConfig(api_key="sk-right"))
        async with in_process(keyed) as client:
            assert (await client.get("/v1/batches")).status_code == 401
            authorized = await client.get("/v1/batches", headers={"authorization": "Bearer sk-right"})
            assert authorized.status_code == 200
        assert "authorization" not in keyed.requests[1].headers
        stats = keyed.statistics()
        assert (stats.batch_api_requests, stats.requests) == (2, 0)  # `requests` counts completions only

    async def test_seeded_batch_endpoint_faults_are_reproducible(self) -> None:
        runs = []
        for seed in (3, 3, 4):
            app = MockOpenAIApp(MockServerConfig(server_error_rate=0.5, seed=seed))
            async with in_process(app) as client:
                runs.append([(await client.get("/v1/batches")).status_code for _ in range(30)])
        assert runs[0] == runs[1]
        assert runs[0] != runs[2]
        assert set(runs[0]) == {200, 500}

    async def test_unknown_ids_routes_and_bad_uploads(self) -> None:
        app = MockOpenAIApp()
        async with in_process(app) as client:
            missing = [await client.get("/v1/files/file-nope"),
                       await client.get("/v1/files/file-nope/content"),
                       await client.get("/v1/batches/batch_nope"), await client.delete("/v1/files/file-nope")]
            wrong_method = await client.put("/v1/batches")
            not_multipart = await client.post("/v1/files", json={"purpose": "batch"})
            no_purpose = await client.post("/v1/files", files={"file": ("a.jsonl", b"{}")})
            no_file = await client.post("/v1/files", data={"purpose": "batch"},
                                        files={"other": ("a.jsonl", b"{}")})
            wrong_purpose = await client.post("/v1/files", data={"purpose": "fine-tune"},
                                              files={"file": ("a.jsonl", b"{}")})
            truncated = await client.post("/v1/files", content=b"--xyz\r\nContent-Disposition: form-data",
                                          headers={"content-type": "multipart/form-data; boundary=xyz"})
            file_id = await upload(client, b"bytes \xff kept\r\n")
            kept = await client.get(f"/v1/files/{file_id}/content")
            deleted = await client.delete(f"/v1/files/{file_id}")
            gone = await client.get(f"/v1/files/{file_id}")
            batch_of_gone = await create(client, file_id)
        assert [r.status_code for r in missing] == [404, 404, 404, 404]
        assert all(r.json()["error"]["type"] == "invalid_request_error" for r in missing)
        assert wrong_method.status_code == 405
        bad = (not_multipart, no_purpose, no_file, wrong_purpose, truncated)
        assert [r.status_code for r in bad] == [400] * 5
        assert kept.content == b"bytes \xff kept\r\n"
        assert (deleted.json(), gone.status_code) == ({"id": file_id, "object": "file", "deleted": True}, 404)
        assert batch_of_gone.status_code == 404
        assert [(f["id"], f["bytes"], f["deleted"]) for f in app.files] == [(file_id, 14, True)]
        assert app.statistics().files_uploaded == 1

    async def test_openai_sdk_speaks_to_it(self) -> None:
        app = MockOpenAIApp(MockServerConfig(batch_latency=0.0))
        http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app))
        async with openai.AsyncOpenAI(api_key="sk-x", base_url="http://mock/v1", http_client=http) as client:
            file = await client.files.create(file=("in.jsonl", prompts_file(["sdk"])), purpose="batch")
            batch = await client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                                completion_window="24h", metadata={"k": "v"})
            listed = [b.id async for b in client.batches.list(limit=1)]
            fetched = await client.batches.retrieve(batch.id)
            assert fetched.output_file_id is not None
            content = await client.files.content(fetched.output_file_id)
        assert (file.purpose, file.bytes) == ("batch", len(prompts_file(["sdk"])))
        assert fetched.status == "completed"
        assert fetched.request_counts is not None
        assert fetched.request_counts.completed == 1
        assert listed == [batch.id]
        line = json.loads(content.content)
        assert line["response"]["body"]["choices"][0]["message"]["content"] == "echo: sdk"


async def test_reset_after_create_over_a_socket() -> None:
    config = MockServerConfig(batch_create_faults=("reset_after_create",), batch_latency=3600.0)
    async with serve_mock(config) as server, httpx2.AsyncClient(base_url=server.url) as client:
        file_id = await upload(client, prompts_file(["x"]))
        with pytest.raises(httpx2.RemoteProtocolError, match="without sending a response"):
            await create(client, file_id, metadata={"submission": "s1"})
        listed = (await client.get("/v1/batches")).json()["data"]
        again = await create(client, file_id)
        stats = server.stats
    assert [b["metadata"] for b in listed] == [{"submission": "s1"}]
    assert again.status_code == 200
    assert (stats.resets, stats.batches_created) == (1, 2)
