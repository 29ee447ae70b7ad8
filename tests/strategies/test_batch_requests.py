"""The Batch API connections' shared plumbing (``_strategies/_batch_requests``): kept files, lent clients.

No network: every request here is refused before it is sent, or never made.
"""

from __future__ import annotations

from typing import Any

import pytest

from trio_batch_llm import ErrorCategory, ProviderError
from trio_batch_llm._strategies._batch_requests import BatchRequests, KeptRequestFiles
from trio_batch_llm._strategies._keys import Secret
from trio_batch_llm._strategies.anthropic._batch_api import AnthropicBatchConnection
from trio_batch_llm._strategies.gemini._batch_api import GeminiBatchConnection
from trio_batch_llm._strategies.openai._batch_api import OpenAIBatchConnection

pytestmark = pytest.mark.anyio


class FakeClient:
    """Stands for an HTTP client a caller lends: it must never be closed by the connection."""

    def __init__(self) -> None:
        self.closed = 0

    async def aclose(self) -> None:
        self.closed += 1


class FakeStrategy:
    """What the three batch connections read of a strategy."""

    base_url = "http://127.0.0.1:9/v1"
    model = "m"
    api = "chat"

    def __init__(self, client: Any = None) -> None:
        self._client = client

    @property
    def secret(self) -> Secret | None:
        return Secret("sk-test-key")

    def request_headers(self) -> dict[str, str]:
        return {"authorization": "Bearer sk-test-key"}

    def http_client(self) -> Any:
        return self._client

    def request_body(self, prompt: Any) -> dict[str, Any]:
        return {}


async def test_kept_files_answer_what_was_kept_until_dropped(anyio_backend: str) -> None:
    files = KeptRequestFiles()
    first = await files.keep("a.jsonl", b"one\n")
    second = await files.keep("a.jsonl", b"two\n")
    assert first != second
    assert (files.get(first), files.get(second)) == (b"one\n", b"two\n")
    files.drop(first)
    with pytest.raises(ProviderError, match=f"no request file {first!r} in this connection") as caught:
        files.get(first)
    assert caught.value.category is ErrorCategory.INVALID_REQUEST
    assert files.get(second) == b"two\n"


@pytest.mark.parametrize("connection", [AnthropicBatchConnection, GeminiBatchConnection])
async def test_inline_connections_refuse_an_unknown_request_file(anyio_backend: str, connection: Any) -> None:
    tags: tuple[Any, ...] = ({},) if connection is AnthropicBatchConnection else ()
    api = connection(FakeStrategy(), *tags, request_timeout=5.0, start_before=float("inf"))
    try:
        kept = await api.upload("r.jsonl", b"")
        with pytest.raises(ProviderError, match="no request file 'local-9-x' in this connection"):
            await api.create("local-9-x", completion_window="24h", metadata={"k": "v"})
        assert kept == "local-1-r.jsonl"
    finally:
        await api.aclose()


async def test_a_borrowed_client_is_never_closed(anyio_backend: str) -> None:
    lent = FakeClient()
    def error_of(status: int, body: Any, headers: Any) -> ProviderError:
        return ProviderError("x", category=ErrorCategory.INVALID_REQUEST)

    requests = BatchRequests(base_url="http://127.0.0.1:9", headers={}, secret=None, error_of=error_of,
                             request_timeout=1.0, start_before=float("inf"), client=lent)
    await requests.aclose()
    api = OpenAIBatchConnection(FakeStrategy(lent), "/v1/chat/completions", request_timeout=1.0,  # type: ignore[arg-type]
                                start_before=float("inf"))
    await api.aclose()
    assert lent.closed == 0
