"""A real PostgreSQL server for the test session: ``initdb`` + ``pg_ctl`` in a temporary folder.

Started on first use on a random loopback port and stopped when the session
ends. ``initdb`` refuses to run as root, so as root the server runs as the
``postgres`` user (or ``nobody``) through ``runuser``. The superuser has a
password (scram), so the URLs tests use carry one, as users' URLs do: tests
check that it never shows.

A test that needs the server fails under ``CI=true`` when the server cannot
start, and skips locally with the reason.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from . import unavailable

PASSWORD = "s3cret-Pg-pw"
USER = "tbl"


def _find_bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    return found[0] if found else shutil.which(name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One PostgreSQL cluster; ``url(db)`` names a database on it; ``new_database()`` makes one."""

    def __init__(self) -> None:
        initdb, pg_ctl = _find_bin("initdb"), _find_bin("pg_ctl")
        if initdb is None or pg_ctl is None:
            raise RuntimeError("no initdb/pg_ctl found (apt-get install postgresql)")
        self._pg_ctl = pg_ctl
        self._root = Path(tempfile.mkdtemp(prefix="tbl-pg-"))
        self.data = self._root / "data"
        self.port = _free_port()
        self._prefix: list[str] = []
        if os.geteuid() == 0:
            user = "postgres" if _has_user("postgres") else "nobody"
            self._prefix = ["runuser", "-u", user, "--"]
            shutil.chown(self._root, user)
        pwfile = self._root / "pw"
        pwfile.write_text(PASSWORD)
        if self._prefix:
            shutil.chown(pwfile, self._prefix[2])
        self._run([initdb, "-D", str(self.data), "-U", USER, "--auth=scram-sha-256",
                   f"--pwfile={pwfile}", "--no-sync", "-E", "UTF8", "--locale=C"])
        pwfile.unlink()
        self._counter = itertools.count(1)
        self.start()

    def _run(self, argv: list[str]) -> None:
        done = subprocess.run([*self._prefix, *argv], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {done.stdout}{done.stderr}")

    def start(self) -> None:
        options = (f"-p {self.port} -k {self._root} -c listen_addresses=127.0.0.1 -c fsync=off"
                   " -c full_page_writes=off -c max_connections=200")
        # fsync=off only risks an OS crash; commits still reach the WAL before they are acknowledged,
        # so restart() ("immediate": a crash of the server process) loses nothing committed.
        self._run([self._pg_ctl, "-D", str(self.data), "-l", str(self._root / "log"), "-o", options,
                   "-w", "-t", "60", "start"])

    def stop(self, mode: str = "fast") -> None:
        self._run([self._pg_ctl, "-D", str(self.data), "-m", mode, "-w", "stop"])

    def restart(self) -> None:
        """Stop (dropping every connection) and start again on the same port."""
        self.stop("immediate")
        self.start()

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        name = f"t{os.getpid()}_{next(self._counter)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self._root, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


_server: PostgresServer | None = None
_failure: str | None = None


def shared_server() -> PostgresServer:
    """The session's server (started on first use); fails under CI, skips locally, if it cannot start."""
    global _server, _failure
    if _server is None and _failure is None:
        try:
            import psycopg  # noqa: F401

            _server = PostgresServer()
        except Exception as exc:  # reported as the skip/failure reason
            _failure = f"PostgreSQL test server unavailable: {exc}"
    if _server is None:
        assert _failure is not None
        unavailable(_failure)
    return _server


@pytest.fixture(scope="session")
def postgres_server() -> PostgresServer:
    return shared_server()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A fresh database on the session's server."""
    return postgres_server.new_database()


def stop_shared_server() -> None:
    global _server
    if _server is not None:
        _server.close()
        _server = None
