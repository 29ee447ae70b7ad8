"""Requests: chat messages and per-item params, checked at input and sent as each API spells them.

Over real loopback HTTP against the mock server (which records each request as received), on both
backends, for both OpenAI strategies and both APIs.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from trio_batch_llm import (
    ArtifactIdentity,
    JsonlArtifactStore,
    LLMCallStrategy,
    LLMWorkItem,
    ParallelBatchProcessor,
    ProcessorConfig,
    ResumePolicy,
    process_prompts,
)
from trio_batch_llm._artifacts import fingerprint, item_fingerprint, request_fingerprint
from trio_batch_llm._strategies.openai._compatible import OpenAICompatibleStrategy
from trio_batch_llm._strategies.openai._sdk import OpenAIStrategy
from trio_batch_llm._values._errors import ConfigurationError
from trio_batch_llm._values._requests import LLMRequest, request_of_text, request_text
from trio_batch_llm._values._results import RetryState, TokenUsage
from trio_batch_llm.mock import MockServer, MockServerConfig, serve_mock

pytestmark = pytest.mark.anyio

KEY = "sk-mock-requests-0123"
Strategy = OpenAICompatibleStrategy | OpenAIStrategy
KINDS = [("compatible", "chat"), ("compatible", "responses"), ("sdk", "chat"), ("sdk", "responses")]
IMAGE = "data:image/png;base64,iVBORw0KGgo="


@pytest.fixture
async def server() -> AsyncIterator[MockServer]:
    async with serve_mock(MockServerConfig(api_key=KEY)) as running:
        yield running


def build(kind: str, server: MockServer, api: str, **kwargs: Any) -> Strategy:
    kwargs.setdefault("api_key", KEY)
    if kind == "compatible":
        return OpenAICompatibleStrategy("mock-model", base_url=server.base_url, api=api, **kwargs)
    return OpenAIStrategy("mock-model", base_url=server.base_url, api=api, **kwargs)


MESSAGES = [
    {"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                 {"type": "image_url", "image_url": {"url": IMAGE, "detail": "low"}}]},
    {"role": "assistant", "content": "A cat."},
    {"role": "user", "content": "And its colour?"},
]


@pytest.mark.parametrize(("kind", "api"), KINDS)
async def test_messages_and_params_on_the_wire(server: MockServer, kind: str, api: str) -> None:
    strategy = build(kind, server, api, system_prompt="strategy system", temperature=0.9,
                     params={"top_p": 0.5, "max_output_tokens": 50, "extra_body": {"user": "u-1"}})
    item_params: dict[str, Any] = {"system": "item system", "temperature": 0.1, "max_tokens": 20}
    if api == "chat":
        item_params.update(seed=7, stop=["\n\n"])
    items = [{"id": "m", "messages": MESSAGES, "params": item_params, "context": {"n": 1}},
             {"id": "p", "prompt": "plain"}]
    batch = await process_prompts(strategy, items)
    assert batch.succeeded == 2, [r.error for r in batch]
    by_prompt = {r.prompt: r.body for r in server.requests}
    assert len(by_prompt) == 2
    plain = by_prompt["strategy system\nplain"]
    sent = next(body for prompt, body in by_prompt.items() if "picture" in (prompt or ""))
    if api == "chat":
        assert sent["messages"] == [{"role": "system", "content": "item system"}, *MESSAGES]
        tokens_field = "max_completion_tokens" if kind == "sdk" else "max_tokens"
        assert sent[tokens_field] == 20 and sent["seed"] == 7 and sent["stop"] == ["\n\n"]
        assert plain["messages"] == [{"role": "system", "content": "strategy system"},
                                     {"role": "user", "content": "plain"}]
        assert plain[tokens_field] == 50
    else:
        assert sent["instructions"] == "item system"
        assert sent["input"] == [
            {"role": "user", "content": [{"type": "input_text", "text": "What is in this picture?"},
                                         {"type": "input_image", "image_url": IMAGE, "detail": "low"}]},
            {"role": "assistant", "content": "A cat."},
            {"role": "user", "content": "And its colour?"},
        ]
        assert sent["max_output_tokens"] == 20
        assert plain["input"] == "plain" and plain["instructions"] == "strategy system"
        assert plain["max_output_tokens"] == 50
    assert sent["temperature"] == 0.1 and plain["temperature"] == 0.9
    assert sent["top_p"] == 0.5 and sent["user"] == "u-1" and plain["user"] == "u-1"
    result = batch.by_id()["m"]
    assert result.context == {"n": 1}
    assert result.metadata["model"] == "mock-model"
    assert result.details is not None and result.details.finish_reason == "stop"


@pytest.mark.parametrize("kind", ["compatible", "sdk"])
async def test_batch_api_lines_carry_messages_and_params(server: MockServer, kind: str) -> None:
    strategy = build(kind, server, "chat", params={"temperature": 0.3})
    request = LLMRequest(MESSAGES, {"system": "s", "max_output_tokens": 9})
    endpoint = strategy.batch_endpoint()
    line = endpoint.encode_request("a", request_text(request.prompt, request.params))
    body = json.loads(line.line)["body"]
    assert body["messages"][0] == {"role": "system", "content": "s"}
    assert body["messages"][1:] == MESSAGES
    assert body["temperature"] == 0.3
    assert body["max_completion_tokens" if kind == "sdk" else "max_tokens"] == 9
    assert "And its colour?" in line.text


async def test_unknown_param_refused_before_any_call(server: MockServer) -> None:
    strategy = build("compatible", server, "chat")
    with pytest.raises(ValueError, match=r"prompts\[1\].*unknown key 'temprature'.*extra_body"):
        await process_prompts(strategy, ["a", {"id": "b", "prompt": "b", "params": {"temprature": 1}}])
    with pytest.raises(ValueError, match=r"params\['max_tokens'\]=0 must be a positive integer"):
        await process_prompts(strategy, [{"id": "b", "prompt": "b", "params": {"max_tokens": 0}}])
    with pytest.raises(ValueError, match=r'exactly one of "prompt" and "messages"'):
        await process_prompts(strategy, [{"id": "b", "prompt": "x", "messages": MESSAGES}])
    with pytest.raises(ValueError, match=r"messages\[0\] role='robot'"):
        await process_prompts(strategy, [{"id": "b", "messages": [{"role": "robot", "content": "x"}]}])
    responses = build("compatible", server, "responses")
    with pytest.raises(ValueError, match=r"params\['seed'\]: the Responses API has no seed"):
        await process_prompts(responses, [{"id": "b", "prompt": "x", "params": {"seed": 1}}])
    with pytest.raises(ConfigurationError, match="params"):
        build("compatible", server, "chat", params={"bogus": 1})
    assert server.requests == []  # nothing was sent


class TextOnly(LLMCallStrategy[str]):
    """A strategy written before requests existed: execute(prompt: str, ...) only."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    async def execute(self, prompt: str, attempt: int, timeout: float | None,
                      state: RetryState | None = None) -> tuple[str, TokenUsage | None, Any]:
        self.prompts.append(prompt)
        return prompt.upper(), None, None


