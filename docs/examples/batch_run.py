"""A durable run through the Batch API: files, polled batches, failed lines retried."""

import tempfile
from pathlib import Path

import anyio
import trio

from trio_batch_llm import (
    OpenAICompatibleStrategy,
    ProcessorConfig,
    ProviderBatchConfig,
    RetryConfig,
    open_run,
)
from trio_batch_llm.mock import MockServerConfig, serve_mock

PROMPTS = [(f"q{i:02d}", f"Classify review {i}.") for i in range(20)]
# Two lines that get a 500 in their first batch, then succeed: they are retried in a new
# batch.
PROMPTS[1] = ("q01", "[[fail:500x1]] Classify review 1.")
PROMPTS[5] = ("q05", "[[fail:500x1]] Classify review 5.")


async def main() -> None:
    # The mock server emulates /v1/files and /v1/batches; a batch finishes 0.5 s after
    # its creation.
    async with serve_mock(MockServerConfig(batch_latency=0.5)) as server:
        strategy = OpenAICompatibleStrategy("any-model", base_url=server.base_url)
        batch = ProviderBatchConfig(
            max_requests_per_batch=8,  # OpenAI allows 50,000 (and 200 MB) per batch
            # seconds between looks at an open batch (30 s by default)
            poll_interval=0.1,
        )
        # Failed lines are retried in later batches, with this backoff and budget.
        config = ProcessorConfig(
            retry=RetryConfig(max_attempts=3, initial_wait=0.1, jitter=False)
        )
        with tempfile.TemporaryDirectory() as tmp:
            db = Path(tmp) / "runs.sqlite"
            async with await open_run(
                db,
                "reviews",
                strategy,
                PROMPTS,
                mode="provider-batch",
                batch=batch,
                config=config,
            ) as run:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(run.wait)  # drives the run: submits, polls, collects
                    await server.wait_for(lambda stats: stats.batches_created >= 3)
                    snap = await run.snapshot()
                    print(
                        f"submitted: {snap.open_submissions} batches "
                        f"open, {snap.batched} items in them"
                    )
                final = (
                    await run.snapshot()
                )  # the task group ended when wait() returned
                print(
                    f"{final.status}: {final.succeeded} "
                    f"succeeded, {final.failed} failed, "
                    f"{final.total_tokens} tokens, open "
                    f"batches {final.open_submissions}"
                )
                results = {r.item_id: r.result for r in await run.read_results()}
            stats = server.stats
            print(
                f"the provider saw {stats.files_uploaded} "
                f"files and {stats.batches_created} batches "
                f"({stats.batch_lines} lines run)"
            )
            for item_id in ("q00", "q01", "q05"):
                result = results[item_id]
                print(f"{item_id}: attempts {result.attempts}, {result.output}")


if __name__ == "__main__":
    trio.run(main)
