"""A child process for the shared in-flight bound tests: ``process_prompts`` against the mock, through Redis.

    python tests/_inflight_child.py BASE_URL REDIS_URL ITEMS --max-in-flight N [--expiry S]
        [--concurrency C] [--backend trio|asyncio] [--prompt-suffix TEXT]

Prints one JSON line at the end: ``{"succeeded": n, "failed": n}``. The mock's latency (its config,
or a ``[[latency:S]]`` tag in ``--prompt-suffix``) makes the calls overlap.
"""

from __future__ import annotations

import argparse
import json

import anyio

from trio_batch_llm import ProcessorConfig, RedisQuotaBackend, RetryConfig, llm, process_prompts


async def main(args: argparse.Namespace) -> None:
    strategy = llm("openai-compatible:mock-model", base_url=args.base_url)
    backend = RedisQuotaBackend(args.redis_url, max_in_flight=args.max_in_flight,
                                in_flight_expiry=args.expiry)
    config = ProcessorConfig(concurrency=args.concurrency, quota_backend=backend,
                             retry=RetryConfig(max_attempts=1))
    prompts = [f"prompt {n}{args.prompt_suffix}" for n in range(args.items)]
    result = await process_prompts(strategy, prompts, config=config)
    succeeded = sum(1 for item in result.results if item.success)
    print(json.dumps({"succeeded": succeeded, "failed": len(result.results) - succeeded}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("base_url")
    parser.add_argument("redis_url")
    parser.add_argument("items", type=int)
    parser.add_argument("--max-in-flight", type=int, required=True)
    parser.add_argument("--expiry", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--backend", default="trio")
    parser.add_argument("--prompt-suffix", default="")
    parsed = parser.parse_args()
    anyio.run(main, parsed, backend=parsed.backend)
