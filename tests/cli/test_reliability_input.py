"""Issue 16, cases 5, 6 and 7 (parts): hostile input and secrets.

* rel5: a context nested past the documented limit is a clear input error before any call, on
  every path in (the CLI's files, ``process_prompts`` and friends, run sources), never a
  ``RecursionError`` in the middle of a batch.
* rel6a: a key inside ``--base-url`` / ``base_url=`` (userinfo or a key-like query value) never
  shows in anything printed, logged, repr'd or written.
* rel6b: ``OPENAI_API_KEY`` goes only to OpenAI's own API host; any other endpoint gets the key it
  was explicitly given (``api_key=``, ``api_key_env=``, ``--api-key-env``) or none, and a 401 then
  says how to pass one.
* rel7 surrogate: a prompt with a lone surrogate is refused at input (it can never be sent); a
  request that still fails to encode is INVALID_REQUEST and not retried.
* rel7 csv: CSV fields longer than the csv module's default 131,072 characters are read, without
  changing the process-wide ``csv.field_size_limit()``.

CLI tests run ``main()`` in this process. Where a run must reach a server, the mock server runs
in a blocking portal's thread (its own event loop, on the same backend as the CLI's
``--backend``), so stdout, stderr and every file the run writes can be searched for the key.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import httpx2
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_batch_llm import (
    ArtifactIdentity,
    CallableStrategy,
    ErrorCategory,
    FakeStrategy,
    JsonlArtifactStore,
    LLMCallPool,
    LLMWorkItem,
    ParallelBatchProcessor,
    ProcessorConfig,
    RetryConfig,
    SqliteArtifactStore,
    call,
    call_result,
    process_prompts,
    process_stream,
)
from trio_batch_llm._cli._input import read_input
from trio_batch_llm._engine._classify import classify
from trio_batch_llm._runs import open_run
from trio_batch_llm._strategies._factory import llm
from trio_batch_llm._strategies.openai._compatible import OpenAICompatibleStrategy
from trio_batch_llm._strategies.openai._sdk import OpenAIStrategy
from trio_batch_llm._values._item_checks import nesting_exceeds, text_nesting_column
from trio_batch_llm.cli import main
from trio_batch_llm.testing import MockServer, MockServerConfig, serve_mock

from .._runs_child import IDENTITY

pytestmark = pytest.mark.anyio

DEAD_URL = "http://127.0.0.1:9/v1"
LIMIT = 256  # the documented nesting limit (docs/cli.md, docs/guides/providers.md)
FAST = ProcessorConfig(concurrency=2, retry=RetryConfig(initial_wait=0.001, max_wait=0.001))
USER_KEY = "sk-userinfo-SECRET-9f8e7d6c5b4a3210"
QUERY_KEY = "sk-query-SECRET-0a1b2c3d4e5f6789"
ENV_KEY = "sk-env-SECRET-aa55aa55aa55aa55"
CHAT_OK = {
    "id": "c1", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


def deep_list(depth: int) -> list[Any]:
    """A list nested exactly ``depth`` levels (``[]`` is 1), built without recursion."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def deep_tuple(depth: int) -> tuple[Any, ...]:
    value: tuple[Any, ...] = ()
    for _ in range(depth - 1):
        value = (value,)
    return value


def shared_key() -> tuple[Any, ...]:
    return deep_tuple(3)


def deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def cli_run(source: Path, out: Path, *extra: str, base_url: str = DEAD_URL) -> list[str]:
    return ["run", str(source), "--model", "openai-compatible:m", "--base-url", base_url,
            "--out", str(out), *extra]


@contextlib.contextmanager
def mock_in_thread(backend: str, config: MockServerConfig | None = None) -> Iterator[MockServer]:
    """The mock server on its own event loop in a portal thread, so ``main()`` can run here."""
    with anyio.from_thread.start_blocking_portal(backend) as portal, \
            portal.wrap_async_context_manager(serve_mock(config)) as server:
        yield server


