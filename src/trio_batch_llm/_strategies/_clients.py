"""The per-event-loop registry of the HTTP/SDK clients that strategies open and share.

Strategies with equal lease identities share one client per event loop: ``prepare()``
opens it into this registry unless it is already there, ``execute`` looks it up,
``cleanup()`` closes it and drops it. The engine's lease registry runs ``prepare`` once
per identity and ``cleanup`` at the last release, which is exactly the client's lifetime.
A ``RunVar``, so two event loops (two ``trio.run`` or ``asyncio.run`` calls, or threads)
never share a client bound to another loop. Every provider's strategies use it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio.lowlevel

__all__ = ["client_registry", "close_lease"]

_CLIENTS: anyio.lowlevel.RunVar[dict[object, Any]] = anyio.lowlevel.RunVar("trio_batch_llm_clients")


def client_registry() -> dict[object, Any]:
    """This event loop's shared clients, by lease identity (created empty on first use)."""
    try:
        return _CLIENTS.get()
    except LookupError:
        clients: dict[object, Any] = {}
        _CLIENTS.set(clients)
        return clients


async def close_lease(identity: object, close: Callable[[Any], Awaitable[None]]) -> None:
    """Close what the lease ``identity`` opened into the registry (idempotent: nothing there, a checkpoint).

    Dropped only once ``close`` returns: an interrupted or failed close leaves the entry for a
    later ``cleanup()`` to retry. Dropped only if still the same entry, in case a new lease
    opened another while this one was closing.
    """
    clients = client_registry()
    entry = clients.get(identity)
    if entry is None:
        await anyio.lowlevel.checkpoint()
        return
    await close(entry)
    if clients.get(identity) is entry:
        del clients[identity]
