"""PydanticAIStrategy with pydantic-ai's own test models (TestModel, FunctionModel): no network.

pydantic-ai's agent loop runs on asyncio only (pydantic-ai issue #7112), so each behaviour is
checked on asyncio and, on Trio, the clear refusal before any model request is checked instead.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RequestUsage, UsageLimits

from trio_batch_llm import (
    ConfigurationError,
    ErrorCategory,
    JsonlArtifactStore,
    LLMCallError,
    LLMCallPool,
    LLMRequest,
    LLMWorkItem,
    ProcessorConfig,
    PydanticAIStrategy,
    ResumePolicy,
    RetryConfig,
    call,
    infer_artifact_identity,
    process_prompts,
)
from trio_batch_llm._engine._classify import classify

pytestmark = pytest.mark.anyio

NO_WAIT = RetryConfig(max_attempts=3, initial_wait=0.0, max_wait=0.0, jitter=False)
FAST = ProcessorConfig(concurrency=4, retry=NO_WAIT)


class Verdict(BaseModel):
    label: str
    score: int


class Script:
    """A FunctionModel's function: each call takes the next step (an exception class raises it)."""

    def __init__(self, *steps: Any, then: Any = "fine") -> None:
        self.steps = list(steps)
        self.then = then
        self.calls: list[tuple[list[ModelMessage], AgentInfo]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.calls.append((messages, info))
        step = self.steps.pop(0) if self.steps else self.then
        if isinstance(step, BaseException):
            raise step
        return ModelResponse(parts=[TextPart(step)],
                             usage=RequestUsage(input_tokens=10, output_tokens=2, cache_read_tokens=4))


def scripted(*steps: Any, then: Any = "fine", **agent_kwargs: Any) -> tuple[PydanticAIStrategy, Script]:
    script = Script(*steps, then=then)
    return PydanticAIStrategy(Agent(FunctionModel(script), **agent_kwargs)), script


def on_trio(anyio_backend: Any) -> bool:
    return anyio_backend == "trio"


def http(status: int, body: Any = None, headers: dict[str, str] | None = None) -> ModelHTTPError:
    return ModelHTTPError(status, "function", body, headers=headers)


# -- outputs, usage, structured output ---------------------------------------------------------------


async def test_text_outputs_and_usage_through_process_prompts(anyio_backend: Any) -> None:
    strategy, script = scripted(then="an answer")
    if on_trio(anyio_backend):
        with pytest.raises(ValueError, match=r"cannot run under Trio.*asyncio"):
            await process_prompts(strategy, ["a", "b"], config=FAST)
        assert script.calls == []  # refused before any model request
        return
    batch = await process_prompts(strategy, ["a", "b", "c"], config=FAST, preserve_order=True)
    assert batch.succeeded == 3 and batch.failed == 0
    for result in batch.results:
        assert result.output == "an answer"
        assert result.token_usage == {"input_tokens": 10, "output_tokens": 2, "total_tokens": 12,
                                      "cached_input_tokens": 4, "cache_write_input_tokens": 0,
                                      "reasoning_tokens": 0}
        assert result.metadata["requests"] == 1 and result.attempts == 1
    assert len(script.calls) == 3


async def test_structured_output_is_the_model_and_a_resume_gives_it_back(
        anyio_backend: Any, tmp_path: Path) -> None:
    agent = Agent(TestModel(), output_type=Verdict)
    strategy = PydanticAIStrategy(agent)
    assert strategy.response_model is Verdict
    assert strategy.response_schema is not None and set(strategy.response_schema["properties"]) == \
        {"label", "score"}
    if on_trio(anyio_backend):
        with pytest.raises(ValueError, match="Trio"):
            await process_prompts(strategy, ["q"], config=FAST)
        return
    store_path = tmp_path / "results.jsonl"
    batch = await process_prompts(strategy, ["q1", "q2"], config=FAST,
                                  artifact_store=JsonlArtifactStore(store_path))
    assert batch.succeeded == 2
    assert all(isinstance(r.output, Verdict) for r in batch.results)
    again = await process_prompts(PydanticAIStrategy(agent), ["q1", "q2"], config=FAST,
                                  artifact_store=JsonlArtifactStore(store_path),
                                  resume=ResumePolicy.REUSE_SUCCESSES)
    assert all(r.replayed for r in again.results)
    assert [r.output for r in again.in_input_order()] == [r.output for r in batch.in_input_order()]
    assert all(isinstance(r.output, Verdict) for r in again.results)


async def test_an_output_type_given_to_the_strategy_wins_over_the_agent_s(anyio_backend: Any) -> None:
    strategy = PydanticAIStrategy(Agent(TestModel()), output_type=Verdict)
    assert strategy.response_model is Verdict
    if on_trio(anyio_backend):
        return
    batch = await process_prompts(strategy, ["q"], config=FAST)
    assert isinstance(batch.results[0].output, Verdict)


# -- the pool, messages, params --------------------------------------------------------------------


async def test_the_pool_submits_and_reports(anyio_backend: Any) -> None:
    strategy, script = scripted(http(503, {"message": "busy"}), then="pooled")
    if on_trio(anyio_backend):
        async with LLMCallPool(strategy, config=FAST) as pool:
            with pytest.raises(ValueError, match="Trio"):
                await pool.submit("x")
        assert script.calls == []
        return
    async with LLMCallPool(strategy, config=FAST) as pool:
        assert await pool.submit("x") == "pooled"  # the 503 was retried by our RetryConfig
        result = await pool.submit_result("y")
    assert result.success and result.output == "pooled" and result.token_usage["input_tokens"] == 10
    assert len(script.calls) == 3


async def test_chat_messages_become_message_history_and_params_model_settings(anyio_backend: Any) -> None:
    strategy, script = scripted(then="ok")
    strategy = PydanticAIStrategy(strategy.agent, params={"temperature": 0.5, "max_tokens": 64},
                                  model_settings={"top_p": 0.9, "temperature": 1.0})
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": [{"type": "text", "text": "Sum "},
                                             {"type": "text", "text": "it"}]}]
    item = LLMWorkItem(item_id="chat", strategy=strategy, prompt=messages, params={"seed": 7, "stop": "END"})
    if on_trio(anyio_backend):
        with pytest.raises(ValueError, match="Trio"):
            await process_prompts(strategy, [item], config=FAST)
        return
    batch = await process_prompts(strategy, [item], config=FAST)
    assert batch.succeeded == 1
    sent, info = script.calls[0]
    parts = [(type(p).__name__, getattr(p, "content", None)) for m in sent for p in m.parts]
    assert parts == [("SystemPromptPart", "Be terse."), ("UserPromptPart", "Hi"), ("TextPart", "Hello."),
                     ("UserPromptPart", "Sum it")]
    assert info.model_settings is not None
    assert {k: info.model_settings.get(k) for k in ("temperature", "top_p", "max_tokens", "seed",
                                                      "stop_sequences")} == \
        {"temperature": 0.5, "top_p": 0.9, "max_tokens": 64, "seed": 7, "stop_sequences": ["END"]}


