"""OpenTelemetry spans and Prometheus metrics of a batch (extras otel, prometheus)."""

import trio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest

from trio_batch_llm import (
    ErrorCategory,
    FakeStrategy,
    OpenTelemetryObserver,
    ProcessorConfig,
    PrometheusCollector,
    ProviderError,
    RetryConfig,
    process_prompts,
)

SCRIPT = {"review 1": [ProviderError("overloaded", category=ErrorCategory.SERVER)]}


async def main() -> None:
    # Tracing: a service exports spans to its collector; this one keeps them in memory.
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = OpenTelemetryObserver(
        tracer_provider=provider, system="openai", model="gpt-4o-mini"
    )
    # Metrics: one collector in the registry your /metrics endpoint serves.
    registry = CollectorRegistry()
    collector = PrometheusCollector(registry=registry)
    metrics = collector.observer(model="gpt-4o-mini", scope="openai")

    config = ProcessorConfig(retry=RetryConfig(initial_wait=0.001, max_wait=0.01))
    prompts = [f"review {n}" for n in range(3)]
    await process_prompts(
        FakeStrategy(script=SCRIPT),
        prompts,
        config=config,
        observers=[tracing, metrics],
    )

    spans = [
        (
            span.name,
            (span.attributes or {}).get("trio_batch_llm.attempt", 0),
            (span.attributes or {}).get("error.type", "ok"),
        )
        for span in exporter.get_finished_spans()
    ]
    for name, attempt, outcome in sorted(spans, key=str):
        print(name, attempt, outcome)
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith("trio_batch_llm_retries_total{"):
            print(line)


if __name__ == "__main__":
    trio.run(main)
