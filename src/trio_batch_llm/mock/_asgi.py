"""ASGI plumbing of the mock app: the message types, reading a body, lifespan, sending an answer.

:class:`Exchange` is one request on its way through the app: its record, its
dialect, its key (never recorded), and whether an answer has started or the client has
gone, which decide what a release by disconnect or shutdown means.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias, final

import anyio

from ._dialect import Dialect
from ._state import RecordedRequest

__all__ = [
    "Exchange",
    "Message",
    "Receive",
    "Scope",
    "Send",
    "lifespan",
    "read_body",
    "send_json",
    "send_raw",
    "watch_disconnect",
]

Scope: TypeAlias = MutableMapping[str, Any]
Message: TypeAlias = MutableMapping[str, Any]
Receive: TypeAlias = Callable[[], Awaitable[Message]]
Send: TypeAlias = Callable[[Message], Awaitable[None]]


@final
@dataclass(slots=True)
class Exchange:
    """One request's progress, shared with its disconnect watcher."""

    record: RecordedRequest
    dialect: Dialect
    """Whose wire format every answer to this request is in."""
    request_id: str = ""
    credential: str | None = None
    """The API key the request carried (never recorded)."""
    started: bool = False
    disconnected: bool = False
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    """Headers every answer to this request carries (the rate-limit headers)."""


async def read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def watch_disconnect(receive: Receive, scope: anyio.CancelScope, exchange: Exchange) -> None:
    """Cancel ``scope`` when the client disconnects (and say so in ``exchange``)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            exchange.disconnected = True
            scope.cancel()
            return


async def lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def send_json(send: Send, status: int, payload: Any, *,
                    headers: list[tuple[bytes, bytes]] | None = None,
                    exchange: Exchange | None = None) -> None:
    await send_raw(send, status, json.dumps(payload).encode(), headers=headers, exchange=exchange)


async def send_raw(send: Send, status: int, body: bytes, *, headers: list[tuple[bytes, bytes]] | None = None,
                   exchange: Exchange | None = None, content_type: bytes = b"application/json") -> None:
    head = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if exchange is not None:
        exchange.started = True
        head += exchange.headers
    await send({"type": "http.response.start", "status": status, "headers": head + (headers or [])})
    await send({"type": "http.response.body", "body": body})
