"""Issue 35, point 10: messages worded for the person who reads them.

The batch deadline's headline, the structured-output mismatch, the log level of a
failure that ``call_result()`` hands back to its caller, and the demo's summary
saying what ``admission`` and ``replayed`` are.
"""

from __future__ import annotations

import logging

import anyio
import anyio.lowlevel
import pydantic
import pytest

import trio_batch_llm._engine._entrypoints as entrypoints
from trio_batch_llm import (
    BatchTermination,
    CallableStrategy,
    ErrorCategory,
    GuardrailConfig,
    LLMCallError,
    LLMCallPool,
    ProcessorConfig,
    ProviderError,
    call,
    call_result,
    process_prompts,
)
from trio_batch_llm._cli._summary import RunSummary
from trio_batch_llm._values._structured import ResponseModel, StructuredOutputError

from ..conftest import trio_virtual_clock
from .test_cli import ENV, command

pytestmark = pytest.mark.anyio

virtual = pytest.mark.parametrize("anyio_backend", [pytest.param(trio_virtual_clock(), id="trio-virtual")])


# --- the batch deadline, said for a human ---------------------------------------------------------


@virtual
async def test_a_batch_deadline_reads_as_a_sentence_in_every_summary() -> None:
    async def hang(prompt: str) -> str:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    cfg = ProcessorConfig(concurrency=2, guardrails=GuardrailConfig(batch_timeout=30.0))
    batch = await process_prompts(CallableStrategy(hang), [f"p{i}" for i in range(4)], config=cfg)
    assert batch.termination.kind == "batch_deadline"  # the machine's name stays the same
    assert batch.termination.reason == "batch deadline (30.0 s) reached"
    headline = "Batch stopped: batch deadline (30.0 s) reached"
    assert batch.summary().splitlines()[0] == headline
    assert RunSummary(4).text(batch.termination, 30.0).splitlines()[0] == headline
    errors = sorted({r.error for r in batch.results})
    assert errors == ["ItemDeadlineExceeded: item 'item-0': cut short: batch deadline (30.0 s) reached",
                      "ItemDeadlineExceeded: item 'item-1': cut short: batch deadline (30.0 s) reached",
                      "not executed: batch deadline (30.0 s) reached"]


@pytest.mark.parametrize(
    ("termination", "headline"),
    [
        (BatchTermination(), "Batch completed"),
        (BatchTermination("interrupted", "interrupted by SIGINT"),
         "Batch interrupted (interrupted by SIGINT)"),
        (BatchTermination("aborted", "server failure of item 'q3'", "q3"),
         "Batch aborted (server failure of item 'q3')"),
        (BatchTermination("budget_exhausted", "max_total_tokens=100 reached"),
         "Batch stopped: budget spent (max_total_tokens=100 reached)"),
        (BatchTermination("provider_retired", "provider retired: connection refused"),
         "Batch stopped: provider retired: connection refused"),
        (BatchTermination("batch_deadline", None), "Batch stopped: batch deadline reached"),
    ],
)
def test_every_termination_has_a_headline_without_internal_names(
    termination: BatchTermination, headline: str
) -> None:
    assert RunSummary(1).text(termination, 1.0).splitlines()[0] == headline
    assert "_" not in headline.split(":")[0]  # no batch_deadline / budget_exhausted / provider_retired


# --- structured output: no doubled words ----------------------------------------------------------


def test_a_schema_without_a_title_is_not_called_the_response_model_response() -> None:
    model = ResponseModel({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    with pytest.raises(StructuredOutputError) as not_json:
        model.parse("not json")
    assert str(not_json.value).startswith(
        "the answer is not JSON, as the response schema asks: Expecting value")
    with pytest.raises(StructuredOutputError) as mismatch:
        model.parse('{"a": "x"}')
    assert str(mismatch.value).startswith("the answer does not match the response schema: ")
    assert "response response" not in str(mismatch.value)


class Verdict(pydantic.BaseModel):
    score: int


def test_a_titled_schema_and_a_pydantic_model_are_named() -> None:
    titled = ResponseModel({"title": "Review", "type": "object", "properties": {"a": {"type": "integer"}},
                            "required": ["a"]})
    with pytest.raises(StructuredOutputError, match=r"^the answer does not match the response schema "
                                                    r"'Review': "):
        titled.parse('{"a": "x"}')
    with pytest.raises(StructuredOutputError,
                       match=r"^the answer does not match the response model Verdict: "):
        ResponseModel(Verdict).parse('{"score": "high"}')


# --- call_result(): the caller has the failure, so it is not a WARNING ------------------------------


async def _refused(prompt: str) -> str:
    await anyio.lowlevel.checkpoint()
    raise ProviderError("nope", category=ErrorCategory.CONTENT_POLICY)


def _engine_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "trio_batch_llm.engine" and r.levelno == level
            and "failed after" in r.getMessage()]


class _Unshared:
    def shared(self, strategy: object, config: object) -> None:
        return None  # as for a strategy that cannot be weakly referenced: the pool's own failure log


@pytest.mark.parametrize("shared", [True, False], ids=["shared-limits", "unshared"])
async def test_call_result_logs_a_failure_its_caller_holds_at_debug(
    anyio_backend: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, shared: bool
) -> None:
    caplog.set_level(logging.DEBUG, logger="trio_batch_llm")
    strategy = CallableStrategy(_refused)
    if not shared:
        monkeypatch.setattr(entrypoints, "call_limits", _Unshared)
    result = await call_result(strategy, "p")
    assert (result.success, result.error_category) == (False, ErrorCategory.CONTENT_POLICY)
    with pytest.raises(LLMCallError):
        await call(strategy, "q")
    assert _engine_records(caplog, logging.WARNING) == []
    debug = _engine_records(caplog, logging.DEBUG)
    assert [r.category for r in debug] == ["content_policy", "content_policy"]  # type: ignore[attr-defined]
    assert all("logged at DEBUG" not in r.getMessage() for r in debug)


async def test_a_pool_and_a_batch_keep_their_warning(
    anyio_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="trio_batch_llm")
    async with LLMCallPool(CallableStrategy(_refused)) as pool:
        await pool.submit_result("p")
    await process_prompts(CallableStrategy(_refused), ["a", "b"])
    warned = _engine_records(caplog, logging.WARNING)
    assert [r.category for r in warned] == ["content_policy", "content_policy"]  # type: ignore[attr-defined]


# --- the demo says what its words mean -------------------------------------------------------------


async def test_the_demo_summary_explains_admission_and_replayed(anyio_backend: str) -> None:
    done = await anyio.run_process(command("demo", "--items", "12", "--concurrency", "4", "--backend",
                                           anyio_backend, "--no-progress"), check=False, env=ENV)
    output = done.stdout.decode()
    assert done.returncode == 0, output + done.stderr.decode()
    lines = output.splitlines()
    explained = {line.split()[0]: line for line in lines if line.startswith("  ") and " = " in line}
    assert explained["admission"] == (
        "  admission = how long an item waited for its turn (a free slot, the rate limits) before its call")
    assert explained["execution"] == "  execution = how long its calls took, every attempt added up"
    assert explained["replayed"] == (
        "  replayed  = results read back from an earlier run's checkpoint instead of called again "
        "(none in the demo)")
    assert lines.index("What the summary's words mean:") > next(i for i, line in enumerate(lines)
                                                          if line.startswith("  execution "))
