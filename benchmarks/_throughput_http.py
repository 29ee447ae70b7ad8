"""Throughput over real HTTP at concurrency C: ours, and a raw httpx2 loop, on any anyio backend.

The mock server runs in its own process (``_mock_process``); every request is
answered at once (latency 0), so the numbers are what client and server
together sustain on this machine. The raw loop is the floor an engine is held
to: C tasks on one ``httpx2.AsyncClient`` posting the same chat-completions
body and decoding the JSON reply, with nothing else.
"""

from __future__ import annotations

import json

import anyio
import httpx2

from trio_batch_llm import OpenAICompatibleStrategy, process_prompts


async def ours_http(items: int, concurrency: int, base_url: str) -> int:
    strategy = OpenAICompatibleStrategy("mock-model", base_url=base_url, api_key="bench", api_key_env=None)
    batch = await process_prompts(strategy, [f"p{i}" for i in range(items)], concurrency=concurrency)
    return batch.succeeded


async def raw_httpx2(items: int, concurrency: int, base_url: str) -> int:
    url = base_url + "/chat/completions"
    headers = {"authorization": "Bearer bench", "accept": "application/json"}
    limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    next_item, ok = 0, 0

    async def worker(client: httpx2.AsyncClient) -> None:
        nonlocal next_item, ok
        while next_item < items:
            i, next_item = next_item, next_item + 1
            body = {"model": "mock-model", "messages": [{"role": "user", "content": f"p{i}"}]}
            reply = await client.post(url, json=body, headers=headers)
            if reply.status_code == 200 and json.loads(reply.content)["choices"][0]["message"]["content"]:
                ok += 1

    async with (
        httpx2.AsyncClient(limits=limits, timeout=httpx2.Timeout(60.0)) as client,
        anyio.create_task_group() as tg,
    ):
        for _ in range(concurrency):
            tg.start_soon(worker, client)
    return ok
