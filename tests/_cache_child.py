"""Child processes of tests/cache/test_crash.py, on one SQLite response-cache file.

``write PATH --backend B --start N``: writes entries N, N+1, ... for ever (each a
large answer carrying its own SHA-256, so a half-written one would show), with a
small size bound so that eviction runs inside the writes too; prints ``ready``
after the first write. The parent kills it with SIGKILL at a random moment.

``race PATH --backend B --keys K --seed S``: prints ``ready``, waits for ``PATH.go``
(so that two children start together), opens the file (both at once: the schema is
created once), then looks up keys 0..K-1 (in a seeded order) through a
read-write ``CacheGate``: single flight across processes. A lookup that gets a
claim "calls" (sleeps 50 ms) and settles with an answer naming this process. Prints
one JSON line: the keys this process called, and how many answers it shared.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path

import anyio

from trio_batch_llm import SqliteResponseCache
from trio_batch_llm._cache._flight import CacheGate, Claim
from trio_batch_llm._cache._key import request_key
from trio_batch_llm._cache._records import CachedAnswer, CacheKey
from trio_batch_llm._cache._sqlite import SqliteCacheConnection

BLOB = 24_000


def crash_key(i: int) -> CacheKey:
    return request_key({"provider": "crash", "model": "m", "prompt": f"entry {i}"})


def crash_answer(i: int) -> CachedAnswer:
    blob = hashlib.sha256(str(i).encode()).hexdigest() * (BLOB // 64)
    return CachedAnswer(output={"i": i, "blob": blob, "sha": hashlib.sha256(blob.encode()).hexdigest()},
                        usage={"input_tokens": i}, model="m", created_at=time.time())


def check_entry(i: int, found: CachedAnswer | None) -> bool:
    """Whether ``found`` is entry ``i`` whole (``None``: absent, e.g. evicted, which is allowed)."""
    if found is None:
        return True
    out = found.output
    return (isinstance(out, dict) and out.get("i") == i and len(out.get("blob", "")) == BLOB // 64 * 64
            and hashlib.sha256(out["blob"].encode()).hexdigest() == out.get("sha")
            and found.usage == {"input_tokens": i})


async def write(path: Path, start: int) -> None:
    config = SqliteResponseCache(path, max_bytes=2_000_000)
    cache = await SqliteCacheConnection.open(config)
    i = start
    while True:
        await cache.put(crash_key(i), crash_answer(i))
        if i == start:
            print("ready", flush=True)
        i += 1


async def race(path: Path, keys: int, seed: int) -> None:
    config = SqliteResponseCache(path)
    go = path.with_name(path.name + ".go")
    print("ready", flush=True)
    while not go.exists():  # noqa: ASYNC110 - a file from another process: nothing to wait on
        await anyio.sleep(0.005)
    called: list[int] = []
    cache = await SqliteCacheConnection.open(config)
    try:
        gate = CacheGate(cache, config, "read-write")
        order = list(range(keys))
        random.Random(seed).shuffle(order)

        async def one(k: int) -> None:
            found = await gate.lookup(crash_key(k))
            if isinstance(found, Claim):
                called.append(k)
                made: CachedAnswer | None = None
                try:
                    await anyio.sleep(0.05)
                    made = CachedAnswer(output=f"{k} by {os.getpid()}", created_at=time.time())
                finally:
                    with anyio.CancelScope(shield=True):
                        await gate.settle(found, made)

        async with anyio.create_task_group() as tg:
            for k in order:
                tg.start_soon(one, k)
        print(json.dumps({"called": sorted(called), "shared": gate.statistics().shared}), flush=True)
    finally:
        await cache.aclose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["write", "race"])
    parser.add_argument("path", type=Path)
    parser.add_argument("--backend", default="asyncio")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.what == "write":
        anyio.run(write, args.path, args.start, backend=args.backend)
    else:
        anyio.run(race, args.path, args.keys, args.seed, backend=args.backend)


if __name__ == "__main__":
    sys.exit(main())
