"""Through a real gateway (issue 32): our client behind LiteLLM's proxy, beside the same mock direct.

    python benchmarks/gateway_litellm.py [--items 400] [--rate 0.1] [--litellm PATH]

LiteLLM's proxy (``pip install 'litellm[proxy]'``; found on PATH, or ``--litellm``,
or ``$LITELLM_BIN``) is started in front of the project's mock server, which
answers a share ``--rate`` of calls 429 with ``Retry-After: 1`` and no rate-limit
headers. A gateway does not pass the provider's ``Retry-After`` on: LiteLLM
answers with ``llm_provider-retry-after`` (and ``-retry-after-ms``) instead, so
this shows whether the client finds the hint where a real gateway puts it.

For each route (``direct``, ``litellm``) and backend (trio, asyncio), one
``process_prompts`` run of ``--items`` prompts, library defaults otherwise:

- ``items_per_s``, ``succeeded``: every item should succeed (429s are retried);
- ``attempts``: all calls made, over the items;
- ``min_retry_wait_s``: the shortest wait before any retry (from the call
  that was refused to the next, ``WorkItemResult.timing.attempts``: admission
  wait, cooldown and backoff); a client that honours the 1 s hint never waits
  less than about 1 s;
- ``hint_honoured``: ``min_retry_wait_s`` at least 0.9 s.

The script skips (exit 0, and says so) when LiteLLM is not installed: it is a
check run by hand and by ``run_all.py``, not part of the test suite. Writes
``benchmarks/results/gateway_litellm.json``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import table, write_json
from _litellm_process import start_proxy, stop_proxy
from _mock_process import MockServerProcess

MASTER_KEY = "sk-bench-gateway-0123456789abcdef"  # the local proxy's own key; nothing secret
HINT = 1.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def find_litellm(explicit: str | None) -> str | None:
    for candidate in (explicit, os.environ.get("LITELLM_BIN"), shutil.which("litellm")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


class LiteLLMProxy:
    """LiteLLM's proxy in front of ``upstream`` (an OpenAI-compatible base URL), on a free port."""

    def __init__(self, binary: str, upstream: str, workdir: Path) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        config = workdir / "litellm.yaml"
        config.write_text(
            "model_list:\n"
            "  - model_name: mock-model\n"
            "    litellm_params:\n"
            "      model: openai/mock-model\n"
            f"      api_base: {upstream}\n"
            "      api_key: sk-upstream\n"
            "litellm_settings:\n  num_retries: 0\n"
            "router_settings:\n  num_retries: 0\n",
            encoding="utf-8",
        )
        self._args = [binary, "--config", str(config), "--host", "127.0.0.1", "--port", str(self.port)]
        self._log = workdir / "litellm.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LiteLLMProxy:
        self._proc = start_proxy(self._args, self._log, f"http://127.0.0.1:{self.port}", MASTER_KEY)
        return self

    def __exit__(self, *exc: object) -> None:
        stop_proxy(self._proc)


def run_client(base_url: str, api_key: str, backend: str, items: int) -> dict[str, Any]:
    """One process_prompts run, in this process (the proxy and the mock are other processes)."""
    import anyio

    from trio_batch_llm import OpenAICompatibleStrategy, ProcessorConfig, process_prompts

    prompts = [f"gateway item {i:05d}" for i in range(items)]
    strategy = OpenAICompatibleStrategy("mock-model", base_url=base_url, api_key=api_key, api_key_env=None)
    config = ProcessorConfig(concurrency=32, progress_interval=3600.0)

    async def main() -> Any:
        return await process_prompts(strategy, prompts, config=config)

    started = time.perf_counter()
    batch = anyio.run(main, backend=backend)
    wall = time.perf_counter() - started
    waits = [  # the wait before each retry: every retry here follows a 429
        a.admission_wait + a.cooldown + a.backoff for r in batch.results for a in r.timing.attempts[1:]
    ]
    min_wait = min(waits) if waits else None
    return {
        "items": items,
        "wall_s": wall,
        "items_per_s": items / wall,
        "succeeded": batch.succeeded,
        "attempts": sum(r.attempts for r in batch.results),
        "retried_items": sum(1 for r in batch.results if r.attempts > 1),
        "min_retry_wait_s": min_wait,
        "hint_honoured": "n/a" if min_wait is None else ("yes" if min_wait >= 0.9 * HINT else "no"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=400)
    parser.add_argument("--rate", type=float, default=0.1, help="share of calls the mock answers 429")
    parser.add_argument("--litellm", help="the litellm executable (default: $LITELLM_BIN, then PATH)")
    args = parser.parse_args()
    binary = find_litellm(args.litellm)
    if binary is None:
        print("skipped: LiteLLM's proxy is not installed (pip install 'litellm[proxy]', or --litellm PATH)")
        return 0
    mock = {"rate_limit_rate": args.rate, "retry_after": HINT, "latency": 0.02, "seed": 7}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, MockServerProcess(config=mock) as server, \
            LiteLLMProxy(binary, server.base_url, Path(tmp)) as proxy:
        for route, url, key in (("direct", server.base_url, "bench"), ("litellm", proxy.base_url, MASTER_KEY)):
            for backend in ("trio", "asyncio"):
                row = {"route": route, "backend": backend, **run_client(url, key, backend, args.items)}
                rows.append(row)
                print(f"{route:8} {backend:8} {row['items_per_s']:.1f} items/s", file=sys.stderr)
    headers = ["route", "backend", "items_per_s", "succeeded", "attempts", "retried_items", "min_retry_wait_s",
               "hint_honoured"]
    print(table(headers, [[row[h] for h in headers] for row in rows]))
    path = write_json("gateway_litellm", {"items": args.items, "rate_429": args.rate, "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