async def test_an_item_s_system_param_is_the_run_s_instructions(anyio_backend: Any) -> None:
    strategy, script = scripted(then="ok")
    if on_trio(anyio_backend):
        return
    item = LLMWorkItem(item_id="s", strategy=strategy, prompt="q", params={"system": "Answer in French."})
    await process_prompts(strategy, [item], config=FAST)
    sent, _ = script.calls[0]
    assert "Answer in French." in str(getattr(sent[-1], "instructions", ""))


@pytest.mark.parametrize(("prompt", "params", "words"), [
    ([{"role": "tool", "tool_call_id": "1", "content": "x"}, {"role": "user", "content": "q"}], None,
     "role 'tool'"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}], None,
     "not text"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], None, "last message"),
    ("q", {"response_format": {"type": "json_object"}}, "output_type"),
    ("q", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
])
def test_what_an_agent_run_cannot_take_is_refused_at_input(prompt: Any, params: Any, words: str) -> None:
    strategy, _ = scripted()
    problem = strategy.request_problem(LLMRequest(prompt, params or {}))
    assert problem is not None and words in problem


def test_bad_configuration_names_the_field() -> None:
    with pytest.raises(ConfigurationError, match="agent"):
        PydanticAIStrategy(object())
    with pytest.raises(ConfigurationError, match="model=None: the agent has no model"):
        PydanticAIStrategy(Agent())
    with pytest.raises(ConfigurationError, match="usage_limits"):
        PydanticAIStrategy(Agent(TestModel()), usage_limits={"request_limit": 1})
    with pytest.raises(ConfigurationError, match=r"params.*'tool_choice'"):
        PydanticAIStrategy(Agent(TestModel()), params={"tool_choice": "auto"})
    with pytest.raises(ConfigurationError, match=r"params.*unknown key 'temprature'"):
        PydanticAIStrategy(Agent(TestModel()), params={"temprature": 1})