async def test_text_only_strategy_keeps_working_and_refuses_messages() -> None:
    strategy = TextOnly()
    batch = await process_prompts(strategy, ["a", ("b", "bee"), {"id": "c", "prompt": "sea"}])
    assert sorted(batch.outputs()) == ["A", "BEE", "SEA"]  # type: ignore[type-var]
    with pytest.raises(ValueError, match=r"TextOnly takes text prompts only.*chat messages.*execute_request"):
        await process_prompts(strategy, ["x", {"id": "m", "messages": MESSAGES}])
    with pytest.raises(ValueError, match=r"TextOnly takes text prompts only.*params \(temperature\)"):
        await process_prompts(strategy, [LLMWorkItem("w", strategy, "x", params={"temperature": 0})])
    assert sorted(strategy.prompts) == ["a", "bee", "sea"]  # the refused batches made no call


async def test_changed_request_is_not_replayed(server: MockServer, tmp_path: Path) -> None:
    strategy = build("compatible", server, "chat")
    identity = ArtifactIdentity(provider="openai-compatible", model="mock-model")
    path = tmp_path / "run.jsonl"

    def items(temperature: float, last: str) -> list[Any]:
        return [{"id": "a", "prompt": "same"},
                {"id": "b", "messages": [{"role": "user", "content": "hi"}], "params": {"temperature": 0.5}},
                {"id": "c", "messages": [{"role": "user", "content": last}],
                 "params": {"temperature": temperature}}]

    first = await process_prompts(strategy, items(0.5, "x"),
                                  artifact_store=JsonlArtifactStore(path, identity=identity))
    assert first.succeeded == 3
    again = await process_prompts(strategy, items(0.7, "x"), resume=ResumePolicy.REUSE_SUCCESSES,
                                  artifact_store=JsonlArtifactStore(path, identity=identity))
    assert {r.item_id: r.replayed for r in again} == {"a": True, "b": True, "c": False}
    third = await process_prompts(strategy, items(0.7, "y"), resume=ResumePolicy.REUSE_SUCCESSES,
                                  artifact_store=JsonlArtifactStore(path, identity=identity))
    assert {r.item_id: r.replayed for r in third} == {"a": True, "b": True, "c": False}
    assert len(server.requests) == 5


def test_fingerprints_and_request_text() -> None:
    assert request_fingerprint("p", None, {"c": 1}) == fingerprint("p", {"c": 1})  # old checkpoints match
    keyed = {request_fingerprint("p", {"temperature": 0.1}, None), request_fingerprint("p", None, None),
             request_fingerprint([{"role": "user", "content": "p"}], None, None),
             request_fingerprint("p", {"temperature": 0.2}, None)}
    assert len(keyed) == 4
    for prompt, params in (("plain", None), (MESSAGES, {"seed": 1}), ("\x00trio-batch-llm-request:x", None)):
        assert request_of_text(request_text(prompt, params)) == (prompt, params)
    assert request_text("plain") == "plain"


