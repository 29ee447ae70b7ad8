"""The public surface: everything in API.md is exported from the top level, __all__ sorted and complete."""

from __future__ import annotations

import collections.abc
import importlib
import inspect
import os
import pkgutil
import re
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

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


# --- every class a public signature names is public (issue 35, point 7) -------------------------

PUBLIC_PACKAGES = ("trio_batch_llm", "trio_batch_llm.mock", "trio_batch_llm.testing")

# Public methods that are the engine's plumbing, not the user's: what they name stays private.
# Each entry says why; the reference pages do not show them (tests/project/test_reference_docs.py).
NOT_FOR_USERS = {
    # open_run() builds a Run; the reference says "do not construct one" and shows no constructor.
    "Run.__init__",
    # The processors that share a host run their tasks and admit their calls through these.
    "ExecutorHost.runtime", "ExecutorHost.new_runtime_group",
    "ExecutorHost.quota_scope", "ExecutorHost.adopt_quota_scope",
    # The mock's provider-batch modules answer each batch line through it; a test talks HTTP.
    "MockOpenAIApp.execute_route",
}


def _universe() -> dict[str, Any]:
    """Every name some module of the package binds: what its ``TYPE_CHECKING`` imports would see."""
    for info in pkgutil.walk_packages(trio_batch_llm.__path__, "trio_batch_llm."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    names: dict[str, Any] = {}
    for source in (typing, collections.abc, os):
        names.update({k: v for k, v in vars(source).items() if not k.startswith("_")})
    names["os"] = os
    for module_name, module in sorted(sys.modules.items()):
        if module_name.startswith("trio_batch_llm"):
            for key, value in vars(module).items():
                names.setdefault(key, value)
    return names


def _hints(obj: Any, universe: dict[str, Any]) -> dict[str, Any]:
    """``typing.get_type_hints`` of ``obj``, lending it the names its module imports only for mypy."""
    borrowed: dict[str, Any] = {}
    while True:
        try:
            return typing.get_type_hints(obj, localns=borrowed)
        except NameError as exc:
            if exc.name is None or exc.name not in universe or exc.name in borrowed:
                raise
            borrowed[exc.name] = universe[exc.name]


def _classes_in(annotation: Any) -> Iterator[type]:
    if isinstance(annotation, type):
        yield annotation
    origin = typing.get_origin(annotation)
    if isinstance(origin, type):
        yield origin
    for arg in typing.get_args(annotation):
        for inner in arg if isinstance(arg, (list, tuple)) else (arg,):
            yield from _classes_in(inner)


def _typed_members(name: str, obj: Any) -> Iterator[tuple[str, Any]]:
    """(where, object) for a public name and, for a class, its public methods, properties and fields."""
    yield name, obj
    if not inspect.isclass(obj):
        return
    for attr_name, attr in inspect.getmembers(obj):
        if attr_name.startswith("_") and attr_name != "__init__":
            continue
        attr = attr.fget if isinstance(attr, property) else attr
        if inspect.isfunction(attr) or inspect.ismethod(attr):
            yield f"{name}.{attr_name}", attr


def _private_module(module: str) -> bool:
    return module.startswith("trio_batch_llm") and any(p.startswith("_") for p in module.split(".")[1:])


def test_public_signatures_name_only_public_classes() -> None:
    """Every class named by a public function's, method's or field's annotation can be imported."""
    universe = _universe()
    exported: set[int] = set()
    public: list[tuple[str, Any]] = []
    for package in PUBLIC_PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            exported.add(id(getattr(module, name)))
            public.append((name, getattr(module, name)))
    unexported: dict[str, set[str]] = {}
    for name, obj in public:
        if not (inspect.isclass(obj) or callable(obj)):
            continue
        for where, target in _typed_members(name, obj):
            if where in NOT_FOR_USERS:
                continue
            for field, annotation in _hints(target, universe).items():
                if field.startswith("_"):
                    continue  # a private attribute's annotation
                for cls in _classes_in(annotation):
                    if _private_module(cls.__module__) and id(cls) not in exported:
                        unexported.setdefault(f"{cls.__module__}.{cls.__qualname__}", set()).add(
                            f"{where} ({field})")
    assert not unexported, "private classes in public signatures:\n" + "\n".join(
        f"{name}: {', '.join(sorted(where)[:3])}" for name, where in sorted(unexported.items()))


@pytest.mark.anyio
async def test_an_attempt_timeout_reaches_the_result_as_a_public_batch_llm_error(anyio_backend: Any) -> None:
    """What an item's result carries is importable and in the BatchLLMError tree (a TimeoutError still)."""
    async def hang(prompt: str) -> str:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    config = trio_batch_llm.ProcessorConfig(
        attempt_timeout=0.01, retry=trio_batch_llm.RetryConfig(max_attempts=1))
    (result,) = (await trio_batch_llm.process_prompts(trio_batch_llm.CallableStrategy(hang), ["p"],
                                                      config=config)).results
    assert result.error_category is trio_batch_llm.ErrorCategory.TIMEOUT
    assert type(result.exception) is trio_batch_llm.AttemptTimedOut
    assert isinstance(result.exception, trio_batch_llm.BatchLLMError)
    assert isinstance(result.exception, TimeoutError)  # what code catching timeouts relies on
    assert type(result.exception).__module__ == "trio_batch_llm"
