"""Child processes of the shared-cache tests and of ``benchmarks/cache.py``: a racer and a writer.

``race``: one process of a race over the same prompts on a shared cache (PostgreSQL or
Redis). Every prompt goes through the response cache; a miss is one call to the mock
server (the provider), which counts the calls. Two modes:

- ``gate``: the cache runtime directly (``open_cache`` + ``CacheGate``): look the key up,
  make the call on a claim (``call_result`` against the mock), settle the claim.
- ``engine``: ``process_prompts(..., config=ProcessorConfig(cache=URL))``: the engine's
  own cache path (needs the engine wiring of issue 34).

It waits for the parent's ``go`` line on stdin (so that both racers start together) and
prints one JSON line: ``{"hits": ..., "calls": ..., "seconds": ...}``.

``write``: writes entries with large answers forever, printing ``wrote N`` after each,
for a parent that kills it with SIGKILL mid-write (no half entry may remain).

    python tests/_cache_race_child.py race URL --base-url B --prompts 1000 --backend trio
    python tests/_cache_race_child.py write URL --backend asyncio
"""

from __future__ import annotations

import argparse
import hashlib
import json
import signal
import subprocess
import sys
import time
from typing import Any

import anyio

from trio_batch_llm import (
    OpenAICompatibleStrategy,
    ProcessorConfig,
    RetryConfig,
    call_result,
    process_prompts,
)
from trio_batch_llm._cache._flight import CacheGate
from trio_batch_llm._cache._key import request_key
from trio_batch_llm._cache._open import open_cache
from trio_batch_llm._cache._records import CachedAnswer
from trio_batch_llm._values._response_cache import as_response_cache

MODEL = "race-model"
ANSWER_BYTES = 64 * 1024  # a write large enough that a kill can land inside it


def race_prompts(count: int) -> list[str]:
    return [f"race prompt {i}: what is {i} + {i}?" for i in range(count)]


def writer_answer(i: int) -> CachedAnswer:
    """Entry ``i``'s answer: a long text with its own checksum, to tell a whole entry from a cut one."""
    body = (f"{i}:" * ANSWER_BYTES)[:ANSWER_BYTES]
    return CachedAnswer(output={"body": body, "sha": hashlib.sha256(body.encode()).hexdigest()},
                        usage={"input_tokens": i}, model=MODEL, created_at=time.time())


async def _wait_for_go() -> None:
    line = await anyio.to_thread.run_sync(sys.stdin.readline)
    if line.strip() != "go":
        raise SystemExit(f"expected 'go', got {line!r}")


async def race_gate(url: str, base_url: str, prompts: list[str], concurrency: int) -> dict[str, Any]:
    config = as_response_cache(url)
    assert config is not None
    strategy = OpenAICompatibleStrategy(MODEL, base_url=base_url, api_key="sk-race")
    call_config = ProcessorConfig(concurrency=concurrency, retry=RetryConfig(max_attempts=1))
    hits = calls = 0
    async with open_cache(config) as connection:
        gate = CacheGate(connection, config, "read-write")
        print("ready", flush=True)
        await _wait_for_go()
        started = time.perf_counter()
        limiter = anyio.CapacityLimiter(concurrency)

        async def one(prompt: str) -> None:
            nonlocal hits, calls
            async with limiter:
                key = request_key({"model": MODEL, "prompt": prompt})
                found = await gate.lookup(key)
                if isinstance(found, CachedAnswer):
                    hits += 1
                    return
                answer = None
                try:
                    calls += 1
                    result = await call_result(strategy, prompt, config=call_config)
                    if result.success:
                        answer = CachedAnswer(output=result.output, usage=dict(result.token_usage),
                                              model=MODEL, created_at=time.time())
                finally:
                    with anyio.CancelScope(shield=True) as shield:
                        shield.deadline = anyio.current_time() + 5
                        await gate.settle(found, answer)

        async with anyio.create_task_group() as tg:
            for prompt in prompts:
                tg.start_soon(one, prompt)
        seconds = time.perf_counter() - started
    return {"hits": hits, "calls": calls, "seconds": seconds}


async def race_engine(url: str, base_url: str, prompts: list[str], concurrency: int) -> dict[str, Any]:
    strategy = OpenAICompatibleStrategy(MODEL, base_url=base_url, api_key="sk-race")
    config = ProcessorConfig(concurrency=concurrency, retry=RetryConfig(max_attempts=1), cache=url)
    print("ready", flush=True)
    await _wait_for_go()
    started = time.perf_counter()
    batch = await process_prompts(strategy, prompts, config=config)
    seconds = time.perf_counter() - started
    hits = sum(1 for result in batch.results if getattr(result, "cached", False))
    failed = sum(1 for result in batch.results if not result.success)
    return {"hits": hits, "calls": len(batch.results) - hits, "failed": failed, "seconds": seconds}


async def write_forever(url: str) -> None:
    config = as_response_cache(url)
    assert config is not None
    async with open_cache(config) as connection:
        i = 0
        while True:
            await connection.put(request_key({"writer": i}), writer_answer(i))
            print(f"wrote {i}", flush=True)
            i += 1


# -- the parent's side ---------------------------------------------------------------


def _child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)


def run_race(url: str, base_url: str, prompts: int, *, processes: int = 2, mode: str = "gate",
             backend: str = "asyncio", concurrency: int = 32, timeout: float = 300.0) -> list[dict[str, Any]]:
    """Start ``processes`` racers, let them go together, and return what each printed."""
    children = [_child("race", url, "--base-url", base_url, "--prompts", str(prompts), "--mode", mode,
                       "--backend", backend, "--concurrency", str(concurrency)) for _ in range(processes)]
    try:
        for child in children:
            assert child.stdout is not None
            line = child.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"a racer did not start: {line!r}")
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        outs = []
        for child in children:
            out, _ = child.communicate(timeout=timeout)
            if child.returncode != 0:
                raise RuntimeError(f"a racer failed (exit {child.returncode}): {out[-2000:]}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
        return outs
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            with child:  # closes its pipes and waits
                pass


def kill_writer_mid_write(url: str, *, after: int, backend: str = "asyncio", timeout: float = 60.0) -> int:
    """Start a writer, SIGKILL it once it has written ``after`` entries (it is then inside the next
    write, or about to be); the number of entries it said it wrote."""
    child = _child("write", url, "--backend", backend)
    wrote = -1
    try:
        assert child.stdout is not None
        deadline = time.monotonic() + timeout
        while wrote + 1 < after:
            line = child.stdout.readline()
            if not line or time.monotonic() > deadline:
                raise RuntimeError(f"the writer stopped after {wrote + 1} entries")
            wrote = int(line.split()[1])
        time.sleep(0.002)  # into the next write
    finally:
        child.send_signal(signal.SIGKILL)
        with child:  # closes its pipes and waits
            pass
    return wrote + 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["race", "write"])
    parser.add_argument("url")
    parser.add_argument("--base-url", default="")
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--mode", choices=["gate", "engine"], default="gate")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args()
    if args.what == "write":
        anyio.run(write_forever, args.url, backend=args.backend)
        return
    racer = race_gate if args.mode == "gate" else race_engine
    out = anyio.run(racer, args.url, args.base_url, race_prompts(args.prompts), args.concurrency,
                    backend=args.backend)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
