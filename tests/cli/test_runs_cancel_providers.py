"""``runs cancel`` of an Anthropic or Gemini provider-batch run cancels its open batch through that
provider's own Batch API (issue 33), not through OpenAI's routes at ``--base-url``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from trio_batch_llm import ArtifactIdentity, ProviderBatchConfig, open_run
from trio_batch_llm._strategies.anthropic._strategy import AnthropicStrategy
from trio_batch_llm._strategies.gemini._strategy import GeminiStrategy
from trio_batch_llm.mock import MockServer, MockServerConfig, serve_mock

from .test_cli import ENV as CLI_ENV
from .test_cli import command as cli_command

pytestmark = pytest.mark.anyio

KEY = "provider-batch-key-0123456789"


def _strategy(provider: str, server: MockServer) -> Any:
    url = server.base_urls[provider]
    if provider == "anthropic":
        return AnthropicStrategy("claude-mock", base_url=url, api_key=KEY)
    return GeminiStrategy("gemini-mock", base_url=url, api_key=KEY)


def _open_batches(provider: str, server: MockServer) -> list[dict[str, Any]]:
    batches: list[dict[str, Any]] = getattr(server.app.provider_batches, provider).batches
    return batches


def _cancelled(provider: str, batch: dict[str, Any]) -> bool:
    if provider == "anthropic":
        ended = batch["processing_status"] in ("canceling", "ended")
        return ended and batch["cancel_initiated_at"] is not None
    return bool(batch["metadata"]["state"] == "BATCH_STATE_CANCELLED")


@pytest.mark.parametrize("provider", ["anthropic", "gemini"])
async def test_runs_cancel_cancels_the_open_batch_through_the_runs_own_provider(
    anyio_backend: str, tmp_path: Path, provider: str
) -> None:
    db = tmp_path / "runs.sqlite"
    identity = ArtifactIdentity(provider=provider, model="mock-model")
    async with serve_mock(MockServerConfig(batch_latency=3600.0, api_key=KEY)) as server:
        async with await open_run(db, "run", _strategy(provider, server), ["p0", "p1"],
                                  mode="provider-batch", identity=identity, poll_interval=0.05,
                                  batch=ProviderBatchConfig(poll_interval=0.05)) as run:
            with pytest.raises(TimeoutError):
                await run.wait(timeout=1)  # the batch is open at the provider; the handle lets go
        [batch] = _open_batches(provider, server)
        assert not _cancelled(provider, batch)
        argv = ["runs", "cancel", str(db), "run", "--base-url", server.base_urls[provider],
                "--api-key-env", "MY_KEY", "--backend", anyio_backend]
        with anyio.fail_after(60):
            done = await anyio.run_process(cli_command(*argv), env={**CLI_ENV, "MY_KEY": KEY}, check=False)
        output = done.stdout.decode() + done.stderr.decode()
        assert done.returncode == 0, output
        assert KEY not in output
        [batch] = _open_batches(provider, server)
        assert _cancelled(provider, batch), batch
        # Nothing went to OpenAI's Batch API on the way.
        assert not [r for r in server.requests if r.path.startswith("/v1/batches")]
