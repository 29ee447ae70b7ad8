"""The mock server in a separate process, so its CPU never shares the client's event loop.

    with MockServerProcess(record=True) as server:
        server.base_url          # http://127.0.0.1:PORT/v1
        server.stats()           # the server's counters (MockServerStats fields), plus
                                 # "last_arrival": time.monotonic() of the newest request,
                                 # "now" (time.monotonic()) and "wall" (time.time()) read together
        server.records()         # [[arrival, outcome, prompt_tokens], ...] of every completion
                                 # request (needs record=True)

``config`` (a dict of :class:`MockServerConfig` keyword arguments, JSON-able;
lists stand for tuples) sets the server's knobs.

The child calls ``trio_batch_llm.testing.run_mock_server`` on the asyncio
backend (so its request arrival times are ``time.monotonic()``, comparable with
the client's on Linux), prints its base URL once it listens, and answers one
JSON line of statistics for every ``stats`` line on its stdin (from a helper
thread: the counters are plain ints, read under the GIL). SIGTERM stops it
cleanly. Prompts carry the mock's markers (``[[hang]]``, ``[[latency:2]]``) to
choose each request's behaviour.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import threading
import time
from types import TracebackType
from typing import Any


class MockServerProcess:
    def __init__(self, *, record: bool = False, backend: str = "asyncio",
                 config: dict[str, Any] | None = None) -> None:
        self._args = [sys.executable, __file__, "--backend", backend] + (["--record"] if record else [])
        if config:
            self._args += ["--config", json.dumps(config)]
        self._proc: subprocess.Popen[str] | None = None
        self.base_url = ""
        self.port = 0
        self.pid = 0

    def __enter__(self) -> MockServerProcess:
        self._proc = subprocess.Popen(self._args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            self.__exit__(None, None, None)
            raise RuntimeError("the mock server process exited before it listened")
        ready = json.loads(line)
        self.base_url, self.port, self.pid = ready["base_url"], ready["port"], self._proc.pid
        return self

    def stats(self) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write("stats\n")
        self._proc.stdin.flush()
        return json.loads(self._proc.stdout.readline())  # type: ignore[no-any-return]

    def records(self) -> list[list[Any]]:
        assert self._proc is not None and self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write("records\n")
        self._proc.stdin.flush()
        return json.loads(self._proc.stdout.readline())  # type: ignore[no-any-return]

    def wait_until(self, predicate: Any, timeout: float = 10.0, interval: float = 0.005) -> dict[str, Any]:
        """Poll ``stats()`` (blocking: call it outside timed sections) until ``predicate(stats)``."""
        end = time.monotonic() + timeout
        while True:
            stats = self.stats()
            if predicate(stats) or time.monotonic() > end:
                return stats
            time.sleep(interval)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _serve(backend: str, record: bool, config: dict[str, Any]) -> None:
    from hypercorn.config import Config

    from trio_batch_llm.testing import MockServerConfig, run_mock_server

    # hypercorn calls listen(config.backlog) again on the socket it is handed, and its default
    # backlog is 100: a burst of 1,000 connections then overflows the accept queue (dropped SYNs
    # are retried after 1 s, 3 s, ...; some connections are reset). Serve with the backlog the
    # mock server meant (_mock_server._BACKLOG) until _mock_server sets config.backlog itself.
    Config.backlog = 1024

    def on_ready(server: Any) -> None:
        print(json.dumps({"base_url": server.base_url, "port": server.port}), flush=True)
        threading.Thread(target=_answer_stats, args=(server,), daemon=True).start()

    knobs = {k: _tuples(v) for k, v in config.items()}
    run_mock_server("127.0.0.1", 0, MockServerConfig(record_requests=record, **knobs), backend=backend,
                    on_ready=on_ready)


def _answer_stats(server: Any) -> None:
    for line in sys.stdin:
        if line.strip() == "records":
            from trio_batch_llm.mock._state import mock_token_count

            rows = [[r.arrival, r.outcome, mock_token_count(r.prompt)] for r in server.requests
                    if r.prompt is not None]
            print(json.dumps(rows), flush=True)
            continue
        if line.strip() != "stats":
            continue
        stats = dataclasses.asdict(server.stats)
        requests = server.requests
        stats["last_arrival"] = requests[-1].arrival if requests else None
        stats["now"] = time.monotonic()
        stats["wall"] = time.time()  # with "now": where the arrivals' clock stands on the wall clock
        print(json.dumps(stats), flush=True)


if __name__ == "__main__":
    knobs = json.loads(sys.argv[sys.argv.index("--config") + 1]) if "--config" in sys.argv else {}
    _serve(sys.argv[sys.argv.index("--backend") + 1], "--record" in sys.argv, knobs)
