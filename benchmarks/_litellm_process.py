"""LiteLLM's proxy as a child process for the gateway benchmarks: started from a config, waited for
until it is live, stopped (terminate, then kill). Shared by gateway_litellm.py and conformance.py."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from pathlib import Path

__all__ = ["start_proxy", "stop_proxy"]

_READY_WITHIN = 180.0


def start_proxy(args: list[str], log_path: Path, root: str, master_key: str) -> subprocess.Popen[bytes]:
    """Start ``args`` (the ``litellm`` command line) logging to ``log_path``; return once ``root``
    answers its liveliness probe, or raise ``RuntimeError`` naming the log."""
    env = {**os.environ, "LITELLM_MASTER_KEY": master_key, "LITELLM_TELEMETRY": "False"}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + _READY_WITHIN
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the LiteLLM proxy exited: see {log_path}")
        try:
            with urllib.request.urlopen(f"{root}/health/liveliness", timeout=2):
                return proc
        except OSError:
            time.sleep(0.5)
    stop_proxy(proc)
    raise RuntimeError(f"the LiteLLM proxy did not come up in {_READY_WITHIN:.0f} s: see {log_path}")


def stop_proxy(proc: subprocess.Popen[bytes] | None) -> None:
    """Terminate the proxy (kill it after 10 s); nothing if it is gone already."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
