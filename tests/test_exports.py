"""The public surface: everything in API.md is exported from the top level, __all__ sorted and complete."""

from __future__ import annotations

import re
from pathlib import Path

import trio_batch_llm

# Names from shared/API.md that exist in this release. Extend as issues land.
API_NAMES = {
    "AbortMode", "AdmissionClosedError", "ArtifactIdentity", "ArtifactMismatchError",
    "ArtifactStoreError", "AsyncBatchLLMError", "BatchInterruptedError", "BatchLLMError",
    "BatchResult", "BatchTermination", "CLEANUP_FAILED", "CLEANUP_TIMED_OUT", "CallOutcome",
    "CallableStrategy", "CleanupInterruptedError", "ConfigurationError", "ErrorCategory",
    "FakeStrategy", "GuardrailConfig", "ItemDeadlineExceeded", "LLMCallError", "LLMCallStrategy",
    "LLMWorkItem", "ProcessorConfig", "ProviderError", "QueueFullError", "RateLimitConfig",
    "ResumePolicy", "RetryConfig", "RetryState", "StreamFinalizationError", "TokenUsage",
    "WorkItemResult", "with_cleanup",
    # engine, providers, stores (issues 3-7)
    "ExecutorHost", "JsonlArtifactStore", "LLMCallPool", "OpenAICompatibleStrategy", "OpenAIStrategy",
    "ParallelBatchProcessor", "SqliteArtifactStore", "call", "call_result", "llm", "process_prompts",
    "process_stream",
    # durable runs, live mode (issue 12)
    "open_run",
    # requests, structured output, response details (issue 18)
    "LLMRequest", "ResponseDetails", "StructuredOutputError", "ToolCall",
    # providers (issue 33)
    "AnthropicErrorClassifier", "AnthropicStrategy",
    # PydanticAI agents (issue 34)
    "PydanticAIStrategy",
}


def test_all_is_sorted() -> None:
    assert trio_batch_llm.__all__ == sorted(trio_batch_llm.__all__)


def test_all_names_resolve_and_are_unique() -> None:
    assert len(set(trio_batch_llm.__all__)) == len(trio_batch_llm.__all__)
    for name in trio_batch_llm.__all__:
        assert hasattr(trio_batch_llm, name), name


def test_api_names_exported() -> None:
    missing = API_NAMES - set(trio_batch_llm.__all__)
    assert not missing, f"API.md names not exported: {sorted(missing)}"


def test_all_is_complete() -> None:
    public = {
        name for name, value in vars(trio_batch_llm).items()
        if not name.startswith("_") and not isinstance(value, type(trio_batch_llm))
    }
    assert public - set(trio_batch_llm.__all__) == set()


def test_init_only_reexports() -> None:
    source = Path(trio_batch_llm.__file__).read_text(encoding="utf-8")
    body = [
        line for line in source.splitlines()
        if line.strip() and not line.startswith(("from .", '"""', "    ", "__all__", "]"))
        and not line.endswith('"""')
    ]
    # The one statement besides imports: public names report this module (trio's habit).
    assert body == ["_fixup_module_metadata(__name__, globals())", "del _fixup_module_metadata"], body
    for match in re.finditer(r"^from \.(\S+) import (\w+) as (\w+)$", source, re.M):
        if match.group(1) != "_public":
            assert match.group(2) == match.group(3)


def test_public_classes_and_functions_report_the_public_module() -> None:
    private = {
        name: value.__module__
        for name in trio_batch_llm.__all__
        if callable(value := getattr(trio_batch_llm, name)) and value.__module__ != "trio_batch_llm"
    }
    assert private == {}
    assert trio_batch_llm.ParallelBatchProcessor.add_work.__module__ == "trio_batch_llm"
