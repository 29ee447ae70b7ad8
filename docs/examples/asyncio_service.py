"""asyncio: one pool shared by concurrent requests; timeouts and cancellation work."""

import asyncio

from trio_batch_llm import FakeStrategy, LLMCallPool, ProcessorConfig, process_prompts


async def handle_request(pool: LLMCallPool[str], question: str) -> str:
    """What a web handler would do: one request through the shared limits."""
    return await pool.submit(question)


async def main() -> None:
    strategy = FakeStrategy(latency=0.05)
    async with LLMCallPool(strategy, config=ProcessorConfig(concurrency=4)) as pool:
        async with asyncio.TaskGroup() as tg:
            tasks = [
                tg.create_task(handle_request(pool, f"question {i}")) for i in range(10)
            ]
        print(
            tasks[0].result(),
            f"(never more than {strategy.max_in_flight} calls at once)",
        )

        # A timeout cancels exactly this caller's request and frees its slot.
        try:
            async with asyncio.timeout(0.01):
                await pool.submit("a slow question")
        except TimeoutError:
            print(f"timed out; requests still pending: {pool.pending}")

    # Around a whole batch, a timeout cancels it and closes everything before it raises.
    try:
        async with asyncio.timeout(0.1):
            await process_prompts(
                strategy, [f"p{i}" for i in range(100)], concurrency=5
            )
    except TimeoutError:
        print(f"batch timed out; calls still running: {strategy.in_flight}")


if __name__ == "__main__":
    asyncio.run(main())
