"""Issue 31 point 13: a bug in strategy code is a non-retryable ``LOGIC_ERROR``, not a paid retry.

A ``ValueError``, ``TypeError``, ``KeyError``, ``AttributeError`` or ``NameError`` that reaches the
classifier with nothing more specific to say about it fails its item at once; the result keeps
the exception; an ``error_classifier`` may still say otherwise. Exceptions of those types that
libraries raise about *data* (a body that is not JSON, an answer that fails validation, bytes that
do not decode) keep their own category and retry rules.
"""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest

from trio_batch_llm import (
    CallableStrategy,
    ErrorCategory,
    LLMCallStrategy,
    ProcessorConfig,
    ProviderError,
    RetryConfig,
    process_prompts,
)
from trio_batch_llm._engine._classify import classify
from trio_batch_llm._values._results import RetryState, TokenUsage

pytestmark = pytest.mark.anyio

CONFIG = ProcessorConfig(retry=RetryConfig(max_attempts=3, initial_wait=0.0, max_wait=0.0))


def _bug(kind: type[Exception]) -> Exception:
    if kind is KeyError:
        return KeyError("choices")
    if kind is AttributeError:
        return AttributeError("'NoneType' object has no attribute 'text'")
    if kind is NameError:
        return NameError("name 'respone' is not defined")
    return kind("bad argument")


BUGS = [ValueError, TypeError, KeyError, AttributeError, NameError]


def _raising(exc: Exception, calls: list[int]) -> CallableStrategy[str]:
    async def fn(prompt: str) -> str:
        calls.append(1)
        raise exc

    return CallableStrategy(fn)


@pytest.mark.parametrize("kind", BUGS, ids=lambda k: k.__name__)
async def test_a_bug_is_called_once_and_kept(kind: type[Exception]) -> None:
    exc, calls = _bug(kind), []
    batch = await process_prompts(_raising(exc, calls), ["p"], config=CONFIG)
    (result,) = batch.results
    assert (len(calls), result.attempts, result.success) == (1, 1, False)
    assert result.error_category == "logic_error"
    assert result.exception is exc
    assert result.error is not None and type(exc).__name__ in result.error


@pytest.mark.parametrize("kind", BUGS, ids=lambda k: k.__name__)
async def test_an_error_classifier_may_make_it_retry(kind: type[Exception]) -> None:
    exc, calls = _bug(kind), []

    def retry_mine(error: Exception) -> ErrorCategory | None:
        return ErrorCategory.TRANSIENT if error is exc else None

    batch = await process_prompts(_raising(exc, calls), ["p"], config=CONFIG, error_classifier=retry_mine)
    (result,) = batch.results
    assert (len(calls), result.attempts) == (3, 3)
    assert result.error_category is ErrorCategory.TRANSIENT
    assert result.exception is exc


class Answer(pydantic.BaseModel):
    label: str


class _ParsingStrategy(LLMCallStrategy[Answer]):
    """Answers with text that does not validate; its parse stage raises pydantic's own error."""

    def __init__(self) -> None:
        self.calls = 0

    async def execute(self, prompt: str, attempt: int, timeout: float | None,
                      state: RetryState | None = None) -> tuple[str, TokenUsage | None, Any]:
        self.calls += 1
        return '{"label": 5}', {"input_tokens": 1, "output_tokens": 1}, None

    def parse_output(self, raw: Any, metadata: dict[str, Any]) -> Answer:
        return Answer.model_validate_json(raw)  # pydantic.ValidationError is a ValueError


async def test_a_validation_error_is_still_a_parse_failure_and_retried() -> None:
    strategy = _ParsingStrategy()
    batch = await process_prompts(strategy, ["p"], config=CONFIG)
    (result,) = batch.results
    assert strategy.calls == 3 and result.attempts == 3
    assert result.error_category is ErrorCategory.PARSE
    assert isinstance(result.exception, pydantic.ValidationError)


def _validation_error() -> pydantic.ValidationError:
    try:
        Answer.model_validate({"label": 5})
    except pydantic.ValidationError as exc:
        return exc
    raise AssertionError("validated")


class RateLimitError(ValueError):
    """A wrapper's 429 that happens to derive from ValueError."""


class WithStatus(TypeError):
    status_code = 503


@pytest.mark.parametrize(("exc", "expected"), [
    pytest.param(json.JSONDecodeError("Expecting value", "<html>", 0), ErrorCategory.PARSE, id="json"),
    pytest.param(_validation_error(), ErrorCategory.PARSE, id="pydantic"),
    pytest.param(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), ErrorCategory.PARSE,
                 id="undecodable-body"),
    pytest.param(UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"),
                 ErrorCategory.INVALID_REQUEST, id="unencodable-request"),
    pytest.param(ProviderError("mine", category=ErrorCategory.SERVER), ErrorCategory.SERVER,
                 id="provider-error"),
    pytest.param(RateLimitError("slow down"), ErrorCategory.RATE_LIMIT, id="sdk-class-name"),
    pytest.param(WithStatus("x"), ErrorCategory.SERVER, id="status-code"),
    pytest.param(ValueError("429 Too Many Requests"), ErrorCategory.RATE_LIMIT, id="429-in-words"),
    pytest.param(KeyError("rate_limit"), "logic_error", id="key-named-rate-limit"),
    pytest.param(AttributeError("'RateLimitInfo' object has no attribute 'reset'"), "logic_error",
                 id="attribute-of-a-rate-limit-thing"),
    pytest.param(UnboundLocalError("x"), "logic_error", id="subclass-of-NameError"),
    pytest.param(RuntimeError("boom"), ErrorCategory.UNKNOWN, id="other-stays-unknown"),
])
def test_more_specific_rules_win(exc: Exception, expected: str) -> None:
    assert classify(exc).category == expected


def test_a_logic_error_is_not_retryable() -> None:
    category = classify(ValueError("x")).category
    assert category == "logic_error"
    assert not category.retryable and not category.engine_verdict


def test_resume_reruns_a_logic_error_whatever_the_policy() -> None:
    # The user fixes the code and resumes: replaying the bug's failure would hide the fix.
    from trio_batch_llm._artifacts._resume import replayable_failure

    assert not replayable_failure(ErrorCategory.LOGIC_ERROR)
    assert replayable_failure(ErrorCategory.INVALID_REQUEST)
