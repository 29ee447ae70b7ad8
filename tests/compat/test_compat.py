"""async-batch-llm's forms accepted beside ours: classifier objects, 2-tuple ``execute()``,
``quota_scope`` as a property, a 429 said only in words, the config's ``post_processor_timeout``,
result constructors, per-event observers, middlewares, per-attempt timing, config warnings."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import anyio
import pytest

from trio_batch_llm import (
    AttemptTiming,
    BaseMiddleware,
    BaseObserver,
    BatchResult,
    CallableStrategy,
    DefaultErrorClassifier,
    ErrorCategory,
    ErrorInfo,
    FakeStrategy,
    ItemCompleted,
    ItemFailed,
    LLMCallStrategy,
    LLMWorkItem,
    OpenAIErrorClassifier,
    ParallelBatchProcessor,
    ProcessorConfig,
    ProviderError,
    RateLimitConfig,
    RetryConfig,
    TokenUsage,
    WorkItemResult,
    call_result,
    process_prompts,
)
from trio_batch_llm._engine._classify import classify
from trio_batch_llm._values import _config_warnings
from trio_batch_llm.testing import FakeRateLimitError

pytestmark = pytest.mark.anyio

FAST = ProcessorConfig(
    max_workers=2,
    retry=RetryConfig(max_attempts=3, initial_wait=0.0, max_wait=0.0),
    rate_limit=RateLimitConfig(cooldown_seconds=0.001, max_cooldown_seconds=0.001, slow_start_seconds=0.0),
)


class Custom(Exception):
    pass


def _failing(exc: Exception, *, times: int = 10**6) -> CallableStrategy[str]:
    calls: list[int] = []

    async def fn(prompt: str) -> str:
        await anyio.lowlevel.checkpoint()
        calls.append(1)
        if len(calls) <= times:
            raise exc
        return prompt.upper()

    strategy = CallableStrategy(fn)
    strategy.calls = calls  # type: ignore[attr-defined]
    return strategy


# --- classifiers ---------------------------------------------------------------


class _MineAreRateLimits(DefaultErrorClassifier):
    def classify(self, exception: Exception) -> ErrorInfo:
        if isinstance(exception, Custom):
            return ErrorInfo(is_retryable=True, is_rate_limit=True, is_timeout=False,
                             error_category="rate_limit", suggested_wait=0.001)
        return super().classify(exception)


class _Permanent(DefaultErrorClassifier):
    def classify(self, exception: Exception) -> ErrorInfo:
        return ErrorInfo(is_retryable=False, is_rate_limit=False, is_timeout=False,
                         error_category="logic_error")


async def test_a_classifier_object_decides_like_a_function() -> None:
    strategy = _failing(Custom("mine"), times=1)
    result = await call_result(strategy, "p", config=FAST, error_classifier=_MineAreRateLimits())
    assert result.success and result.output == "P"
    assert strategy.calls == [1, 1]  # type: ignore[attr-defined]
    permanent = await call_result(_failing(Custom("mine")), "p", config=FAST, error_classifier=_Permanent())
    # async-batch-llm's "logic_error" is a category of ours too now (issue 31), so it is kept as said.
    assert (permanent.error_category, permanent.attempts) == (ErrorCategory.LOGIC_ERROR, 1)


async def test_an_anchor_category_string_maps_to_ours() -> None:
    class ByLabel(DefaultErrorClassifier):
        def classify(self, exception: Exception) -> ErrorInfo:
            return ErrorInfo(is_retryable=True, is_rate_limit=False, is_timeout=False,
                             error_category="server_error")

    result = await call_result(_failing(Custom("x")), "p", config=FAST, error_classifier=ByLabel())
    assert (result.error_category, result.attempts) == (ErrorCategory.SERVER, 3)


def test_default_classifier_objects_report_the_built_in_rules() -> None:
    for classifier in (DefaultErrorClassifier(), OpenAIErrorClassifier()):
        info = classifier.classify(TimeoutError("slow"))
        assert (info.is_timeout, info.is_retryable, info.error_category) == (True, True, "timeout")
        assert classifier.classify(Exception("HTTP 429 Too Many Requests")).is_rate_limit


def test_a_classifier_class_or_a_non_callable_is_refused() -> None:
    with pytest.raises(TypeError, match=r"pass an instance \(DefaultErrorClassifier\(\)\)"):
        ParallelBatchProcessor(error_classifier=DefaultErrorClassifier)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a callable or have a classify"):
        ParallelBatchProcessor(error_classifier=42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "category"),
    [("HTTP 429 Too Many Requests", ErrorCategory.RATE_LIMIT), ("Error code: 429", ErrorCategory.RATE_LIMIT),
     ("rate limit reached", ErrorCategory.RATE_LIMIT), ("Expected 4290 tokens", ErrorCategory.UNKNOWN),
     ("version 1.429.0", ErrorCategory.UNKNOWN),
     ("429 insufficient_quota", ErrorCategory.INSUFFICIENT_BALANCE)],
)
def test_a_plain_exception_saying_429_is_a_rate_limit(text: str, category: ErrorCategory) -> None:
    assert classify(Exception(text)).category is category


async def test_fake_rate_limit_error_goes_through_the_cooldown() -> None:
    # Without learning no probe call goes alone after the cooldown: the test takes no time.
    no_learning = dataclasses.replace(
        FAST, rate_limit=dataclasses.replace(FAST.rate_limit, learn_limits=False)
    )
    result = await call_result(_failing(FakeRateLimitError(), times=2), "p", config=no_learning)
    assert result.success
    assert classify(FakeRateLimitError()).status_code == 429


# --- strategies ------------------------------------------------------------------


class _TwoTuple(LLMCallStrategy[str]):
    async def execute(self, prompt: str, attempt: int, timeout: float | None, state: Any = None) -> Any:
        await anyio.lowlevel.checkpoint()
        return prompt[::-1], {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}


class _ScopeProperty(LLMCallStrategy[str]):
    @property  # type: ignore[override]
    def quota_scope(self) -> str:
        return "shared-key"

    async def execute(self, prompt: str, attempt: int, timeout: float | None, state: Any = None
                      ) -> tuple[str, TokenUsage, dict[str, Any]]:
        await anyio.lowlevel.checkpoint()
        return prompt, {}, {}


async def test_execute_may_return_the_anchors_two_tuple() -> None:
    result = await call_result(_TwoTuple(), "abc", config=FAST)
    assert (result.success, result.output, result.token_usage["total_tokens"]) == (True, "cba", 5)
    assert result.metadata == {}


async def test_quota_scope_may_be_a_property() -> None:
    one, two = _ScopeProperty(), _ScopeProperty()
    async with ParallelBatchProcessor[str](FAST) as proc:
        assert proc.host.quota_scope(one) is proc.host.quota_scope(two)  # one key -> one shared scope
        for k, strategy in enumerate((one, two)):
            await proc.add_work(LLMWorkItem(item_id=f"s{k}", strategy=strategy, prompt="x"))
        assert (await proc.process_all()).succeeded == 2


# --- config and results ------------------------------------------------------------------


async def test_post_processor_timeout_on_the_config_and_the_argument_wins() -> None:
    async def slow(result: WorkItemResult[str]) -> None:
        await anyio.sleep(0.2)

    cfg = ProcessorConfig(post_processor_timeout=0.01)
    timed_out = await process_prompts(FakeStrategy(), ["a"], config=cfg, post_processor=slow)
    assert timed_out.results[0].error_category is ErrorCategory.PARSE
    kept = await process_prompts(FakeStrategy(), ["a"], config=cfg, post_processor=slow,
                                 post_processor_timeout=None)
    assert kept.succeeded == 1


def test_post_processor_timeout_is_validated() -> None:
    with pytest.raises(ValueError, match="post_processor_timeout"):
        ProcessorConfig(post_processor_timeout=0)


def test_result_constructors_take_the_anchors_forms() -> None:
    ok = WorkItemResult("a", True, "out")
    bad = WorkItemResult("b", False, None, "boom", error_category=ErrorCategory.SERVER)
    batch = BatchResult(results=[ok, bad])
    assert (batch.total_items, batch.succeeded, batch.failed) == (2, 1, 1)
    assert BatchResult([ok], total_items=1, succeeded=1, failed=0).succeeded == 1
    with pytest.raises(ValueError, match="succeeded=2: the results say 1"):
        BatchResult(results=[ok, bad], succeeded=2)


def test_a_suspicious_config_warns_naming_the_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.warns(UserWarning, match=r"max_provider_concurrency=9 > workers=3"):
        ProcessorConfig(concurrency=3, max_provider_concurrency=9)
    monkeypatch.setattr(_config_warnings, "open_file_limit", lambda: 256)
    monkeypatch.setattr(_config_warnings, "open_files", lambda: 10)  # (capacity warnings: once a process)
    monkeypatch.setattr(_config_warnings, "_WARNED", set())
    with pytest.warns(UserWarning, match=r"concurrency=200 .* 256 \(RLIMIT_NOFILE\)"):
        ProcessorConfig(concurrency=200)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ProcessorConfig(concurrency=100, max_provider_concurrency=100)


# --- per-attempt timing -------------------------------------------------------------------


async def test_each_call_gets_an_attempt_timing_record() -> None:
    fake = FakeStrategy(script={"p": [RuntimeError("first"), RuntimeError("second")]})
    result = await call_result(fake, "p", config=FAST)
    assert result.success and result.attempts == 3
    records = result.timing.attempts
    assert [r.attempt for r in records] == [1, 2, 3]
    assert all(isinstance(r, AttemptTiming) for r in records)
    assert sum(r.execution for r in records) == pytest.approx(result.timing.execution)
    assert sum(r.admission_wait for r in records) == pytest.approx(result.timing.admission_wait)
    assert sum(r.backoff for r in records) == pytest.approx(result.timing.backoff)


# --- observers and middlewares ---------------------------------------------------------------


class _Counting(BaseObserver):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_batch_started(self, event: Any) -> None:
        self.seen.append("batch")

    def on_item_completed(self, event: ItemCompleted) -> None:
        self.seen.append(f"ok:{event.result.item_id}")

    def on_item_failed(self, event: ItemFailed) -> None:
        self.seen.append(f"failed:{event.result.item_id}")

    def on_batch_finished(self, event: Any) -> None:
        self.seen.append("done")


async def test_per_event_observer_methods_are_called() -> None:
    observer = _Counting()
    fake = FakeStrategy(script={"b": [ValueError("no")] * 3})
    await process_prompts(fake, ["a", "b"], config=FAST, observers=[observer], preserve_order=True)
    assert observer.seen[0] == "batch" and observer.seen[-1] == "done"
    assert sorted(observer.seen[1:-1]) == ["failed:item-1", "ok:item-0"]


def test_a_plain_two_argument_on_event_is_refused_with_the_reason() -> None:
    # async def methods are accepted since issue 34 (tests/observe/test_observers_async.py).
    with pytest.raises(TypeError, match=r"one event record, on_event\(self, event\)"):
        class _TwoArgs(BaseObserver):
            def on_event(self, event: Any, data: Any) -> None:  # type: ignore[override]
                pass


class _Anchorish(BaseMiddleware):
    async def before_process(self, work_item: LLMWorkItem[Any]) -> LLMWorkItem[Any] | None:
        await anyio.lowlevel.checkpoint()
        return None if work_item.prompt == "skip" else work_item

    async def after_process(self, result: WorkItemResult[Any]) -> WorkItemResult[Any]:
        await anyio.lowlevel.checkpoint()
        result.output = f"[{result.output}]"
        return result

    async def on_error(self, work_item: LLMWorkItem[Any], error: Exception) -> WorkItemResult[Any] | None:
        await anyio.lowlevel.checkpoint()
        return WorkItemResult(work_item.item_id, True, f"recovered from {error}")


async def test_base_middleware_skips_rewrites_and_recovers() -> None:
    fake = FakeStrategy(script={"bad": [ProviderError("nope", category=ErrorCategory.INVALID_REQUEST)]})
    batch = await process_prompts(fake, ["ok", "skip", "bad"], config=FAST, middlewares=[_Anchorish()])
    by_id = batch.by_id()
    assert by_id["item-0"].output == "[echo: ok]"
    skipped = by_id["item-1"]
    assert (skipped.success, skipped.error_category) == (False, ErrorCategory.INVALID_REQUEST)
    assert "_Anchorish.before_process returned None" in (skipped.error or "")
    assert by_id["item-2"].output == "recovered from nope"
    assert sorted(prompt for prompt, _ in fake.calls) == ["bad", "ok"]  # the skipped item called nobody


class _Tagging(BaseMiddleware):
    def __init__(self, tag: str, log: list[str]) -> None:
        self.tag, self.log = tag, log

    def before_process(self, work_item: LLMWorkItem[Any]) -> LLMWorkItem[Any]:  # sync works too
        self.log.append(f"before {self.tag}")
        return work_item

    async def after_process(self, result: WorkItemResult[Any]) -> WorkItemResult[Any]:
        await anyio.lowlevel.checkpoint()
        self.log.append(f"after {self.tag}")
        result.output = f"{self.tag}({result.output})"
        return result


async def test_middlewares_wrap_like_an_onion() -> None:
    log: list[str] = []
    chain = [_Tagging("outer", log), _Tagging("inner", log)]
    batch = await process_prompts(FakeStrategy(), ["x"], config=FAST, middlewares=chain)
    assert log == ["before outer", "before inner", "after inner", "after outer"]
    assert batch.results[0].output == "outer(inner(echo: x))"


async def test_an_observer_that_raises_never_breaks_the_run() -> None:
    class Broken(BaseObserver):
        def on_item_completed(self, event: ItemCompleted) -> None:
            raise RuntimeError("observer bug")

    counting = _Counting()
    batch = await process_prompts(FakeStrategy(), ["a", "b"], config=FAST, observers=[Broken(), counting])
    assert batch.succeeded == 2
    assert sorted(counting.seen[1:-1]) == ["ok:item-0", "ok:item-1"]