# -- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("error", "category", "retry_after"), [
    (http(429, {"message": "slow down"}, {"retry-after": "7"}), ErrorCategory.RATE_LIMIT, 7.0),
    (http(500, {"message": "oops"}), ErrorCategory.SERVER, None),
    (http(503, "upstream"), ErrorCategory.SERVER, None),
    (http(401, {"message": "bad key"}), ErrorCategory.AUTHENTICATION, None),
    (http(403, {"message": "no"}), ErrorCategory.AUTHENTICATION, None),
    (http(400, {"message": "bad field"}), ErrorCategory.INVALID_REQUEST, None),
    (http(400, {"message": "x", "code": "context_length_exceeded"}), ErrorCategory.CONTEXT_LENGTH, None),
    (http(429, {"message": "pay", "code": "insufficient_quota"}), ErrorCategory.INSUFFICIENT_BALANCE, None),
    (http(402, {"message": "credits"}), ErrorCategory.INSUFFICIENT_BALANCE, None),
])
def test_model_http_errors_are_filed_by_status(error: Exception, category: ErrorCategory,
                                               retry_after: float | None) -> None:
    strategy, _ = scripted()
    verdict = classify(error, strategy_classifier=strategy.classify_error)
    assert verdict.category is category
    assert verdict.retry_after == retry_after
    assert verdict.status_code == error.status_code  # type: ignore[attr-defined]


def test_errors_without_a_status_are_filed_by_class() -> None:
    from pydantic_ai import exceptions as pe

    strategy, _ = scripted()
    cases = {
        pe.ModelRateLimitError("m", "slow", retry_after=3.0): (ErrorCategory.RATE_LIMIT, 3.0),
        pe.ModelServerError("m", "boom"): (ErrorCategory.SERVER, None),
        pe.ModelConnectionError("m", "reset"): (ErrorCategory.TRANSIENT, None),
        pe.ModelContextWindowExceededError("m", "too long"): (ErrorCategory.CONTEXT_LENGTH, None),
        pe.UsageLimitExceeded("Exceeded the request_limit of 1"): (ErrorCategory.INVALID_REQUEST, None),
        pe.UnexpectedModelBehavior("Exceeded maximum output retries (1)"): (ErrorCategory.PARSE, None),
        pe.ContentFilterError("refused"): (ErrorCategory.CONTENT_POLICY, None),
        pe.UserError("misconfigured"): (ErrorCategory.INVALID_REQUEST, None),
    }
    for error, expected in cases.items():
        assert strategy.classify_error(error) == expected, type(error).__name__
    assert strategy.classify_error(ValueError("a tool's own bug")) is None  # the default rules decide


async def test_a_rate_limit_is_retried_after_its_hint_and_a_client_error_is_not(anyio_backend: Any) -> None:
    if on_trio(anyio_backend):
        return
    strategy, script = scripted(http(429, {"message": "slow"}, {"retry-after": "0"}), then="after 429")
    batch = await process_prompts(strategy, ["q"], config=FAST)
    assert batch.results[0].output == "after 429" and batch.results[0].attempts == 2
    strategy, script = scripted(http(400, {"message": "bad field"}))
    batch = await process_prompts(strategy, ["q"], config=FAST)
    result = batch.results[0]
    assert not result.success and result.error_category is ErrorCategory.INVALID_REQUEST
    assert result.attempts == 1 and len(script.calls) == 1
    assert isinstance(result.exception, ModelHTTPError)  # not wrapped (CONTRACT C7.2)


