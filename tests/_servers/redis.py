"""A real Redis server for the tests: ``redis-server`` on a random loopback port in a temporary folder.

The session's server starts on first use and stops when the session ends;
:func:`start_redis` starts a private one for a test that kills it. The servers
require a password, as users' servers do, so that tests can check it never shows.

A test that needs the server fails under ``CI=true`` when ``redis-server`` is
missing or cannot start, and skips locally with the reason.
"""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import unavailable

PASSWORD = "s3cret-Redis-pw"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    # A session killed by its timeout skips every teardown: the server must not outlive it.
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class RedisServer:
    """One ``redis-server`` process without persistence; ``url`` carries its password."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("no redis-server on PATH (apt-get install redis-server)")
        self._root = Path(tempfile.mkdtemp(prefix="tbl-redis-"))
        self.port = _free_port()
        self._argv = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                      "--appendonly", "no", "--dir", str(self._root), "--requirepass", PASSWORD,
                      "--logfile", str(self._root / "log")]
        self._process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://:{PASSWORD}@127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self._process = subprocess.Popen(self._argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         preexec_fn=_die_with_parent)
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2) as s:
                s.sendall(f"AUTH {PASSWORD}\r\nPING\r\n".encode())
                if b"PONG" in s.recv(100):
                    return
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start: {(self._root / 'log').read_text()[-500:]}")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL: every connection drops, nothing is saved."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def flush(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), 2) as s:
            s.sendall(f"AUTH {PASSWORD}\r\nFLUSHALL\r\n".encode())
            s.recv(100)

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self._root, ignore_errors=True)


def start_redis() -> RedisServer:
    """A new server (fails under CI, skips locally, if it cannot start); the caller closes it."""
    try:
        return RedisServer()
    except Exception as exc:  # reported as the skip/failure reason
        unavailable(f"Redis test server unavailable: {exc}")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """The session's server, emptied by each test that asks for :func:`redis_url`."""
    server = start_redis()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    redis_server.flush()
    return redis_server.url
