"""async-batch-llm's example_callable_application.py, changed only as the guide lists.

An existing async client is wrapped as a strategy; results stream into a sink and a
JSONL checkpoint, and a second run replays them without calling the client. The
lifecycle hooks (prepare, cleanup, on_error) that ABL passed to CallableStrategy
are methods of an LLMCallStrategy subclass here, TokenTrackingError is a
ProviderError carrying token_usage, and process_stream is an async with block.
"""

import asyncio
import json
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

from trio_batch_llm import (
    ArtifactIdentity,
    ErrorCategory,
    GuardrailConfig,
    JsonlArtifactStore,
    LLMCallStrategy,
    ProcessorConfig,
    ProviderError,
    ResumePolicy,
    RetryConfig,
    RetryState,
    TokenUsage,
    process_stream,
)


@dataclass(frozen=True)
class GatewayResponse:
    text: str
    usage: Mapping[str, int]
    route: str = "local-demo"


class FakeApplicationGateway:
    """Stands in for an existing async client; it performs no retries itself."""

    _invalid_first = frozenset({"doc-1", "doc-3"})

    def __init__(self) -> None:
        self.calls = self.prepared = self.closed = 0
        self._calls_by_document: dict[str, int] = {}

    async def classify(self, prompt: str, *, feedback: str | None) -> GatewayResponse:
        document_id = str(json.loads(prompt)["document_id"])
        self.calls += 1
        number = self._calls_by_document[document_id] = (
            self._calls_by_document.get(document_id, 0) + 1
        )
        await anyio.sleep({"doc-0": 0.03, "doc-2": 0.005}.get(document_id, 0.001))
        if document_id in self._invalid_first and number == 1:
            return GatewayResponse("not-json", {"input_tokens": 3, "total_tokens": 5})
        text = json.dumps({"document_id": document_id, "label": "keep"})
        return GatewayResponse(text, {"input_tokens": 4, "total_tokens": 6})


IDENTITY = ArtifactIdentity(
    provider="application-gateway",
    model="local-classifier-route",
    prompt_version="document-label-v1",
    parser_version="json-label-v1",
    application_version="embedded-demo-v1",
)


class GatewayStrategy(LLMCallStrategy[dict[str, str]]):
    def __init__(self, client: FakeApplicationGateway) -> None:
        self.client = client

    async def prepare(self) -> None:
        self.client.prepared += 1
        await anyio.lowlevel.checkpoint()

    async def cleanup(self) -> None:
        self.client.closed += 1
        await anyio.lowlevel.checkpoint()

    def quota_scope(self) -> object:
        return self.client  # ABL's concurrency_scope=client

    async def execute(
        self, prompt: str, attempt: int, timeout: float | None, state: Any = None
    ) -> tuple[dict[str, str], TokenUsage | None, Any]:
        feedback = None if state is None else state.get("validation_feedback")
        response = await self.client.classify(prompt, feedback=feedback)
        try:
            parsed = json.loads(response.text)
        except json.JSONDecodeError as exc:
            raise ProviderError(  # ABL: TokenTrackingError
                "billed response failed validation",
                category=ErrorCategory.PARSE,
                token_usage=response.usage,
            ) from exc
        usage: Any = dict(response.usage)
        return parsed, usage, {"route": response.route, "attempt": attempt}

    async def on_error(
        self, exception: Exception, attempt: int, state: RetryState | None
    ) -> None:
        if state is not None and isinstance(exception, ProviderError):
            state.set("validation_feedback", "Return one JSON object.")
        await anyio.lowlevel.checkpoint()


CONFIG = ProcessorConfig(
    concurrency=3,
    max_queue_size=4,
    max_result_queue_size=2,
    attempt_timeout=1,
    retry=RetryConfig(max_attempts=2, initial_wait=0.001, max_wait=0.001, jitter=False),
    guardrails=GuardrailConfig(
        total_timeout_per_item=5,
        batch_timeout=30,
        abort_on_error_categories=frozenset({ErrorCategory.AUTHENTICATION}),
    ),
)


async def prompt_source() -> AsyncIterator[tuple[str, str]]:
    for index in range(5):
        await anyio.lowlevel.checkpoint()  # one asynchronous page fetch
        payload = {"document_id": f"doc-{index}", "text": f"application text {index}"}
        yield f"doc-{index}", json.dumps(payload, sort_keys=True)


async def run(path: Path, client: FakeApplicationGateway, resume: ResumePolicy) -> int:
    rows: dict[str, dict[str, str]] = {}
    store = JsonlArtifactStore(path, identity=IDENTITY)
    async with process_stream(
        GatewayStrategy(client), prompt_source(), config=CONFIG,
        artifact_store=store, resume=resume,
    ) as results:
        async for result in results:
            if result.success and result.output is not None:
                rows[result.item_id] = result.output  # the application's own write
    return len(rows)


async def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "labels.jsonl"
        first = FakeApplicationGateway()
        saved = await run(path, first, ResumePolicy.NONE)
        print(f"first run: {saved} rows saved, {first.calls} client calls")
        print(f"prepared {first.prepared}, closed {first.closed}")
        resumed = FakeApplicationGateway()
        saved = await run(path, resumed, ResumePolicy.REUSE_SUCCESSES)
        print(f"resumed run: {saved} rows saved, {resumed.calls} client calls")


if __name__ == "__main__":
    asyncio.run(main())
