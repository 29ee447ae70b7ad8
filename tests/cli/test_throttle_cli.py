"""``trio-batch-llm run`` against an endpoint that refuses every call (issue 32, point 3), on both backends.

``--max-rate-limit-wait`` ends each item ``rate_limit`` saying how long it waited; a
``--batch-timeout`` that cut throttled items says so in the summary, the first-failure
line and the checkpoint (which ``export`` writes out). Real time, kept to seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trio_batch_llm.testing import MockServerConfig, serve_mock

from .test_cli import MODEL, records, run_args, spawn, write_prompts

pytestmark = pytest.mark.anyio

ALWAYS_429 = MockServerConfig(model=MODEL, rate_limit_rate=1.0, retry_after=None)


async def test_run_ends_every_item_rate_limit_within_max_rate_limit_wait(anyio_backend: str,
                                                                           tmp_path: Path) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(source, 4)
    async with serve_mock(ALWAYS_429) as server:
        args = run_args(server, source, out, anyio_backend, "--concurrency", "4",
                        "--max-rate-limit-wait", "0.5")
        async with spawn(*args) as cli:
            pass
    output = cli.output
    assert "failures    rate_limit 4" in output, output
    assert "first rate_limit failure: item " in output and "max_rate_limit_wait=0.5 s" in output, output
    results = [r["result"] for r in records(out)]
    assert len(results) == 4
    assert all(r["error_category"] == "rate_limit" and "waited" in r["error"] for r in results), results


async def test_a_batch_timeout_that_cut_throttled_items_says_so(anyio_backend: str, tmp_path: Path) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(source, 4)
    async with serve_mock(ALWAYS_429) as server:
        args = run_args(server, source, out, anyio_backend, "--concurrency", "4", "--batch-timeout", "1.5",
                        "--max-rate-limit-wait", "none")
        async with spawn(*args) as cli:
            pass
    output = cli.output
    assert "throttled            4   cut short while 429s held them back" in output, output
    first = [line for line in output.splitlines() if "first deadline failure" in line]
    assert first and "s throttled by 429s" in first[0], output
    results = [r["result"] for r in records(out)]
    assert all(r["error_category"] == "deadline" for r in results), results
    assert all("throttled by 429s" in r["error"] for r in results), results


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
async def test_max_rate_limit_wait_must_be_positive_or_none(anyio_backend: str, tmp_path: Path,
                                                            value: str) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(source, 1)
    async with serve_mock(ALWAYS_429) as server:
        args = run_args(server, source, out, anyio_backend, "--max-rate-limit-wait", value)
        async with spawn(*args) as cli:
            pass
        assert server.stats.requests == 0
    assert cli.returncode == 2
    assert "--max-rate-limit-wait" in cli.output and "expected a number > 0 or none" in cli.output