async def test_retries_follow_our_retry_config(anyio_backend: Any) -> None:
    if on_trio(anyio_backend):
        return
    strategy, script = scripted(http(503, "busy"), http(502, "busy"), then="third time")
    batch = await process_prompts(strategy, ["q"], config=FAST)
    assert batch.results[0].output == "third time" and batch.results[0].attempts == 3
    assert len(script.calls) == 3
    strategy, script = scripted(http(503, "busy"), http(502, "busy"), then="never seen")
    two = ProcessorConfig(concurrency=1, retry=RetryConfig(max_attempts=2, initial_wait=0.0, max_wait=0.0))
    batch = await process_prompts(strategy, ["q"], config=two)
    result = batch.results[0]
    assert not result.success and result.error_category is ErrorCategory.SERVER and result.attempts == 2
    assert len(script.calls) == 2


async def test_output_retries_exhausted_is_parse_and_retried_within_the_attempts(anyio_backend: Any) -> None:
    if on_trio(anyio_backend):
        return
    strategy, script = scripted(then="not json at all", output_type=Verdict)
    batch = await process_prompts(strategy, ["q"], config=FAST)
    result = batch.results[0]
    assert not result.success and result.error_category is ErrorCategory.PARSE
    assert result.attempts == 3
    assert len(script.calls) == 3 * 2  # each run: the answer and the agent's one output retry


async def test_a_usage_limit_fails_the_item_without_retrying(anyio_backend: Any) -> None:
    if on_trio(anyio_backend):
        return
    script = Script(then="long answer")
    strategy = PydanticAIStrategy(Agent(FunctionModel(script)),
                                  usage_limits=UsageLimits(output_tokens_limit=1))
    batch = await process_prompts(strategy, ["q"], config=FAST)
    result = batch.results[0]
    assert not result.success and result.error_category is ErrorCategory.INVALID_REQUEST
    assert "output_tokens_limit" in (result.error or "") and result.attempts == 1


async def test_spent_credits_stop_the_batch(anyio_backend: Any) -> None:
    if on_trio(anyio_backend):
        return
    strategy, script = scripted(then=http(429, {"message": "pay", "code": "insufficient_quota"}))
    batch = await process_prompts(strategy, [f"q{i}" for i in range(5)],
                                  config=ProcessorConfig(concurrency=1, retry=NO_WAIT), preserve_order=True)
    assert batch.succeeded == 0 and len(script.calls) == 1  # no retry, no later item called
    assert batch.results[0].error_category is ErrorCategory.INSUFFICIENT_BALANCE
    assert [r.error_category for r in batch.results[1:]] == [ErrorCategory.NOT_EXECUTED] * 4
    assert batch.termination.kind == "provider_retired" and "insufficient_quota" in batch.termination.reason


async def test_call_raises_llm_call_error_with_the_agent_s_exception(anyio_backend: Any) -> None:
    if on_trio(anyio_backend):
        return
    strategy, _ = scripted(then=http(401, {"message": "bad key"}))

    with pytest.raises(LLMCallError) as caught:
        await call(strategy, "q", config=FAST)
    failed = caught.value.result
    assert failed is not None and failed.error_category is ErrorCategory.AUTHENTICATION
    assert isinstance(failed.exception, ModelHTTPError) and failed.attempts == 1


# -- cancellation --------------------------------------------------------------------------------------


