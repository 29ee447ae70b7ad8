"""Issue 21: the optional OpenTelemetry and Prometheus adapters, and labelled MetricsObserver text.

Batches run on both backends through ``process_prompts`` with a scripted fake;
the OpenTelemetry SDK's in-memory exporter collects the spans, and a fresh
``prometheus_client`` registry is scraped as Prometheus would.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from trio_batch_llm import (
    ConfigurationError,
    ErrorCategory,
    FakeStrategy,
    GuardrailConfig,
    MetricsObserver,
    OpenTelemetryObserver,
    ProcessorConfig,
    PrometheusCollector,
    ProviderError,
    RetryConfig,
    process_prompts,
)
from trio_batch_llm._observe._events import (
    AttemptFailed,
    AttemptStarted,
    AttemptSucceeded,
    BatchFinished,
    BatchStarted,
    ItemCompleted,
    ItemStarted,
)
from trio_batch_llm._values._results import BatchTermination, WorkItemResult
from trio_batch_llm._values._stats import CounterSnapshot

pytestmark = pytest.mark.anyio

CONFIG = ProcessorConfig(concurrency=2, retry=RetryConfig(max_attempts=3, initial_wait=0.001, max_wait=0.002))
SCRIPT = {
    "retried": [ProviderError("502", category=ErrorCategory.SERVER), "fine"],
    "refused": [ProviderError("no", category=ErrorCategory.CONTENT_POLICY)],
}
PROMPTS = [("ok", "plain"), ("r", "retried"), ("x", "refused")]


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def tracer_provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


async def test_spans_per_batch_and_per_attempt_with_gen_ai_attributes(
    anyio_backend: str, exporter: InMemorySpanExporter
) -> None:
    observer = OpenTelemetryObserver(tracer_provider=tracer_provider(exporter), system="openai",
                                     model="fake-model")
    batch = await process_prompts(FakeStrategy(script=SCRIPT), PROMPTS, config=CONFIG, observers=[observer])
    assert (batch.succeeded, batch.failed) == (2, 1)
    spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.name == "trio_batch_llm.batch"]
    def key(span: Any) -> tuple[str, int]:
        return span.attributes["trio_batch_llm.item_id"], span.attributes["trio_batch_llm.attempt"]

    attempts = sorted((s for s in spans if s is not root), key=key)
    assert [key(s) for s in attempts] == [("ok", 1), ("r", 1), ("r", 2), ("x", 1)]
    for span in attempts:
        assert span.name == "chat fake-model" and span.kind is SpanKind.CLIENT
        assert span.parent is not None and span.parent.span_id == root.context.span_id
        assert span.attributes["gen_ai.system"] == "openai"
        assert span.attributes["gen_ai.request.model"] == "fake-model"
        assert span.attributes["gen_ai.operation.name"] == "chat"
        assert span.start_time <= span.end_time
    ok, r1, r2, x = attempts
    assert ok.attributes["gen_ai.usage.input_tokens"] == 10
    assert ok.attributes["gen_ai.usage.output_tokens"] == 5
    assert "error.type" not in ok.attributes and ok.status.status_code is StatusCode.UNSET
    assert r1.attributes["error.type"] == "server" and r1.status.status_code is StatusCode.ERROR
    assert "gen_ai.usage.input_tokens" not in r1.attributes
    assert r2.start_time >= r1.end_time and "error.type" not in r2.attributes
    assert x.attributes["error.type"] == "content_policy" and x.status.status_code is StatusCode.ERROR
    assert root.kind is SpanKind.INTERNAL and root.parent is None
    assert dict(root.attributes) == {
        "trio_batch_llm.batch.total": 3, "trio_batch_llm.batch.succeeded": 2,
        "trio_batch_llm.batch.failed": 1, "trio_batch_llm.batch.not_run": 0,
        "trio_batch_llm.batch.replayed": 0, "trio_batch_llm.batch.termination": "completed"}
    assert root.start_time <= min(s.start_time for s in attempts)
    assert root.end_time >= max(s.end_time for s in attempts)


async def test_a_stopped_batch_counts_items_not_run_and_is_an_error(
    anyio_backend: str, exporter: InMemorySpanExporter
) -> None:
    observer = OpenTelemetryObserver(tracer_provider=tracer_provider(exporter))
    config = ProcessorConfig(concurrency=1, guardrails=GuardrailConfig(
        abort_on_error_categories=frozenset({ErrorCategory.CONTENT_POLICY})))
    prompts = [("x", "refused"), *((f"p{i}", f"plain {i}") for i in range(5))]
    batch = await process_prompts(FakeStrategy(script=SCRIPT), prompts, config=config, observers=[observer])
    assert batch.termination.kind == "aborted"
    spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.name == "trio_batch_llm.batch"]
    assert root.attributes["trio_batch_llm.batch.termination"] == "aborted"
    assert root.status.status_code is StatusCode.ERROR
    assert root.attributes["trio_batch_llm.batch.not_run"] == 5
    assert [s.name for s in spans if s is not root] == ["chat"]  # no model given: a bare name


def test_attempt_events_give_exact_spans_with_the_calls_own_model_and_usage(
    exporter: InMemorySpanExporter,
) -> None:
    ticks = iter(range(1_000, 100_000, 1_000))
    observer = OpenTelemetryObserver(tracer_provider=tracer_provider(exporter), system="openai",
                                     model="default-model", clock=lambda: next(ticks))
    result = WorkItemResult(item_id="a", success=True, output="x", attempts=2,
                            token_usage={"input_tokens": 30, "output_tokens": 9, "total_tokens": 39})
    counts = CounterSnapshot(accepted=1, finished=1, succeeded=1, failed=0, replayed=0, input_tokens=30,
                             output_tokens=9, total_tokens=39, cost=0.0)
    for event in [
        BatchStarted(total=1),                                               # 1000
        ItemStarted("a"),                                                    # 2000
        AttemptStarted("a", 1, provider="openai", model="small"),            # 3000
        AttemptFailed("a", 1, ErrorCategory.TIMEOUT),                        # 4000
        AttemptStarted("a", 2, provider="azure", model="large"),             # 5000 (after the backoff)
        AttemptSucceeded("a", 2, {"input_tokens": 20, "output_tokens": 9}),  # 6000
        ItemCompleted(result),                                               # 7000
        BatchFinished(BatchTermination(), counts),                           # 8000
    ]:
        observer.on_event(event)
    first, second, root = exporter.get_finished_spans()
    assert (first.name, first.start_time, first.end_time) == ("chat small", 3_000, 4_000)
    assert first.attributes["error.type"] == "timeout"
    assert (second.name, second.start_time, second.end_time) == ("chat large", 5_000, 7_000)
    assert second.attributes["gen_ai.system"] == "azure"
    assert second.attributes["gen_ai.usage.input_tokens"] == 20
    assert second.attributes["gen_ai.usage.output_tokens"] == 9
    assert (root.start_time, root.end_time) == (1_000, 8_000)


def test_the_package_imports_without_the_optional_libraries() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('opentelemetry', 'prometheus_client'):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import trio_batch_llm\n"
        "for make in (trio_batch_llm.OpenTelemetryObserver, trio_batch_llm.PrometheusCollector):\n"
        "    try:\n"
        "        make()\n"
        "    except ImportError as exc:\n"
        "        print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [
        'OpenTelemetryObserver needs opentelemetry-api: pip install "trio-batch-llm[otel]"',
        'PrometheusCollector needs prometheus_client: pip install "trio-batch-llm[prometheus]"',
    ]


# --- Prometheus -----------------------------------------------------------------------------------


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the registry's text exposition, parsed back as Prometheus reads it."""
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


