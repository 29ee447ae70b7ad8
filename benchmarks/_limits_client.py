"""One client of ``limits.py``, in its own process: run as many items as it can for ``--duration`` seconds.

    python benchmarks/_limits_client.py --variant ours --backend trio --base-url URL --duration 240 \\
        [--rpm N] [--tpm N] [--no-learn] [--concurrency 64] [--items N] [--prompt-chars 200] [--output-tokens 50]

Variants:

- ``ours``: ``process_prompts`` with ``OpenAICompatibleStrategy`` (httpx2), the
  library's defaults otherwise (``--rpm`` / ``--tpm`` configure limits;
  ``--no-learn`` sets ``RateLimitConfig(learn_limits=False)``: today's scope);
- ``abl``: async-batch-llm 0.28's ``process_prompts`` with its
  ``llm("openai-compatible:...")`` strategy (the openai SDK, ``max_retries=0``:
  retries are the engine's), on native asyncio;
- ``gather``: a plain ``asyncio.Semaphore`` + ``asyncio.gather`` loop over one
  httpx2 client, sleeping the answer's Retry-After (else 1 s) after a 429 and
  trying again;
- ``retry``: the same semaphore loop with what a careful user writes with
  tenacity (``wait_random_exponential(multiplier=1, max=60)``), by hand: after a
  429, a 5xx or a transport error, sleep ``max(Retry-After, uniform(0, min(60,
  2 ** n)))`` for the item's n-th retry (n from 0), holding its slot, as a retry
  decorator inside ``async with semaphore`` does; other answers end the item.

Every variant gets the same prompts and, where it takes one, the same exact
token estimator (prompt characters / 4 + the mock's fixed output tokens), so a
configured TPM means what it says. The client stops at ``--duration``
(cancelled); the mock server's own records are the measurement. Prints one
JSON line: ``{"variant", "backend", "started", "stopped"}`` (``time.monotonic()``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import time
from typing import Any


def prompts(count: int, chars: int) -> list[str]:
    return [f"item {i:07d} " + "x" * max(0, chars - 13) for i in range(count)]


def estimate(prompt: str, output_tokens: int) -> int:
    return math.ceil(len(prompt) / 4) + output_tokens


async def run_ours(args: argparse.Namespace, items: list[str]) -> None:
    import anyio

    from trio_batch_llm import OpenAICompatibleStrategy, ProcessorConfig, RateLimitConfig, process_prompts

    config = ProcessorConfig(
        concurrency=args.concurrency, max_requests_per_minute=args.rpm, max_tokens_per_minute=args.tpm,
        token_estimator=lambda p: estimate(p, args.output_tokens),
        rate_limit=RateLimitConfig(learn_limits=args.learn), attempt_timeout=60.0,
        progress_interval=3600.0,
    )
    strategy = OpenAICompatibleStrategy("mock-model", base_url=args.base_url, api_key="bench", api_key_env=None)
    with anyio.move_on_after(args.duration):
        await process_prompts(strategy, items, config=config)


async def run_abl(args: argparse.Namespace, items: list[str]) -> None:
    from async_batch_llm import ProcessorConfig, llm, process_prompts
    from async_batch_llm.token_estimation import CharacterTokenEstimator

    logging.getLogger("async_batch_llm").setLevel(logging.CRITICAL)
    strategy: Any = llm("openai-compatible:mock-model", base_url=args.base_url, api_key="bench",
                        max_connections=args.concurrency, max_retries=0)
    config = ProcessorConfig(
        concurrency=args.concurrency, max_requests_per_minute=args.rpm, max_tokens_per_minute=args.tpm,
        token_estimator=CharacterTokenEstimator(characters_per_token=4.0,
                                                expected_output_tokens=args.output_tokens),
        attempt_timeout=60.0, progress_interval=len(items) + 1,
    )
    try:
        await asyncio.wait_for(process_prompts(strategy, items, config=config), args.duration)
    except TimeoutError:
        pass


async def run_retry(args: argparse.Namespace, items: list[str]) -> None:
    import random

    import httpx2

    url = args.base_url + "/chat/completions"
    headers = {"authorization": "Bearer bench"}
    limits = httpx2.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    semaphore = asyncio.Semaphore(args.concurrency)
    jitter = random.Random(0)

    def retry_after(reply: httpx2.Response) -> float:
        for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
            try:
                return float(reply.headers[name]) * scale
            except (KeyError, ValueError):
                continue
        return 0.0

    async def one(client: httpx2.AsyncClient, prompt: str) -> None:
        async with semaphore:
            body = {"model": "mock-model", "messages": [{"role": "user", "content": prompt}]}
            for attempt in range(1000):
                hint = 0.0
                try:
                    reply = await client.post(url, json=body, headers=headers)
                except httpx2.TransportError:
                    pass
                else:
                    if reply.status_code != 429 and reply.status_code < 500:
                        return
                    hint = retry_after(reply)
                # Full jitter (AWS's "exponential backoff and jitter", tenacity's wait_random_exponential),
                # never shorter than the server asked.
                await asyncio.sleep(max(hint, jitter.uniform(0.0, min(60.0, 2.0 ** attempt))))

    async with httpx2.AsyncClient(limits=limits, timeout=httpx2.Timeout(60.0)) as client:
        work = asyncio.gather(*(one(client, p) for p in items))
        try:
            await asyncio.wait_for(work, args.duration)
        except TimeoutError:
            pass


async def run_gather(args: argparse.Namespace, items: list[str]) -> None:
    import httpx2

    url = args.base_url + "/chat/completions"
    headers = {"authorization": "Bearer bench"}
    limits = httpx2.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    semaphore = asyncio.Semaphore(args.concurrency)

    async def one(client: httpx2.AsyncClient, prompt: str) -> None:
        async with semaphore:
            for _ in range(1000):
                body = {"model": "mock-model", "messages": [{"role": "user", "content": prompt}]}
                reply = await client.post(url, json=body, headers=headers)
                if reply.status_code != 429:
                    return
                wait = reply.headers.get("retry-after-ms")
                seconds = float(wait) / 1000 if wait else float(reply.headers.get("retry-after", "1"))
                await asyncio.sleep(seconds)

    async with httpx2.AsyncClient(limits=limits, timeout=httpx2.Timeout(60.0)) as client:
        work = asyncio.gather(*(one(client, p) for p in items))
        try:
            await asyncio.wait_for(work, args.duration)
        except TimeoutError:
            pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", choices=["ours", "abl", "gather", "retry"], required=True)
    parser.add_argument("--backend", default="asyncio")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--rpm", type=float)
    parser.add_argument("--tpm", type=int)
    parser.add_argument("--no-learn", dest="learn", action="store_false")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--prompt-chars", type=int, default=40)
    parser.add_argument("--output-tokens", type=int, default=10)
    args = parser.parse_args()
    items = prompts(args.items, args.prompt_chars)
    started = time.monotonic()
    if args.variant == "ours":
        import anyio

        anyio.run(run_ours, args, items, backend=args.backend)
    elif args.variant == "abl":
        asyncio.run(run_abl(args, items))
    elif args.variant == "retry":
        asyncio.run(run_retry(args, items))
    else:
        asyncio.run(run_gather(args, items))
    print(json.dumps({"variant": args.variant, "backend": args.backend, "started": started,
                      "stopped": time.monotonic()}), flush=True)


if __name__ == "__main__":
    main()