def files_text(folder: Path) -> str:
    """Every file under ``folder``, as text (undecodable bytes replaced): where a key must not be."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in files)


class Recorder:
    """An httpx2.MockTransport handler: records requests, answers each with ``response``."""

    def __init__(self, response: httpx2.Response) -> None:
        self.response = response
        self.requests: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        return self.response


def mock_client(recorder: Recorder) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=httpx2.MockTransport(recorder))


# --- rel5: deep input --------------------------------------------------------------------------


def test_rel5_cli_deep_context_is_an_input_error(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                 anyio_backend: str) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "prompt": "fine"}\n'
                      '{"id": "b", "prompt": "deep", "context": ' + deep_json(200_000) + "}\n")
    code, output = run_cli(capsys, *cli_run(source, tmp_path / "out.jsonl", "--backend", anyio_backend))
    assert code == 2, output
    assert f"{source}, line 2" in output and f"nested more than {LIMIT} levels" in output
    assert "Traceback" not in output and "RecursionError" not in output
    assert not (tmp_path / "out.jsonl").exists()


def test_rel5_cli_nesting_limit_is_exact_and_ignores_brackets_in_strings(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    at_limit = deep_json(LIMIT)
    brackets = "[{" * 5000  # inside a string: text, not nesting
    source.write_text(f'{{"id": "a", "prompt": "{brackets}", "context": {at_limit}}}\n'
                      f'{{"id": "b", "prompt": "p\\"[[", "context": {{"k": "]]\\\\"}}}}\n'
                      f'"{brackets}"\n')
    records = read_input(source)
    assert [r.item_id for r in records] == ["a", "b", "item-2"]
    assert records[0].context == deep_list(LIMIT) and records[0].prompt == brackets
    source.write_text(f'{{"id": "a", "prompt": "x", "context": {deep_json(LIMIT + 1)}}}\n')
    # the line's object is one level, so the context's 257th level is its bracket at column 39 + 256
    with pytest.raises(ValueError, match=f"line 1: nested more than {LIMIT} levels deep at column 295"):
        read_input(source)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ ,:ab\n'),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(alphabet='[]{}"\\a'), inner, max_size=4),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(value=_json_values, ascii_only=st.booleans())
def test_rel5_both_nesting_measures_agree_with_the_recursive_depth(value: Any, ascii_only: bool) -> None:
    depth = _depth(value)
    text = json.dumps(value, ensure_ascii=ascii_only)
    for limit in range(max(0, depth - 2), depth + 2):
        assert nesting_exceeds(value, limit) == (depth > limit)
        assert (text_nesting_column(text, limit) is not None) == (depth > limit)


async def test_rel5_api_deep_context_refused_before_any_call(tmp_path: Path) -> None:
    fake = FakeStrategy()
    store = JsonlArtifactStore(tmp_path / "out.jsonl", identity=ArtifactIdentity("p", "m"))
    prompts = [("a", "fine"), ("b", "deep", deep_list(200_000))]
    refused = rf"prompts\[1\] \(item_id='b'\): context is nested more than {LIMIT}"
    with pytest.raises(ValueError, match=refused):
        await process_prompts(fake, prompts, artifact_store=store)
    with pytest.raises(ValueError, match=refused):
        await process_prompts(fake, prompts)  # no store either: the limit does not depend on one
    assert fake.calls == [] and fake.prepare_count == 0
    assert not (tmp_path / "out.jsonl").exists()
    # the limit is exact; a context at it runs, is stored and is replayed intact
    ok = await process_prompts(fake, [("c", "x", deep_list(LIMIT))], artifact_store=store)
    assert ok.succeeded == 1 and ok.results[0].context == deep_list(LIMIT)


async def test_rel5_api_deep_context_every_entry_point(tmp_path: Path) -> None:
    fake = FakeStrategy()
    deep = deep_list(LIMIT + 1)

    async def lazy() -> AsyncIterator[Any]:
        yield ("a", "fine")
        yield ("b", "deep", deep)

    with pytest.raises(ValueError, match=rf"item_id='b'\): context is nested more than {LIMIT}"):
        async with process_stream(fake, lazy()) as results:
            async for _ in results:
                pass
    store = SqliteArtifactStore(tmp_path / "s.sqlite", identity=ArtifactIdentity("p", "m"))
    async with ParallelBatchProcessor(FAST, artifact_store=store) as proc:
        with pytest.raises(ValueError, match=rf"item_id='b': context is nested more than {LIMIT}"):
            await proc.add_work(LLMWorkItem(item_id="b", strategy=fake, prompt="p", context=deep))
        fine = {"k": [deep_list(3)]}
        await proc.add_work(LLMWorkItem(item_id="c", strategy=fake, prompt="p", context=fine))
        batch = await proc.process_all()
    assert [r.item_id for r in batch.results] == ["c"]
    async with LLMCallPool(fake) as pool:
        with pytest.raises(ValueError, match=f"context is nested more than {LIMIT}"):
            await pool.submit("p", context=deep)
    # a shared sub-structure counts at its deepest place; a context that contains itself never ends
    shared = deep_list(LIMIT - 2)
    ok = await process_prompts(fake, [("s", "x", [shared, shared, {"again": shared}, {shared_key(): 1}])])
    assert ok.succeeded == 1
    with pytest.raises(ValueError, match=r"item_id='t'.*context is nested more than"):
        await process_prompts(fake, [("t", "x", [shared, {"k": [shared]}])])
    cyclic: list[Any] = [1]
    cyclic.append({"again": cyclic})
    with pytest.raises(ValueError, match=r"item_id='c'.*or contains itself"):
        await process_prompts(fake, [("c", "x", cyclic)])
    keys = {deep_tuple(LIMIT): 1}  # dict keys are levels too
    with pytest.raises(ValueError, match="item_id='k'"):
        await process_prompts(fake, [("k", "x", keys)])
    assert [prompt for prompt, _ in fake.calls] == ["p", "x"]


async def assert_run_refuses_second_entry(db: Path, source: Any, match: str) -> None:
    """The run calls the good first entry, then fails on the second before calling it."""
    fake = FakeStrategy()
    async with await open_run(db, "run", fake, source, identity=IDENTITY, config=FAST) as run:
        with pytest.raises(ValueError, match=match):
            await run.wait()
        snap = await run.snapshot()
    assert snap.status == "failed" and snap.termination is not None
    assert snap.termination.kind == "ingestion_failed"
    assert (snap.items, snap.done, len(fake.calls)) == (1, 1, 1)


async def test_rel5_run_sources_refuse_deep_context(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"id": "a", "prompt": "fine"}\n'
                    '{"id": "b", "prompt": "deep", "context": ' + deep_json(200_000) + "}\n")
    for n, source in enumerate([path, [("a", "fine"), ("b", "deep", deep_list(200_000))]]):
        await assert_run_refuses_second_entry(tmp_path / f"r{n}.sqlite", source,
                                              f"nested more than {LIMIT} levels")


# --- rel6a: keys in URLs never show ----------------------------------------------------------


def _secret_url(base_url: str) -> str:
    return base_url.replace("http://", f"http://user:{USER_KEY}@") + f"?api-version=1&api_key={QUERY_KEY}"


def test_rel6a_cli_never_prints_a_key_from_base_url(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                    anyio_backend: str) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "prompt": "hello"}\n{"id": "b", "prompt": "[[context_length]]"}\n')
    out = tmp_path / "out.jsonl"
    with mock_in_thread(anyio_backend) as server:
        url = _secret_url(server.base_url)
        code, output = run_cli(capsys, *cli_run(source, out, "--backend", anyio_backend, "--progress",
                                                base_url=url))
        # the other spelling of the flag, and the runs front end, on an input error
        code2, output2 = run_cli(capsys, "runs", "start", str(tmp_path / "r.sqlite"), "run", str(source),
                                 "--model", "openai-compatible:m", f"--base-url={url}", "--timeout", "0.001",
                                 "--backend", anyio_backend)
        sent = server.requests
    assert code == 1, output  # b failed: the line that says how to run it again is printed
    assert "to run them again:" in output and "--resume" in output
    assert "<redacted>" in output and "127.0.0.1" in output
    assert code2 == 3 and "continue with:" in output2 and "<redacted>" in output2, output2
    for text in (output, output2, files_text(tmp_path)):
        assert USER_KEY not in text and QUERY_KEY not in text
    # the key still reaches the server, in the request: only its display is redacted
    assert any(r.path.endswith("/chat/completions") for r in sent)


def test_rel6a_redaction_everywhere_a_url_is_shown(monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    from trio_batch_llm._values._urls import redact_url, redact_urls

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    url = f"https://user:{USER_KEY}@llm.example/v1?api-version=2024&key={QUERY_KEY}&token={QUERY_KEY}"
    assert redact_url(url) == "https://<redacted>@llm.example/v1?api-version=2024&key=<redacted>&token=<redacted>"
    assert redact_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1"
    assert redact_url(f"http://{USER_KEY}@h/v1") == "http://<redacted>@h/v1"
    for name in ("api_key", "api-key", "apiKey", "access_token", "x-api-key", "sig", "code", "password",
                 "client_secret", "subscription-key", "auth"):
        assert QUERY_KEY not in redact_url(f"https://h/v1?{name}={QUERY_KEY}&model=m"), name
    assert redact_url("https://h/v1?model=gpt&api-version=1") == "https://h/v1?model=gpt&api-version=1"
    text = f"Client error '401' for url 'http://u:{USER_KEY}@h/v1/chat?key={QUERY_KEY}'\nmore"
    assert USER_KEY not in redact_urls(text) and QUERY_KEY not in redact_urls(text)
    with caplog.at_level(logging.DEBUG):
        strategies = [
            OpenAICompatibleStrategy("m", base_url=url),
            llm("openai-compatible:m", base_url=url),
            OpenAIStrategy("m", base_url=url, api_key="k" * 12),
        ]
        shown = [repr(s) for s in strategies] + [str(s) for s in strategies]
        shown += [repr(s.quota_scope()) for s in strategies]
        from trio_batch_llm._runs._batch_config import ProviderBatchConfig
        from trio_batch_llm._runs._batch_drive import capacity_scope_of

        for strategy in strategies:  # stored in the run database
            shown.append(capacity_scope_of(strategy.batch_endpoint(), ProviderBatchConfig()))
        from trio_batch_llm._runs._schema import RunTermination

        shown.append(repr(RunTermination("error", f"HTTPStatusError: 401 for url '{url}'")))  # stored too
        with pytest.raises(ValueError) as bad:
            OpenAICompatibleStrategy("m", base_url=url.replace("https", "ftp"))
        shown.append(str(bad.value))
    shown.append(caplog.text)
    for text in shown:
        assert USER_KEY not in text and QUERY_KEY not in text, text


async def test_rel6a_failure_text_from_a_url_in_an_exception_is_redacted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"http://user:{USER_KEY}@llm.example/v1/chat/completions?api_key={QUERY_KEY}"

    async def raise_for_status(prompt: str, **_: Any) -> str:
        request = httpx2.Request("POST", url)
        response = httpx2.Response(401, request=request)
        response.raise_for_status()  # an HTTPStatusError whose message holds the URL
        return "unreachable"

    store = JsonlArtifactStore(tmp_path / "out.jsonl", identity=ArtifactIdentity("p", "m"))
    with caplog.at_level(logging.DEBUG):
        batch = await process_prompts(CallableStrategy(raise_for_status), ["p"], artifact_store=store,
                                      config=FAST)
    [result] = batch.results
    assert result.error_category is ErrorCategory.AUTHENTICATION and result.error is not None
    assert "llm.example" in result.error and "<redacted>" in result.error
    shown = (result.error, json.dumps(result.to_dict()), batch.to_json(), files_text(tmp_path), caplog.text)
    for text in shown:
        assert USER_KEY not in text and QUERY_KEY not in text


async def test_rel6a_base_url_query_is_kept_and_the_path_joined_before_it() -> None:
    rec = Recorder(httpx2.Response(200, json=CHAT_OK))
    async with mock_client(rec) as client:
        strategy = OpenAICompatibleStrategy("m", base_url="http://h.test/openai/v1/?api-version=2024-06-01",
                                            client=client)
        await strategy.execute("x", 1, None)
    assert str(rec.requests[0].url) == "http://h.test/openai/v1/chat/completions?api-version=2024-06-01"


# --- rel6b: OPENAI_API_KEY only for OpenAI's own host ----------------------------------------


async def test_rel6b_env_key_is_sent_only_to_openai(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    monkeypatch.setenv("MY_ENDPOINT_KEY", "sk-mine-0123456789")
    rec = Recorder(httpx2.Response(200, json=CHAT_OK))
    async with mock_client(rec) as client:
        cases: list[tuple[OpenAICompatibleStrategy | Any, str | None]] = [
            (OpenAICompatibleStrategy("m", base_url="http://mock.test/v1", client=client), None),
            (llm("openai-compatible:m", base_url="http://127.0.0.1:8000/v1", client=client), None),
            (OpenAICompatibleStrategy("m", base_url="https://api.openai.com.evil.test/v1", client=client),
             None),
            (OpenAICompatibleStrategy("m", base_url="http://api.openai.com/v1", client=client), None),
            (OpenAICompatibleStrategy("m", base_url="https://api.openai.com:8443/v1", client=client), None),
            (OpenAICompatibleStrategy("m", base_url="https://api.openai.com/v1", client=client), ENV_KEY),
            (OpenAICompatibleStrategy("m", base_url="https://API.OpenAI.com/v1/", client=client), ENV_KEY),
            (OpenAICompatibleStrategy("m", base_url="http://mock.test/v1", client=client,
                                      api_key_env="OPENAI_API_KEY"), ENV_KEY),  # explicit: honoured
            (OpenAICompatibleStrategy("m", base_url="http://mock.test/v1", client=client,
                                      api_key_env="MY_ENDPOINT_KEY"), "sk-mine-0123456789"),
            (OpenAICompatibleStrategy("m", base_url="http://mock.test/v1", client=client, api_key="k-1"),
             "k-1"),
            (OpenAICompatibleStrategy("m", base_url="https://api.openai.com/v1", client=client,
                                      api_key_env="MY_ENDPOINT_KEY"), "sk-mine-0123456789"),
        ]
        for strategy, _ in cases:
            await strategy.execute("x", 1, None)
    sent = [r.headers.get("authorization") for r in rec.requests]
    assert sent == [None if key is None else f"Bearer {key}" for _, key in cases]


def test_rel6b_sdk_strategy_does_not_send_the_env_key_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ValueError, match="api_key_env=") as info:
        OpenAIStrategy("m", base_url="http://other.test/v1")
    assert ENV_KEY not in str(info.value)
    assert OpenAIStrategy("m").secret is not None  # OpenAI itself
    explicit = OpenAIStrategy("m", base_url="http://other.test/v1", api_key_env="OPENAI_API_KEY")
    assert explicit.secret is not None and explicit.secret.reveal() == ENV_KEY
    # OPENAI_BASE_URL and OPENAI_API_KEY set together in one environment belong together (the SDK's rule)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://proxy.test/v1")
    paired = OpenAIStrategy("m")
    assert paired.base_url == "http://proxy.test/v1" and paired.secret is not None


async def test_rel6b_401_without_a_key_says_how_to_pass_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    body = {"error": {"message": "Missing bearer token", "code": "invalid_api_key"}}
    rec = Recorder(httpx2.Response(401, json=body))
    async with mock_client(rec) as client:
        strategy = OpenAICompatibleStrategy("m", base_url="http://mock.test/v1", client=client)
        batch = await process_prompts(strategy, ["p"], config=FAST)
        keyed = OpenAICompatibleStrategy("m", base_url="http://mock.test/v1", client=client,
                                         api_key="k-12345678")
        with_key = await process_prompts(keyed, ["p"], config=FAST)
    [result] = batch.results
    assert result.error_category is ErrorCategory.AUTHENTICATION and result.attempts == 1
    assert result.error is not None
    for hint in ("no API key was sent", "api_key=", "api_key_env=", "--api-key-env", "Missing bearer token"):
        assert hint in result.error, result.error
    assert "authorization" not in rec.requests[0].headers
    [other] = with_key.results  # a key was sent and refused: no advice about sending one
    assert other.error_category is ErrorCategory.AUTHENTICATION
    assert "no API key was sent" not in (other.error or "")


def test_rel6b_cli_sends_the_env_key_only_when_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    monkeypatch.setenv("MOCK_KEY", ENV_KEY)
    monkeypatch.delenv("UNSET_KEY_VARIABLE", raising=False)
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "prompt": "hello"}\n')
    with mock_in_thread(anyio_backend, MockServerConfig(api_key=ENV_KEY)) as server:
        args = ("--backend", anyio_backend, "--no-progress")
        refused, refused_out = run_cli(capsys, *cli_run(source, tmp_path / "o1.jsonl", *args,
                                                       base_url=server.base_url))
        named, named_out = run_cli(capsys, *cli_run(source, tmp_path / "o2.jsonl", *args, "--api-key-env",
                                                   "MOCK_KEY", base_url=server.base_url))
        unset, unset_out = run_cli(capsys, *cli_run(source, tmp_path / "o3.jsonl", *args, "--api-key-env",
                                                   "UNSET_KEY_VARIABLE", base_url=server.base_url))
        start, start_out = run_cli(capsys, "runs", "start", str(tmp_path / "r.sqlite"), "run", str(source),
                                   "--model", "openai-compatible:m", "--base-url", server.base_url,
                                   "--backend", anyio_backend)
        started, started_out = run_cli(capsys, "runs", "start", str(tmp_path / "r2.sqlite"), "run",
                                       str(source),
                                       "--model", "openai-compatible:m", "--base-url", server.base_url,
                                       "--api-key-env", "MOCK_KEY", "--backend", anyio_backend)
    assert refused == 1, refused_out
    assert "--api-key-env" in refused_out and "AUTHENTICATION" in refused_out.upper()
    assert named == 0, named_out
    assert unset == 2 and "UNSET_KEY_VARIABLE" in unset_out and "not set" in unset_out
    assert start == 1, start_out
    assert started == 0, started_out
    for text in (refused_out, named_out, unset_out, start_out, started_out, files_text(tmp_path)):
        assert ENV_KEY not in text


def test_rel6b_cli_openai_provider_with_another_base_url_needs_a_named_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    source = tmp_path / "in.jsonl"
    source.write_text('"hello"\n')
    code, output = run_cli(capsys, "run", str(source), "--model", "openai:gpt-4o-mini",
                           "--base-url", DEAD_URL, "--out", str(tmp_path / "out.jsonl"))
    assert code == 2 and "--api-key-env" in output, output
    assert not (tmp_path / "out.jsonl").exists()


# --- rel7: lone surrogates -------------------------------------------------------------------


async def test_rel7_surrogate_prompt_refused_before_any_call(tmp_path: Path) -> None:
    fake = FakeStrategy()
    bad = "caf\ud800e"
    expected = r"item_id='b'\): prompt has a lone surrogate \(U\+D800 at index 3\)"
    with pytest.raises(ValueError, match=r"prompts\[1\] \(" + expected):
        await process_prompts(fake, [("a", "fine"), ("b", bad)])
    with pytest.raises(ValueError, match=r"prompts\[1\] \(item_id='item-1'\): prompt has a lone surrogate"):
        await process_prompts(fake, ["fine", "\udc80"])

    async def lazy() -> AsyncIterator[Any]:
        yield ("b", bad)

    with pytest.raises(ValueError, match=expected):
        async with process_stream(fake, lazy()) as results:
            async for _ in results:
                pass
    async with ParallelBatchProcessor(FAST) as proc:
        with pytest.raises(ValueError, match=r"item_id='b': prompt has a lone surrogate"):
            await proc.add_work(LLMWorkItem(item_id="b", strategy=fake, prompt=bad))
        await proc.process_all()
    with pytest.raises(ValueError, match="prompt has a lone surrogate"):
        await call(fake, bad)
    with pytest.raises(ValueError, match="prompt has a lone surrogate"):
        await call_result(fake, bad)
    async with LLMCallPool(fake) as pool:
        with pytest.raises(ValueError, match="prompt has a lone surrogate"):
            await pool.submit_result(bad)
    assert fake.calls == []
    # a surrogate pair is one ordinary character; it is not refused
    ok = await process_prompts(fake, ["\U0001f600 fine"])
    assert ok.succeeded == 1


def test_rel7_surrogate_cli_input_error(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                        anyio_backend: str) -> None:
    source = tmp_path / "in.jsonl"
    for text, line in (('{"id": "a", "prompt": "ok"}\n{"id": "b", "prompt": "caf\\ud800"}\n', 2),
                       ('"\\udc80 alone"\n', 1)):
        source.write_text(text)
        code, output = run_cli(capsys, *cli_run(source, tmp_path / "out.jsonl", "--backend", anyio_backend))
        assert code == 2, output
        assert f'{source}, line {line}, field "prompt": has a lone surrogate' in output
        assert not (tmp_path / "out.jsonl").exists()


async def test_rel7_surrogate_run_sources(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"id": "a", "prompt": "fine"}\n{"id": "b", "prompt": "x\\ud800"}\n')
    for n, source in enumerate([path, [("a", "fine"), ("b", "x\ud800")]]):
        await assert_run_refuses_second_entry(tmp_path / f"r{n}.sqlite", source,
                                              r"item_id='b'.*prompt has a lone surrogate")


async def test_rel7_surrogate_request_that_cannot_be_encoded_is_invalid_not_retried() -> None:
    rec = Recorder(httpx2.Response(200, json=CHAT_OK))
    async with mock_client(rec) as client:
        # a strategy-level system prompt bypasses the item checks: the request itself cannot be encoded
        strategy = OpenAICompatibleStrategy("m", base_url="http://mock.test/v1", client=client,
                                            system_prompt="be \udfff brief")
        batch = await process_prompts(strategy, ["p"], config=FAST)
    [result] = batch.results
    assert result.error_category is ErrorCategory.INVALID_REQUEST, result.error
    assert result.attempts == 1 and rec.requests == []
    assert result.error is not None and "surrogate" in result.error
    error = UnicodeEncodeError("utf-8", "a\ud800", 1, 2, "surrogates not allowed")
    assert classify(error).category is ErrorCategory.INVALID_REQUEST


async def test_rel7_surrogate_sdk_request_is_invalid_not_retried() -> None:
    rec = Recorder(httpx2.Response(200, json=CHAT_OK))
    async with mock_client(rec) as http:
        client = openai.AsyncOpenAI(api_key="k" * 12, base_url="http://mock.test/v1", http_client=http)
        strategy = OpenAIStrategy("m", client=client, api="chat", system_prompt="\ud800")
        batch = await process_prompts(strategy, ["p"], config=FAST)
    [result] = batch.results
    assert (result.error_category, result.attempts) == (ErrorCategory.INVALID_REQUEST, 1), result.error


# --- rel7: long CSV fields -------------------------------------------------------------------


def test_rel7_csv_field_over_131072_characters_is_read(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    before = csv.field_size_limit()
    long_prompt, long_note = "p" * 200_000, "n" * 1_000_000
    source = tmp_path / "in.csv"
    with source.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "prompt", "note"])
        writer.writerow(["a", long_prompt, long_note])
        writer.writerow(["b", "short", "x"])
    records = read_input(source)
    assert [(r.item_id, len(r.prompt)) for r in records] == [("a", 200_000), ("b", 5)]
    assert records[0].context == {"note": long_note}
    assert csv.field_size_limit() == before  # the process-wide limit is not touched
    # where the interpreter cannot make a private csv module, the shared limit is raised and restored
    from trio_batch_llm._cli import _input_csv as _cli_input

    monkeypatch.setattr(_cli_input, "_private_csv", lambda: None)
    assert [r.item_id for r in read_input(source)] == ["a", "b"]
    assert csv.field_size_limit() == before


def test_rel7_csv_field_over_the_documented_limit_names_the_line(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from trio_batch_llm._cli import _input_csv as _cli_input

    assert _cli_input.CSV_FIELD_LIMIT == 64 * 1024 * 1024
    monkeypatch.setattr(_cli_input, "CSV_FIELD_LIMIT", 1000)
    source = tmp_path / "in.csv"
    source.write_text("id,prompt\na,short\nb," + "x" * 1001 + "\n")
    with pytest.raises(ValueError, match=r"line 3: a field is longer than 1,000 characters"):
        read_input(source)
