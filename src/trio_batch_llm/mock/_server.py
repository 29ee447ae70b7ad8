"""Serve the mock app with hypercorn on a real socket, under Trio or asyncio.

``async with serve_mock(config) as server:`` binds 127.0.0.1 on an OS-chosen
port *before* hypercorn starts (so ``server.base_url`` is known at once and
early connections wait in the backlog), runs hypercorn in a task group the
context manager owns, and on exit: releases pending requests (hangs
included) with a 503, asks hypercorn to stop, waits for it (bounded by
``SHUTDOWN_TIMEOUT``, then cancelled), and closes the listening socket. A
body exception leaves the context unchanged (not wrapped in a group).

The socket is handed to hypercorn's ``worker_serve(..., sockets=...)`` (the
entry point its own multi-worker runner uses) rather than ``serve()``, so the
socket object we bind is the one hypercorn closes: no descriptor is shared
between two owners and no port is left listening.
"""

from __future__ import annotations

import logging
import signal
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, final

import anyio
import sniffio

from ._app import MockOpenAIApp
from ._state import MockServerConfig, MockServerStats, RecordedRequest

__all__ = ["SHUTDOWN_TIMEOUT", "MockServer", "run_mock_server", "serve_mock"]

SHUTDOWN_TIMEOUT = 5.0
"""Seconds the server gets to stop gracefully before its task is cancelled."""
_GRACEFUL_TIMEOUT = 1.0
_KEEP_ALIVE_TIMEOUT = 75.0  # longer than clients' pool expiry, so the client always closes idle first
_BACKLOG = 1024
logger = logging.getLogger("trio_batch_llm.testing.mock_server")


@final
class MockServer:
    """A running mock server: where it listens, what it received, what it counted."""

    def __init__(self, app: MockOpenAIApp, host: str, port: int) -> None:
        self.app = app
        self.host = host
        self.port = port
        url_host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        url_host = f"[{url_host}]" if ":" in url_host else url_host
        self.url = f"http://{url_host}:{port}"
        self.base_url = self.url + "/v1"
        """Pass this as ``base_url=`` to the OpenAI strategies (or the openai SDK)."""
        self.base_urls = {dialect.name: self.url + dialect.base_path for dialect in app.dialects}
        """Each dialect's base URL by name (``"openai"``, ``"anthropic"``, ...), all on this one port:
        what each provider's client (or SDK) takes as ``base_url``."""
        self._shutdown = anyio.Event()
        self._stopped = anyio.Event()

    @property
    def config(self) -> MockServerConfig:
        return self.app.config

    @property
    def stats(self) -> MockServerStats:
        return self.app.statistics()

    def statistics(self) -> MockServerStats:
        return self.app.statistics()

    @property
    def requests(self) -> list[RecordedRequest]:
        return self.app.requests

    async def wait_for(self, predicate: Callable[[MockServerStats], bool]) -> MockServerStats:
        """Wait until ``predicate(stats)`` holds; event-driven, no polling."""
        return await self.app.wait_for(predicate)

    async def wait_for_requests(self, count: int) -> MockServerStats:
        return await self.app.wait_for(lambda stats: stats.requests >= count)

    async def wait_stopped(self) -> None:
        """Return once hypercorn has stopped (after shutdown, or if it stopped on its own)."""
        await self._stopped.wait()

    def __repr__(self) -> str:
        return f"MockServer(base_url={self.base_url!r})"


