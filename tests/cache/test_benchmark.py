"""``benchmarks/cache.py``'s harness, in miniature: a cold pass calls once per prompt, a warm one never.

The race section's harness (``tests/_cache_race_child.py``) is the one the shared-cache
race tests run (``test_cache_pg.py``, ``test_cache_redis.py``); here the warm section's pass,
through a SQLite cache against the mock, on both anyio backends.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from trio_batch_llm.testing import MockServerConfig, serve_mock

from .._paths import ROOT

pytestmark = pytest.mark.anyio

SCRIPT = ROOT / "benchmarks" / "cache.py"


def _benchmark() -> ModuleType:
    loaded = sys.modules.get("bench_cache")
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location("bench_cache", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_cache"] = module
    spec.loader.exec_module(module)
    return module


async def test_a_warm_pass_makes_no_provider_call(tmp_path: Path) -> None:
    bench = _benchmark()
    path = tmp_path / "cache.sqlite3"
    async with serve_mock(MockServerConfig()) as server:
        _, cached, failed = await bench.one_pass(server.base_url, path, 40, 8)
        cold_calls = server.stats.requests
        _, warm_cached, warm_failed = await bench.one_pass(server.base_url, path, 40, 8)
        warm_calls = server.stats.requests - cold_calls
    assert (cold_calls, cached, failed) == (40, 0, 0)
    assert (warm_calls, warm_cached, warm_failed) == (0, 40, 0)