async def test_cancelling_a_run_midway_cancels_the_agent_and_passes_through(anyio_backend: Any) -> None:
    if on_trio(anyio_backend):
        return
    started = anyio.Event()
    seen: list[str] = []

    async def hangs(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            seen.append("cancelled")
        raise AssertionError("unreachable")

    strategy = PydanticAIStrategy(Agent(FunctionModel(hangs)))
    outcome: list[object] = []
    async with anyio.create_task_group() as tg:
        async def run() -> None:
            outcome.append(await process_prompts(strategy, ["q"], config=FAST))

        tg.start_soon(run)
        await started.wait()
        tg.cancel_scope.cancel()
    assert seen == ["cancelled"] and outcome == []


async def test_an_attempt_deadline_cancels_the_run_and_is_a_timeout(anyio_backend: Any) -> None:
    if on_trio(anyio_backend):
        return
    calls: list[int] = []

    async def slow(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.append(1)
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    strategy = PydanticAIStrategy(Agent(FunctionModel(slow)))
    config = ProcessorConfig(concurrency=1, attempt_timeout=0.05,
                             retry=RetryConfig(max_attempts=2, initial_wait=0.0, max_wait=0.0))
    batch = await process_prompts(strategy, ["q"], config=config)
    result = batch.results[0]
    assert not result.success and result.error_category is ErrorCategory.TIMEOUT and len(calls) == 2


# -- identity: quota scope, cache key, import ---------------------------------------------------------


def test_strategies_over_one_agent_share_a_quota_scope_and_cache_keys() -> None:
    agent = Agent(TestModel(), system_prompt="Be kind.", model_settings={"temperature": 0.0})
    one, two = PydanticAIStrategy(agent), PydanticAIStrategy(agent)
    assert one.quota_scope() == two.quota_scope() == ("pydantic-ai", "test", "test", None)
    assert one.model_name == "test" and one.provider_name == "test"
    request = LLMRequest("q")
    key = one.cache_key_material(request)
    assert key is not None and key == two.cache_key_material(request)
    assert key["agent"]["system_prompts"] == ["Be kind."]
    rude = PydanticAIStrategy(Agent(TestModel(), system_prompt="Be rude.", instructions="Be brief."))
    assert one.system_prompt == "Be kind." and rude.system_prompt == "Be rude.\n\nBe brief."
    assert infer_artifact_identity(one) == infer_artifact_identity(two) != infer_artifact_identity(rude)
    assert key["model_settings"] == {} and key["agent"]["model_settings"] == {"temperature": 0.0}
    differs: list[Callable[[], Any]] = [
        lambda: one.cache_key_material(LLMRequest("other")),
        lambda: one.cache_key_material(LLMRequest("q", {"temperature": 0.7})),
        lambda: PydanticAIStrategy(Agent(TestModel(), system_prompt="Be rude.")).cache_key_material(request),
        lambda: PydanticAIStrategy(agent, output_type=Verdict).cache_key_material(request),
        lambda: PydanticAIStrategy(agent, model="openai:gpt-4o-mini").cache_key_material(request),
    ]
    for other in differs:
        assert other() not in (None, key)


def test_an_agent_with_dynamic_prompts_is_not_cached_unless_asked() -> None:
    agent = Agent(TestModel())

    @agent.system_prompt
    def today() -> str:
        return "It is Monday."

    assert PydanticAIStrategy(agent).cache_key_material(LLMRequest("q")) is None
    assert PydanticAIStrategy(agent, cacheable=True).cache_key_material(LLMRequest("q")) is not None
    assert PydanticAIStrategy(Agent(TestModel()), cacheable=False).cache_key_material(LLMRequest("q")) is None


def test_importing_the_library_does_not_import_pydantic_ai() -> None:
    code = "import sys, trio_batch_llm; print('pydantic_ai' in sys.modules)"
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "False"


def test_stored_outputs_decode_to_the_output_type() -> None:
    verdicts = PydanticAIStrategy(Agent(TestModel(), output_type=Verdict))
    assert verdicts.decode_output({"label": "ok", "score": 3}) == Verdict(label="ok", score=3)
    numbers = PydanticAIStrategy(Agent(TestModel(), output_type=list[int]))
    assert numbers.response_model is None and numbers.response_schema == {"items": {"type": "integer"},
                                                                          "type": "array"}
    assert numbers.decode_output([1, 2]) == [1, 2]
    text = PydanticAIStrategy(Agent(TestModel()))
    assert text.response_schema is None and text.decode_output("plain") == "plain"