def _listen(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(_BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def _run_hypercorn(app: MockOpenAIApp, sock: socket.socket, server: MockServer) -> None:
    from hypercorn.config import Config, Sockets
    from hypercorn.utils import wrap_app

    config = Config()
    config.errorlog = logger
    config.accesslog = None
    config.graceful_timeout = _GRACEFUL_TIMEOUT
    config.keep_alive_timeout = _KEEP_ALIVE_TIMEOUT
    config.backlog = _BACKLOG  # hypercorn calls listen() again on the sockets it serves, with this value
    sockets = Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[])
    wrapped = wrap_app(app, config.wsgi_max_body_size, "asgi")  # type: ignore[arg-type]
    try:
        if sniffio.current_async_library() == "trio":
            from hypercorn.trio.run import worker_serve as trio_serve

            await trio_serve(wrapped, config, sockets=sockets, shutdown_trigger=server._shutdown.wait)
        else:
            from hypercorn.asyncio.run import worker_serve as asyncio_serve

            await asyncio_serve(wrapped, config, sockets=sockets, shutdown_trigger=server._shutdown.wait)
    finally:
        server._stopped.set()


async def _stop(server: MockServer, owner: anyio.CancelScope) -> None:
    """Release pending requests, stop hypercorn, wait for it (bounded), cancel it if it overstays."""
    server.app.begin_shutdown()
    server._shutdown.set()
    with anyio.move_on_after(SHUTDOWN_TIMEOUT, shield=True):
        await server._stopped.wait()
    if not server._stopped.is_set():
        logger.warning("mock server did not stop within %.1f s; cancelling it", SHUTDOWN_TIMEOUT)
        owner.cancel()


@asynccontextmanager
async def serve_mock(
    config: MockServerConfig | None = None, *, host: str = "127.0.0.1", port: int = 0,
    wall_clock: Callable[[], float] | None = None,
) -> AsyncIterator[MockServer]:
    """Run the mock server for the duration of the block; ``port=0`` lets the OS choose.

    Real sockets need a real clock: do not use it under Trio's ``MockClock``
    (drive :class:`MockOpenAIApp` in-process through ``httpx2.ASGITransport`` there).
    ``wall_clock`` (default ``time.time``) is what ``calendar_rpm_limit`` reads: a test
    turns the minute by setting it, without waiting for one.
    """
    app = MockOpenAIApp(config, wall_clock=wall_clock)
    sock = _listen(host, port)
    body_error: BaseException | None = None
    try:
        server = MockServer(app, host, sock.getsockname()[1])
        async with anyio.create_task_group() as tg:
            tg.start_soon(_run_hypercorn, app, sock, server)
            try:
                yield server
            except anyio.get_cancelled_exc_class():
                raise
            except BaseException as exc:  # noqa: BLE001 - re-raised below, after the task group, unwrapped
                body_error = exc
            finally:
                await _stop(server, tg.cancel_scope)
    finally:
        sock.close()  # hypercorn closed it already on a clean stop; closing twice is harmless
    if body_error is not None:
        try:
            raise body_error
        finally:
            body_error = None  # break the frame <-> traceback cycle


def run_mock_server(
    host: str = "127.0.0.1",
    port: int = 8000,
    config: MockServerConfig | None = None,
    *,
    backend: str = "trio",
    on_ready: Callable[[MockServer], Any] | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM (or until the server stops), blocking; for ``trio-batch-llm serve-mock``.

    ``on_ready(server)`` runs once the socket listens (print ``server.base_url`` there).
    Ctrl+C or SIGTERM shuts the server down cleanly and returns normally. The
    signals are received as events rather than as ``KeyboardInterrupt``, which
    hypercorn would swallow (and log) if it landed in a request handler.
    """

    async def main() -> None:
        async with serve_mock(config, host=host, port=port) as server:
            if on_ready is not None:
                on_ready(server)
            async with anyio.create_task_group() as tg:
                tg.start_soon(_cancel_on_signal, tg.cancel_scope)
                await server.wait_stopped()
                tg.cancel_scope.cancel(reason="the mock server stopped")

    try:
        anyio.run(main, backend=backend)
    except KeyboardInterrupt:  # a platform without signal receivers (Windows asyncio)
        logger.info("mock server stopped by Ctrl+C")


async def _cancel_on_signal(scope: anyio.CancelScope) -> None:
    try:
        receiver = anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM)
    except NotImplementedError:  # pragma: no cover - Windows asyncio: Ctrl+C stays KeyboardInterrupt
        await anyio.sleep_forever()
    with receiver as signals:
        async for signum in signals:
            logger.info("mock server stopping on %s", signal.Signals(signum).name)
            scope.cancel(reason="stop signal")
            return
