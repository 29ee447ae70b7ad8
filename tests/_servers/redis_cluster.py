"""A real 3-node Redis Cluster for the tests: three ``redis-server --cluster-enabled yes`` on loopback.

Each node runs in its own temporary folder on a random port (its cluster bus on
that port + 10000), dies with the test process, and requires the same password
as :mod:`.redis`'s server. ``redis-cli --cluster create`` joins them with no
replicas (slots 0-5460, 5461-10922, 10923-16383), and the fixture waits until
every node says ``cluster_state:ok``. One cluster per test module
(:func:`redis_cluster`), emptied by each test that asks for :func:`cluster_url`.

The helpers (:meth:`RedisClusterServers.command`, :meth:`~RedisClusterServers.move_slot`, ...) talk to a node
through ``redis-cli`` with the password in ``REDISCLI_AUTH``, never on a command line.

A test that needs the cluster fails under ``CI=true`` when ``redis-server`` or
``redis-cli`` (package redis-tools) is missing or the cluster cannot form, and
skips locally with the reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import unavailable
from .redis import PASSWORD, _die_with_parent, _free_port

_BUS_OFFSET = 10000  # a node's cluster bus listens on its port + 10000


def _free_node_port(taken: set[int]) -> int:
    """A free port whose bus port (+ 10000) is free too."""
    for _ in range(200):
        port = _free_port()
        bus = port + _BUS_OFFSET
        if bus > 65535 or port in taken or bus in taken:
            continue
        with contextlib.suppress(OSError), socket.socket() as s:
            s.bind(("127.0.0.1", bus))
            return port
    raise RuntimeError("no free port pair (port, port + 10000) on loopback")


class RedisClusterServers:
    """Three master nodes without persistence; ``url`` names the first one (the seed) with the password."""

    def __init__(self) -> None:
        server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if server is None:
            raise RuntimeError("no redis-server on PATH (apt-get install redis-server)")
        if cli is None:
            raise RuntimeError("no redis-cli on PATH (apt-get install redis-tools)")
        self._cli = cli
        self._env = {**os.environ, "REDISCLI_AUTH": PASSWORD}
        self._root = Path(tempfile.mkdtemp(prefix="tbl-redis-cluster-"))
        self._processes: list[subprocess.Popen[bytes]] = []
        self.ports: list[int] = []
        try:
            taken: set[int] = set()
            for _ in range(3):
                port = _free_node_port(taken)
                taken |= {port, port + _BUS_OFFSET}
                self.ports.append(port)
                self._start_node(server, port)
            for port in self.ports:
                self._wait_for_ping(port)
            created = subprocess.run(
                [cli, "--cluster", "create", *(f"127.0.0.1:{port}" for port in self.ports),
                 "--cluster-replicas", "0", "--cluster-yes"],
                capture_output=True, text=True, timeout=60, env=self._env,
            )
            if created.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {created.stdout[-500:]}"
                                   f"{created.stderr[-500:]}")
            self._wait_until_ok()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return f"redis://:{PASSWORD}@127.0.0.1:{self.ports[0]}/0"

    def _start_node(self, binary: str, port: int) -> None:
        folder = self._root / str(port)
        folder.mkdir()
        argv = [binary, "--cluster-enabled", "yes", "--cluster-config-file",
                str(folder / f"nodes-{port}.conf"), "--port", str(port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no",
                "--dir", str(folder), "--requirepass", PASSWORD, "--masterauth", PASSWORD,
                "--logfile", str(folder / "log")]
        self._processes.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                                preexec_fn=_die_with_parent))

    def _log_tail(self, port: int) -> str:
        with contextlib.suppress(OSError):
            return (self._root / str(port) / "log").read_text()[-500:]
        return ""

    def _wait_for_ping(self, port: int) -> None:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2) as s:
                s.sendall(f"AUTH {PASSWORD}\r\nPING\r\n".encode())
                if b"PONG" in s.recv(100):
                    return
            if any(p.poll() is not None for p in self._processes) or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server (cluster node) did not start: {self._log_tail(port)}")
            time.sleep(0.02)

    def _wait_until_ok(self) -> None:
        deadline = time.monotonic() + 30
        while not all("cluster_state:ok" in self.command(port, "CLUSTER", "INFO") for port in self.ports):
            if time.monotonic() > deadline:
                raise RuntimeError("the Redis Cluster did not reach cluster_state:ok within 30 s")
            time.sleep(0.05)

    # -- helpers for tests -------------------------------------------------------

    def command(self, port: int, *args: str) -> str:
        """One command on one node (no redirection followed); its raw reply, one item a line."""
        done = subprocess.run([self._cli, "-h", "127.0.0.1", "-p", str(port), *args],
                              capture_output=True, text=True, timeout=30, env=self._env)
        reply = done.stdout.strip()
        if done.returncode != 0 or reply.startswith(("ERR", "MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN")):
            raise RuntimeError(f"redis-cli {args[0]} on {port} failed: {reply} {done.stderr.strip()}")
        return reply

    def keyslot(self, key: str) -> int:
        return int(self.command(self.ports[0], "CLUSTER", "KEYSLOT", key))

    def node_ids(self) -> dict[int, str]:
        return {port: self.command(port, "CLUSTER", "MYID") for port in self.ports}

    def owner(self, slot: int) -> int:
        """The port of the node that serves ``slot`` (as the first node sees the layout)."""
        for line in self.command(self.ports[0], "CLUSTER", "NODES").splitlines():
            fields = line.split()
            port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
            for part in fields[8:]:
                if part.startswith("["):
                    continue  # a slot being migrated or imported
                low, _, high = part.partition("-")
                if int(low) <= slot <= int(high or low):
                    return port
        raise RuntimeError(f"no node serves slot {slot}")

    def keys(self, port: int) -> set[str]:
        return set(self.command(port, "KEYS", "*").split())

    def begin_migration(self, slot: int, target: int) -> None:
        """Mark ``slot`` migrating from its node to ``target`` (as a reshard does first); no key moves yet."""
        ids, source = self.node_ids(), self.owner(slot)
        self.command(target, "CLUSTER", "SETSLOT", str(slot), "IMPORTING", ids[source])
        self.command(source, "CLUSTER", "SETSLOT", str(slot), "MIGRATING", ids[target])

    def finish_migration(self, slot: int, target: int) -> None:
        """Move the slot's keys to ``target`` and give it the slot on every node (the end of a reshard)."""
        ids, source = self.node_ids(), self.owner(slot)
        keys = self.command(source, "CLUSTER", "GETKEYSINSLOT", str(slot), "1000").split()
        if keys:
            self.command(source, "MIGRATE", "127.0.0.1", str(target), "", "0", "5000", "AUTH", PASSWORD,
                         "KEYS", *keys)
        for port in [target, source, *self.ports]:
            self.command(port, "CLUSTER", "SETSLOT", str(slot), "NODE", ids[target])

    def move_slot(self, slot: int, target: int) -> None:
        self.begin_migration(slot, target)
        self.finish_migration(slot, target)

    def flush(self) -> None:
        for port in self.ports:
            self.command(port, "FLUSHALL")

    def close(self) -> None:
        for process in self._processes:
            process.kill()
            process.wait()
        self._processes.clear()
        shutil.rmtree(self._root, ignore_errors=True)


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[RedisClusterServers]:
    """The module's cluster (fails under CI, skips locally, if it cannot start); stopped after the module."""
    try:
        cluster = RedisClusterServers()
    except Exception as exc:  # reported as the skip/failure reason
        unavailable(f"Redis Cluster test servers unavailable: {exc}")
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def cluster_url(redis_cluster: RedisClusterServers) -> str:
    redis_cluster.flush()
    return redis_cluster.url
