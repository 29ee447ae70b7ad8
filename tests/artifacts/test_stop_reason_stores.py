"""``stop_reason`` and the termination's ``item_id`` survive every store and export (issue 32, point 5).

An aborted batch (concurrency 1, so the failing item runs first and the rest stay
queued) goes through the JSONL and SQLite artifact stores, ``trio-batch-llm export``
(CSV and JSONL), ``BatchResult.to_json`` and OpenTelemetry; a durable run with an
item deadline and one with an abort go through the SQLite and PostgreSQL run
repositories, ``Run.read_results``, ``iter_run_results`` and ``Run.export_jsonl``.
Records of items that ran to their end keep their old shape (no ``stop_reason`` key).
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from trio_batch_llm import (
    AbortMode,
    BatchResult,
    ErrorCategory,
    GuardrailConfig,
    OpenTelemetryObserver,
    ProcessorConfig,
    RetryConfig,
    StopReason,
    WorkItemResult,
    open_run,
    process_prompts,
)
from trio_batch_llm._runs import iter_run_results
from trio_batch_llm._runs._segment import Segment

from .._runs_child import IDENTITY
from .._servers.postgres import postgres_server, postgres_url  # noqa: F401
from ..cli.test_operator import run_cli
from ..conftest import trio_virtual_clock
from ..e2e.test_surfaces_stop_reason import AUTH, Scripted
from .test_reliability_stores import Stores, stores  # noqa: F401

pytestmark = pytest.mark.anyio

ABORTING = ProcessorConfig(
    concurrency=1,
    guardrails=GuardrailConfig(abort_on_error_categories=frozenset({AUTH}),
                               abort_mode=AbortMode.DRAIN_ACTIVE),
    retry=RetryConfig(max_attempts=1),
)
PROMPTS = ["fatal-0", "ok-1", "ok-2"]
WANT = {"fatal-0": None, "ok-1": StopReason.ABORT_CATEGORY, "ok-2": StopReason.ABORT_CATEGORY}


def _entries(prompts: list[str]) -> list[dict[str, str]]:
    return [{"id": p, "prompt": p} for p in prompts]


@pytest.fixture(scope="module", params=[pytest.param("asyncio", id="asyncio"),
                                        pytest.param(trio_virtual_clock(threads=True), id="trio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


async def _aborted(store: Any = None, observers: Any = None) -> BatchResult[Any]:
    batch = await process_prompts(Scripted(), _entries(PROMPTS), config=ABORTING, artifact_store=store,
                                  observers=observers)
    assert (batch.termination.kind, batch.termination.item_id) == ("aborted", "fatal-0")
    assert {r.item_id: r.stop_reason for r in batch.results} == WANT
    return batch


# --- artifact stores and the export ----------------------------------------------------------


async def test_the_stores_keep_the_stop_reason_and_old_records_keep_their_shape(
    stores: Stores, capsys: pytest.CaptureFixture[str], tmp_path: Path  # noqa: F811
) -> None:
    await _aborted(stores())
    history = await stores.history()
    assert {r.item_id: r.stop_reason for r in history} == WANT
    assert {r.item_id: r.error_category for r in history}["ok-1"] is ErrorCategory.NOT_EXECUTED
    assert [("stop_reason" in r.to_dict()) for r in history] == [False, True, True]
    if stores.kind == "jsonl":  # on disk: only the stopped records have the key
        lines = stores.path.read_text().splitlines()[1:]  # after the header
        assert ['"stop_reason": "abort_category"' in line.replace('":"', '": "') for line in lines] == [
            False, True, True]
        assert "stop_reason" not in lines[0]

    table = tmp_path / "table.csv"
    code, _, err = run_cli(capsys, "export", str(stores.path), str(table))
    assert code == 0, err
    with table.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["id"], r["error_category"], r["stop_reason"]) for r in rows] == [
        ("fatal-0", "authentication", ""), ("ok-1", "not_executed", "abort_category"),
        ("ok-2", "not_executed", "abort_category")]

    lines = tmp_path / "table.jsonl"
    code, _, err = run_cli(capsys, "export", str(stores.path), str(lines))
    assert code == 0, err
    exported = [json.loads(line) for line in lines.read_text().splitlines()]
    assert [r["stop_reason"] for r in exported] == [None, "abort_category", "abort_category"]


async def test_batch_json_keeps_the_stop_reasons_and_the_item_that_stopped_it(anyio_backend: Any) -> None:
    batch = await _aborted()
    again = BatchResult.from_json(batch.to_json())
    assert again.termination == batch.termination and again.termination.item_id == "fatal-0"
    assert {r.item_id: r.stop_reason for r in again.results} == WANT
    assert "  stopped     abort_category 2" in batch.summary().splitlines()


async def test_otel_and_the_stop_log_say_why_and_which_item(
    anyio_backend: Any, caplog: pytest.LogCaptureFixture
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with caplog.at_level(logging.INFO, logger="trio_batch_llm.engine"):
        await _aborted(observers=[OpenTelemetryObserver(tracer_provider=provider)])
    (root,) = [s for s in exporter.get_finished_spans() if s.name == "trio_batch_llm.batch"]
    assert root.attributes is not None
    assert root.attributes["trio_batch_llm.batch.stop_item_id"] == "fatal-0"
    (stop,) = [r for r in caplog.records if r.getMessage().startswith("batch stopping")]
    assert (stop.stop_reason, stop.item_id) == ("abort_category", "fatal-0")  # type: ignore[attr-defined]


async def test_a_cut_short_attempt_span_carries_the_stop_reason(anyio_backend: Any) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    config = ProcessorConfig(concurrency=2, guardrails=GuardrailConfig(total_timeout_per_item=0.2))
    await process_prompts(Scripted(), _entries(["hang-0", "ok-1"]), config=config,
                          observers=[OpenTelemetryObserver(tracer_provider=provider)])
    attempts = {s.attributes["trio_batch_llm.item_id"]: s for s in exporter.get_finished_spans()
                if s.attributes and "trio_batch_llm.item_id" in s.attributes}
    assert attempts["hang-0"].attributes["trio_batch_llm.stop_reason"] == "item_deadline"  # type: ignore[index]
    assert "trio_batch_llm.stop_reason" not in attempts["ok-1"].attributes  # type: ignore[operator]


# --- durable runs: SQLite and PostgreSQL -------------------------------------------------------


async def _durable_item_deadline(store: str, deadline: float, tmp_path: Path) -> None:
    config = ProcessorConfig(concurrency=3, guardrails=GuardrailConfig(total_timeout_per_item=deadline),
                             retry=RetryConfig(max_attempts=1))
    prompts = ["ok-0", "hang-1", "fatal-2", "ok-3"]
    async with await open_run(store, "run", Scripted(), prompts, config=config, identity=IDENTITY) as run:
        snap = await run.wait()
        assert (snap.status, snap.done) == ("completed", 4)
        by_prompt = {r.result.item_id: r.result for r in await run.read_results()}
        out = tmp_path / "run.jsonl"
        await run.export_jsonl(out)
    reasons = sorted((r.error_category.value if r.error_category else "ok", r.stop_reason)
                     for r in by_prompt.values())
    assert reasons == [("authentication", None), ("deadline", StopReason.ITEM_DEADLINE),
                       ("ok", None), ("ok", None)]
    offline = await anyio.to_thread.run_sync(lambda: list(iter_run_results(store, "run")))
    assert sorted(str(r.result.stop_reason) for r in offline) == sorted(str(r.stop_reason)
                                                                        for r in by_prompt.values())
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(str(r["result"].get("stop_reason")) for r in exported) == ["None", "None", "None",
                                                                             "item_deadline"]


async def _durable_abort(store: str) -> None:
    config = ProcessorConfig(
        concurrency=1, retry=RetryConfig(max_attempts=1),
        guardrails=GuardrailConfig(abort_on_error_categories=frozenset({AUTH})))
    async with await open_run(store, "aborted", Scripted(), ["fatal-0", "ok-1", "ok-2"], config=config,
                              identity=IDENTITY) as run:
        snap = await run.wait()
    assert snap.termination is not None
    assert (snap.termination.kind, snap.termination.item_id) == ("aborted", "item-0")  # the run names them
    assert "item_id" in snap.termination.to_dict()


async def test_a_durable_run_keeps_stop_reasons_on_sqlite(anyio_backend: Any, tmp_path: Path) -> None:
    deadline = 1.0 if anyio_backend != "asyncio" else 0.2
    await _durable_item_deadline(str(tmp_path / "runs.sqlite"), deadline, tmp_path)
    await _durable_abort(str(tmp_path / "runs.sqlite"))


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_durable_run_keeps_stop_reasons_on_postgresql(
    anyio_backend: Any, postgres_url: str, tmp_path: Path  # noqa: F811
) -> None:
    await _durable_item_deadline(postgres_url, 0.2, tmp_path)
    await _durable_abort(postgres_url)


async def test_a_pause_tells_the_processor_pause_and_a_cancel_shutdown(anyio_backend: Any) -> None:
    class Proc:
        def __init__(self) -> None:
            self.calls: list[tuple[str, StopReason]] = []

        def request_stop(self, reason: str, *, stop_reason: StopReason) -> None:
            self.calls.append((reason, stop_reason))

    for kind, want in (("paused", StopReason.PAUSE), ("cancelled", StopReason.SHUTDOWN)):
        proc = Proc()
        seg = Segment()
        seg.bind(proc, anyio.CancelScope())  # type: ignore[arg-type]
        seg.request(kind, f"{kind} by the operator")  # type: ignore[arg-type]
        assert proc.calls == [(f"{kind} by the operator", want)]


def test_an_old_record_reads_without_a_stop_reason() -> None:
    old = {"item_id": "a", "success": False, "output": None, "error": "not executed: x",
           "error_category": "not_executed", "attempts": 0, "token_usage": {}, "timing": {},
           "context": None, "metadata": {}}
    result = WorkItemResult.from_dict(old)
    assert result.stop_reason is None
    assert result.to_dict() == {**old, "timing": result.timing.to_dict()}
