"""The exception tree: one base catches everything, built-in bases kept, ErrorCategory semantics."""

from __future__ import annotations

import pytest

import trio_batch_llm as tbl
from trio_batch_llm import (
    BatchLLMError,
    ConfigurationError,
    ErrorCategory,
    ItemDeadlineExceeded,
    LLMCallError,
    ProviderError,
)


def _exported_exception_classes() -> list[type[BaseException]]:
    return [
        value for name in tbl.__all__
        if isinstance(value := getattr(tbl, name), type) and issubclass(value, BaseException)
    ]


def test_every_exported_exception_is_a_batch_llm_error() -> None:
    classes = _exported_exception_classes()
    assert len(classes) >= 12
    for cls in classes:
        assert issubclass(cls, BatchLLMError), cls


@pytest.mark.parametrize("cls", _exported_exception_classes(), ids=lambda c: c.__name__)
def test_except_batch_llm_error_catches_each(cls: type[BaseException]) -> None:
    if cls is ConfigurationError:
        instance: BaseException = cls("field", 1, "bad")
    elif cls is ProviderError:
        instance = cls("x", category=ErrorCategory.SERVER)
    else:
        instance = cls("x")
    with pytest.raises(BatchLLMError) as info:
        raise instance
    assert info.value is instance


def test_builtin_bases() -> None:
    assert issubclass(ConfigurationError, ValueError)
    assert issubclass(ItemDeadlineExceeded, TimeoutError)
    for cls in (tbl.LLMCallError, tbl.BatchInterruptedError, tbl.CleanupInterruptedError,
                tbl.StreamFinalizationError, tbl.QueueFullError, tbl.AdmissionClosedError,
                tbl.ArtifactStoreError):
        assert issubclass(cls, RuntimeError), cls
    assert issubclass(tbl.ArtifactMismatchError, tbl.ArtifactStoreError)
    assert tbl.AsyncBatchLLMError is BatchLLMError


def test_configuration_error_names_field_and_value() -> None:
    err = ConfigurationError("max_attempts", 0, "must be >= 1")
    assert str(err) == "max_attempts=0: must be >= 1"
    assert (err.field, err.value) == ("max_attempts", 0)


def test_provider_error_fields() -> None:
    err = ProviderError("slow down", category="rate_limit", retry_after=2.5,  # type: ignore[arg-type]
                        status_code=429)
    assert err.category is ErrorCategory.RATE_LIMIT
    assert (err.retry_after, err.status_code) == (2.5, 429)


def test_llm_call_error_carries_result() -> None:
    result = tbl.WorkItemResult(item_id="a", success=False, error="boom")
    assert LLMCallError("failed", result=result).result is result


@pytest.mark.parametrize(
    ("category", "retryable"),
    [
        (ErrorCategory.RATE_LIMIT, True), (ErrorCategory.TIMEOUT, True), (ErrorCategory.SERVER, True),
        (ErrorCategory.TRANSIENT, True), (ErrorCategory.AUTHENTICATION, False),
        (ErrorCategory.INVALID_REQUEST, False), (ErrorCategory.CONTEXT_LENGTH, False),
        (ErrorCategory.CONTENT_POLICY, False), (ErrorCategory.INSUFFICIENT_BALANCE, False),
        (ErrorCategory.DEADLINE, False), (ErrorCategory.NOT_EXECUTED, False),
    ],
)
def test_category_retryable(category: ErrorCategory, retryable: bool) -> None:
    assert category.retryable is retryable
