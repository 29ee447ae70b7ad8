"""Run a batch twice through a response cache: no call and no cost the second time."""

import tempfile
from pathlib import Path

import trio

from trio_batch_llm import (
    LLMWorkItem,
    OpenAICompatibleStrategy,
    ProcessorConfig,
    SqliteResponseCache,
    process_prompts,
)
from trio_batch_llm.testing import MockServerConfig, serve_mock


async def main() -> None:
    async with serve_mock(MockServerConfig(model="gpt-4o-mini")) as server:
        strategy = OpenAICompatibleStrategy("gpt-4o-mini", base_url=server.base_url)
        prompts = [
            LLMWorkItem(item_id=f"q{n}", strategy=strategy, prompt=f"Q{n}?")
            for n in range(8)
        ]
        # Two draws of one prompt: the sample index is part of the key (two entries).
        prompts += [
            LLMWorkItem(item_id=f"j{k}", strategy=strategy, prompt="Joke?", sample=k)
            for k in range(2)
        ]
        with tempfile.TemporaryDirectory() as tmp:
            cache = SqliteResponseCache(Path(tmp) / "cache.sqlite3", ttl=7 * 24 * 3600)
            config = ProcessorConfig(concurrency=4, cache=cache)
            for run in ("first", "second"):
                before = server.stats.requests
                batch = await process_prompts(strategy, prompts, config=config)
                print(
                    f"{run} run: {batch.succeeded} succeeded, "
                    f"{server.stats.requests - before} requests, "
                    f"{batch.cache_hits} hits, {batch.cache_misses} misses"
                )
            hit = next(r for r in batch if r.item_id == "q0")
            print(f"q0: cached={hit.cached} attempts={hit.attempts} {hit.token_usage=}")
            saved_tokens = hit.saved_usage["total_tokens"]
            print(f"q0: saved_usage total_tokens={saved_tokens} (the first call's)")
            rate, saved = batch.response_cache_hit_rate, batch.cache_savings()
            print(f"hit rate {rate:.0f} %, saved ${saved:.6f}")

            # refresh: never read, call again and overwrite (read-only: never write).
            fresh = ProcessorConfig(concurrency=4, cache=cache, cache_mode="refresh")
            before = server.stats.requests
            await process_prompts(strategy, prompts, config=fresh)
            print(f"refresh: {server.stats.requests - before} requests")


if __name__ == "__main__":
    trio.run(main)
