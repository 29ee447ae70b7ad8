"""N simulated clients sharing one Redis never exceed the RPM or TPM limit, whatever they do and when.

The script runs on a real Redis but with a fake clock passed in (``script_clock``),
so hypothesis moves time freely. Each client is a RedisSharedQuota on its own
link; operations are single round trips (``_round_trip``), so no test waits.
The invariant checked after each grant is the one the provider sees: requests
that may still count (open, or ended less than a window ago) never exceed the
limit. (TPM is in force too, so units and token entries interleave in the script.)
"""

from __future__ import annotations

from typing import Any

import anyio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from trio_batch_llm import RedisQuotaBackend
from trio_batch_llm._admission._redis_link import RedisLink
from trio_batch_llm._admission._redis_quota import RedisSharedQuota, SharedTicket, _Want

from .._servers.redis import RedisServer

LIMIT, TPM, CLIENTS = 4, 100, 3

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.integers(0, CLIENTS - 1), st.integers(0, 60)),
        st.tuples(st.just("end"), st.integers(0, CLIENTS - 1), st.integers(0, 80)),
        st.tuples(st.just("refund"), st.integers(0, CLIENTS - 1), st.just(0)),
        st.tuples(st.just("tick"), st.just(0), st.integers(1, 40)),
    ),
    max_size=40,
)


async def _play(url: str, ops: list[tuple[str, int, int]]) -> None:
    now = [1000.0]
    backend = RedisQuotaBackend(url, max_call_seconds=30.0)
    async with anyio.create_task_group() as tg:
        links = [RedisLink(backend, script_clock=lambda: now[0]) for _ in range(CLIENTS)]
        for link in links:
            tg.start_soon(link.serve)
        quotas = [RedisSharedQuota(link, "prop", requests_per_minute=LIMIT, tokens_per_minute=TPM)
                  for link in links]
        open_calls: list[list[tuple[SharedTicket, int]]] = [[] for _ in range(CLIENTS)]  # and its model row
        counted: list[tuple[float, float, int]] = []  # (admitted, stops counting, tokens): the model
        hold = backend.max_call_seconds
        for op, client, value in ops:
            quota = quotas[client]
            if op == "tick":
                now[0] += value
            elif op == "admit":
                reply = await quota._round_trip([_Want(quota.clamp(value))])
                if reply.units:
                    ticket = SharedTicket(reply.units[0], quota.clamp(value))
                    open_calls[client].append((ticket, len(counted)))
                    counted.append((now[0], now[0] + hold + 60.0, quota.clamp(value)))
                    live = [c for c in counted if c[1] > now[0]]
                    assert len(live) <= LIMIT
            elif open_calls[client]:
                # A call open longer than max_call_seconds has stopped counting; its end counts it
                # again for a window (the script re-adds an ended unit whatever it held before).
                ticket, index = open_calls[client].pop(0)
                start, _, tokens = counted[index]
                if op == "end":
                    quota.settle_ended(ticket, value)
                    counted[index] = (start, now[0] + 60.0, tokens)
                else:
                    quota.settle_unused(ticket)
                    counted[index] = (start, now[0], tokens)
                await quota._round_trip([])  # the release reaches Redis before anything else happens
        for link in links:
            await link.aclose()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
# Found by hypothesis: a call ended exactly when it stopped counting (max_call_seconds + a window).
@example(ops=[("admit", 0, 0), ("tick", 0, 10), ("tick", 0, 40), ("tick", 0, 40), ("end", 0, 0)])
def test_clients_sharing_redis_never_exceed_the_limit(redis_server: RedisServer, ops: Any) -> None:
    redis_server.flush()
    anyio.run(_play, redis_server.url, ops)
