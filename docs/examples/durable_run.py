"""A durable run: bounded waits, pause and resume, reattach, results read by cursor."""

import tempfile
from pathlib import Path

import anyio
import trio

from trio_batch_llm import (
    OpenAICompatibleStrategy,
    ProcessorConfig,
    open_run,
    read_run_snapshot,
)
from trio_batch_llm.mock import MockServerConfig, serve_mock

PROMPTS = [(f"doc-{i:02d}", f"Summarise document {i}.") for i in range(80)]


async def main() -> None:
    config = ProcessorConfig(concurrency=4)
    async with serve_mock(MockServerConfig(latency=0.05)) as server:
        strategy = OpenAICompatibleStrategy("any-model", base_url=server.base_url)
        with tempfile.TemporaryDirectory() as tmp:
            db = (
                Path(tmp) / "runs.sqlite"
            )  # the run's state lives here, not in this process

            async with await open_run(
                db, "nightly", strategy, PROMPTS, config=config
            ) as run:
                # wait() drives the run; its timeout bounds this call, not the run.
                try:
                    await run.wait(timeout=0.1)
                except TimeoutError:
                    snap = await run.snapshot()
                    print(
                        f"after wait(timeout=0.1): {snap.status}, "
                        f"finished: {snap.done == len(PROMPTS)}"
                    )

                # Pause while driving: no new call starts, calls in flight finish and
                # are recorded.
                seen = server.stats.requests
                async with anyio.create_task_group() as tg:
                    tg.start_soon(run.wait)
                    await server.wait_for(lambda stats: stats.requests >= seen + 4)
                    paused = await run.pause("deploy")
                    tg.cancel_scope.cancel()  # wait() would keep watching a paused run
                assert paused.termination is not None
                print(
                    f"paused: {paused.status} ({paused.termination.reason}), "
                    f"some pending: {paused.pending > 0}"
                )

            # Any process can reattach by name; pass the same source, it continues from
            # its checkpoint.
            async with await open_run(
                db, "nightly", strategy, PROMPTS, config=config
            ) as run:
                await run.resume()
                final = await run.wait()
                print(
                    f"resumed and finished: {final.status}, "
                    f"{final.succeeded}/{final.items} succeeded, "
                    f"last sequence {final.last_sequence}"
                )

                # Results come in a gapless sequence: store the cursor with what you did
                # with them.
                cursor = 0
                while page := await run.read_results(after_sequence=cursor, limit=25):
                    print(f"read sequences {page[0].sequence}-{page[-1].sequence}")
                    cursor = page[-1].sequence
                answers = {r.item_id: r.result.output for r in await run.read_results()}
                print("doc-07:", answers["doc-07"])
                print(
                    "exported",
                    await run.export_jsonl(Path(tmp) / "results.jsonl"),
                    "results",
                )

            # Another process (a dashboard, cron) reads the stored snapshot without a
            # handle.
            snap = await anyio.to_thread.run_sync(read_run_snapshot, db, "nightly")
            print(
                f"read_run_snapshot: {snap.status}, "
                f"{snap.done} done, {snap.total_tokens} tokens"
            )


if __name__ == "__main__":
    trio.run(main)