def test_a_sample_is_part_of_the_checkpoint_fingerprint() -> None:
    # A resume must not replay sample 0's answer for an item whose row now asks for sample 1;
    # sample 0 keeps the fingerprint items had before samples existed (old checkpoints match).
    strategy = Recording()
    prints = [item_fingerprint(LLMWorkItem("a", strategy, "p", sample=k)) for k in (0, 1, 2)]
    assert prints[0] == request_fingerprint("p", None, None) == fingerprint("p", None)
    assert len(set(prints)) == 3


class Recording(LLMCallStrategy[str]):
    """Takes requests: records each one it is given."""

    def __init__(self) -> None:
        self.requests: list[LLMRequest] = []

    async def execute_request(self, request: LLMRequest, attempt: int, timeout: float | None,
                              state: RetryState | None = None) -> tuple[str, TokenUsage | None, Any]:
        self.requests.append(request)
        return request.text, None, None


async def test_jsonl_rows_with_messages_and_params_reach_a_run(tmp_path: Path) -> None:
    from trio_batch_llm import open_run

    rows = [{"id": "a", "messages": [{"role": "user", "content": "hi"}], "params": {"max_tokens": 5}},
            {"id": "b", "prompt": "plain", "params": {"temperature": 0}}, {"id": "c", "prompt": "bare"}]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    strategy = Recording()
    identity = ArtifactIdentity("test", "recording")  # Recording declares no model (issue 31)
    async with await open_run(tmp_path / "runs.sqlite", "r", strategy, source, identity=identity) as run:
        snap = await run.wait()
    assert snap.succeeded == 3
    got = {r.text: (r.prompt, dict(r.params)) for r in strategy.requests}
    assert got == {"hi": ([{"role": "user", "content": "hi"}], {"max_output_tokens": 5}),
                   "plain": ("plain", {"temperature": 0}), "bare": ("bare", {})}


def test_cli_jsonl_rows_with_messages_and_params(tmp_path: Path) -> None:
    from trio_batch_llm._cli._input_jsonl import classify_line

    path = tmp_path / "in.jsonl"
    line = json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}], "params": {"seed": 1}})
    item_id, text, _, _ = classify_line(path, line, 1)  # type: ignore[misc]
    assert item_id == "a" and request_of_text(text) == ([{"role": "user", "content": "hi"}], {"seed": 1})
    problem = classify_line(path, json.dumps({"id": "a", "prompt": "x", "params": {"tempo": 1}}), 3)
    assert 'line 3, field "params"' in str(problem) and "unknown key 'tempo'" in str(problem)
    problem = classify_line(path, json.dumps({"id": "a", "messages": "hi"}), 4)
    assert 'line 4, field "messages"' in str(problem)
    assert classify_line(path, json.dumps({"id": "a", "prompt": "x"}), 5) == ("a", "x", None, 0)


class TextOnlyCounting(LLMCallStrategy[str]):
    """Takes text: records each prompt and how deep below its worker each call runs."""

    def __init__(self) -> None:
        self.prompts: list[str] = []
        self.depth: list[int] = []

    async def execute(self, prompt: str, attempt: int, timeout: float | None,
                      state: RetryState | None = None) -> tuple[str, TokenUsage | None, Any]:
        self.prompts.append(prompt)
        self.depth.append(_frames_to_worker())
        return prompt.upper(), None, None


def _frames_to_worker() -> int:
    """Python frames between this call and the worker task that runs it (``Crew._work``)."""
    frame = sys._getframe(1)
    depth = 0
    while frame is not None and frame.f_code.co_qualname != "Crew._work":
        depth += 1
        frame = frame.f_back
    assert frame is not None, "not called from a worker"
    return depth


async def test_a_text_strategys_execute_is_awaited_straight_from_the_item_path() -> None:
    # A cancellation unwinds every frame of every call in flight: each one costs a frame object
    # and a traceback (about 2 us a worker on asyncio). The worker's loop, the item path, the
    # call: nothing in between, not even the default execute_request, which only passes the text.
    strategy = TextOnlyCounting()
    async with ParallelBatchProcessor[str](ProcessorConfig(concurrency=2)) as proc:
        for i in range(3):
            await proc.add_work(LLMWorkItem(item_id=f"i{i}", strategy=strategy, prompt=f"p{i}"))
        batch = await proc.process_all()
    assert sorted(r.output or "" for r in batch.results) == ["P0", "P1", "P2"]
    assert strategy.depth == [3, 3, 3]  # execute <- ItemRunner.drive <- Crew._loop <- Crew._work


async def test_an_execute_request_set_on_the_instance_is_still_the_call() -> None:
    strategy = TextOnlyCounting()
    seen: list[str] = []

    async def on_instance(request: LLMRequest, attempt: int, timeout: float | None,
                          state: RetryState | None = None) -> tuple[str, TokenUsage | None, Any]:
        seen.append(request.text)
        return "instance", None, None

    strategy.execute_request = on_instance  # type: ignore[method-assign]
    batch = await process_prompts(strategy, ["a", "b"], concurrency=1)
    assert [r.output for r in batch.results] == ["instance", "instance"]
    assert seen == ["a", "b"] and strategy.prompts == []
