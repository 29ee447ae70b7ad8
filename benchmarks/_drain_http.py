"""Drain scenario (d): the same three stops over real HTTP, against the mock server in another process.

N requests are in flight at the server (it reports them, so readiness is the
server's view, not the client's) and 10×N items are queued. Ours uses
``OpenAICompatibleStrategy`` (httpx2); the floor is a bare task group of N raw
httpx2 posts on one client, closed after the stop (ours closes its client in
strategy cleanup, so the floor closes its client inside the timed section too).

- cancel / deadline: the requests hang (``[[hang]]``); afterwards we check that
  the client holds no connection to the server and that the server saw every
  request disconnect.
- graceful: the requests answer ``latency`` seconds after they arrive
  (``[[latency:L]]``); the stop is ``proc.request_stop()``
  (calls in flight finish, as with DRAIN_ACTIVE; a stop from outside, because a failing trigger
  request cannot be timed to arrive after the other N). The sample is the drain
  beyond the moment the last in-flight answer was due: (last arrival + L),
  using the server's arrival clock (``time.monotonic()``, shared by both
  processes on Linux).
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import httpx2
import psutil

from _drain_inproc import QUEUED_PER_CALL, cancel_from_outside, ours_config
from _mock_process import MockServerProcess
from trio_batch_llm import (
    GuardrailConfig,
    LLMWorkItem,
    OpenAICompatibleStrategy,
    ParallelBatchProcessor,
)

HANG = "[[hang]]"


def graceful_latency(n: int) -> float:
    """Answer delay for the graceful case: comfortably longer than N requests take to arrive."""
    return 0.5 + 0.002 * n


def deadline_timeout(n: int) -> float:
    return 0.5 + 0.002 * n


async def _wait_for_server(server: MockServerProcess, base: dict[str, Any], n: int) -> dict[str, Any]:
    """Poll until N more requests than ``base`` are in flight at the server."""
    end = time.monotonic() + 60
    while True:
        stats = server.stats()
        if stats["in_flight"] >= n and stats["requests"] - base["requests"] >= n:
            return stats
        if time.monotonic() > end:
            raise TimeoutError(f"only {stats['in_flight']} of {n} requests reached the server")
        await anyio.sleep(0.005)


def _client_connections(port: int) -> int:
    """Established TCP connections from this process to the server."""
    return sum(1 for c in psutil.Process().net_connections(kind="tcp")
               if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def _after(server: MockServerProcess, base: dict[str, Any]) -> dict[str, Any]:
    """Outside the timed section: what the client and the server hold once the owner returned."""
    left = _client_connections(server.port)
    stats = server.wait_until(lambda s: s["in_flight"] == 0, timeout=10)
    return {"client_connections_left": left, "server_in_flight_after": stats["in_flight"],
            "server_disconnects": stats["disconnects"] - base["disconnects"],
            "server_requests": stats["requests"] - base["requests"]}


def _strategy(server: MockServerProcess) -> OpenAICompatibleStrategy:
    return OpenAICompatibleStrategy("mock-model", base_url=server.base_url, api_key=None, api_key_env=None)


def _items(strategy: OpenAICompatibleStrategy, n: int, prompt: str) -> list[LLMWorkItem[str]]:
    return [LLMWorkItem(item_id=f"i{i}", strategy=strategy, prompt=prompt) for i in range(n * (1 + QUEUED_PER_CALL))]


# --- ours ------------------------------------------------------------------


async def ours_http_cancel(n: int, server: MockServerProcess) -> dict[str, Any]:
    base = server.stats()
    strategy = _strategy(server)
    proc = ParallelBatchProcessor[str](ours_config(n))

    async def body() -> None:
        async with proc:
            for item in _items(strategy, n, HANG):
                await proc.add_work(item)
            await proc.process_all()

    ms = await cancel_from_outside(body, lambda: _wait_for_server(server, base, n))
    return {"ms": ms, "state": proc.state, **_after(server, base)}


async def ours_http_graceful(n: int, server: MockServerProcess) -> dict[str, Any]:
    base = server.stats()
    latency = graceful_latency(n)
    strategy = _strategy(server)
    proc = ParallelBatchProcessor[str](ours_config(n))
    done: list[Any] = []

    async def body() -> None:
        async with proc:
            for item in _items(strategy, n, f"[[latency:{latency}]]"):
                await proc.add_work(item)
            batch = await proc.process_all()
        done.extend((time.monotonic(), batch))

    async with anyio.create_task_group() as tg:
        tg.start_soon(body)
        ready = await _wait_for_server(server, base, n)
        proc.request_stop("benchmark stop")  # calls in flight finish, the queue is not executed
    t_done, batch = done
    due = ready["last_arrival"] + latency
    return {"ms": (t_done - due) * 1000, "termination": batch.termination.kind,
            "succeeded": batch.succeeded, "results": len(batch.results), "state": proc.state, **_after(server, base)}


async def ours_http_deadline(n: int, server: MockServerProcess) -> dict[str, Any]:
    base = server.stats()
    timeout = deadline_timeout(n)
    strategy = _strategy(server)
    proc = ParallelBatchProcessor[str](ours_config(n, guardrails=GuardrailConfig(batch_timeout=timeout)))
    async with proc:
        for item in _items(strategy, n, HANG):
            await proc.add_work(item)
        deadline = time.monotonic() + timeout
        batch = await proc.process_all()
    ms = (time.monotonic() - deadline) * 1000
    after = _after(server, base)
    last = server.stats()["last_arrival"]
    return {"ms": ms, "termination": batch.termination.kind, "results": len(batch.results), "state": proc.state,
            "all_in_flight_before_deadline": after["server_requests"] >= n and last < deadline, **after}


# --- floors: raw httpx2, a bare task group --------------------------------------


def _raw_client(n: int) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(limits=httpx2.Limits(max_connections=n, max_keepalive_connections=n),
                              timeout=httpx2.Timeout(600.0))


async def _post(client: httpx2.AsyncClient, url: str, prompt: str, errors: list[str]) -> None:
    """One raw request; a transport error (a connection refused or reset while 1,000 connections
    open at once) is retried, as our engine retries it, so that N requests do reach the server."""
    body = {"model": "mock-model", "messages": [{"role": "user", "content": prompt}]}
    for attempt in range(5):
        try:
            reply = await client.post(url, json=body)
            reply.raise_for_status()
            return
        except httpx2.TransportError as exc:
            errors.append(type(exc).__name__)  # counted: the sample reports its retries
            await anyio.sleep(0.01 * (attempt + 1))


async def floor_http_cancel(n: int, server: MockServerProcess) -> dict[str, Any]:
    base = server.stats()
    client, url, errors = _raw_client(n), server.base_url + "/chat/completions", []
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(_post, client, url, HANG, errors)
            await _wait_for_server(server, base, n)
            t0 = time.perf_counter()
            scope.cancel()
    await client.aclose()
    return {"ms": (time.perf_counter() - t0) * 1000, "request_retries": len(errors), **_after(server, base)}


async def floor_http_graceful(n: int, server: MockServerProcess) -> dict[str, Any]:
    base = server.stats()
    latency = graceful_latency(n)
    client, url, errors = _raw_client(n), server.base_url + "/chat/completions", []
    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(_post, client, url, f"[[latency:{latency}]]", errors)
        ready = await _wait_for_server(server, base, n)
    await client.aclose()
    return {"ms": (time.monotonic() - ready["last_arrival"] - latency) * 1000, "request_retries": len(errors),
            **_after(server, base)}


async def floor_http_deadline(n: int, server: MockServerProcess) -> dict[str, Any]:
    base = server.stats()
    client, url, errors = _raw_client(n), server.base_url + "/chat/completions", []
    timeout = deadline_timeout(n)
    deadline = time.monotonic() + timeout
    with anyio.move_on_after(timeout):
        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(_post, client, url, HANG, errors)
    await client.aclose()
    return {"ms": (time.monotonic() - deadline) * 1000, "request_retries": len(errors), **_after(server, base)}