async def test_prometheus_collector_scrape_with_model_category_and_scope_labels(anyio_backend: str) -> None:
    registry = CollectorRegistry()
    collector = PrometheusCollector(registry=registry)
    fast = collector.observer(model="fake-model", scope="fake")
    assert collector.observer(model="fake-model", scope="fake") is fast  # one series per label set
    other = collector.observer(model="other", scope="fake")
    await process_prompts(FakeStrategy(script=SCRIPT), PROMPTS, config=CONFIG, observers=[fast])
    await process_prompts(FakeStrategy(script=SCRIPT), PROMPTS, config=CONFIG, observers=[fast])
    await process_prompts(FakeStrategy(), ["one"], config=CONFIG, observers=[other])
    samples = scrape(registry)
    labels = {"model": "fake-model", "scope": "fake"}
    assert sample(samples, "trio_batch_llm_items_total", outcome="succeeded", **labels) == 4
    assert sample(samples, "trio_batch_llm_items_total", outcome="failed", **labels) == 2
    assert sample(samples, "trio_batch_llm_items_failed_total", category="content_policy", **labels) == 2
    assert sample(samples, "trio_batch_llm_attempt_failures_total", category="server", **labels) == 2
    assert sample(samples, "trio_batch_llm_retries_total", category="server", **labels) == 2
    assert sample(samples, "trio_batch_llm_attempts_total", **labels) == 8
    assert sample(samples, "trio_batch_llm_tokens_total", kind="input", **labels) == 40  # 2 × (10 + 10)
    assert sample(samples, "trio_batch_llm_items_in_flight", **labels) == 0
    assert sample(samples, "trio_batch_llm_batches_finished_total", termination="completed", **labels) == 2
    assert sample(samples, "trio_batch_llm_execution_seconds_count", **labels) == 6
    assert sample(samples, "trio_batch_llm_execution_seconds_bucket", le="+Inf", **labels) == 6
    other_labels = {"model": "other", "scope": "fake"}
    assert sample(samples, "trio_batch_llm_items_total", outcome="succeeded", **other_labels) == 1


def test_prometheus_collector_checks_its_labels() -> None:
    collector = PrometheusCollector(label_names=("model",))
    assert collector.observer().labels == {"model": ""}
    with pytest.raises(TypeError, match="unknown label"):
        collector.observer(scope="x")
    with pytest.raises(ConfigurationError, match="category"):
        PrometheusCollector(label_names=("category",))
    registry = CollectorRegistry()
    registry.register(collector)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(PrometheusCollector())  # describe() names its families


def test_metrics_observer_text_carries_its_labels() -> None:
    metrics = MetricsObserver(labels={"model": 'gpt-"4"', "scope": "openai"})
    metrics.on_event(BatchStarted(total=None))
    text = metrics.to_prometheus()
    assert 'trio_batch_llm_batches_started_total{model="gpt-\\"4\\"",scope="openai"} 1' in text
    assert 'trio_batch_llm_execution_seconds_bucket{model="gpt-\\"4\\"",scope="openai",le="+Inf"} 0' in text
    families = {f.name: f for f in text_string_to_metric_families(text)}  # the official parser reads it
    started = families["trio_batch_llm_batches_started"].samples[0]
    assert started.labels == {"model": 'gpt-"4"', "scope": "openai"}
    assert metrics.to_dict()["labels"] == {"model": 'gpt-"4"', "scope": "openai"}
    with pytest.raises(ConfigurationError, match="label names"):
        MetricsObserver(labels={"bad-name": "x"})
