"""The OpenAI-compatible mock server: chat completions, responses, Files and Batch APIs.

A real server on 127.0.0.1 (hypercorn, under Trio or asyncio) with knobs for latency,
token counts, 429 + Retry-After, 5xx, hangs, resets and slow streams. The demo, the
tests and the benchmarks use it; so can yours (``pip install "trio-batch-llm[mock]"``).
"""

from ._app import MockOpenAIApp as MockOpenAIApp
from ._server import MockServer as MockServer
from ._server import run_mock_server as run_mock_server
from ._server import serve_mock as serve_mock
from ._state import MockServerConfig as MockServerConfig
from ._state import MockServerStats as MockServerStats
from ._state import RecordedRequest as RecordedRequest

__all__ = [
    "MockOpenAIApp",
    "MockServer",
    "MockServerConfig",
    "MockServerStats",
    "RecordedRequest",
    "run_mock_server",
    "serve_mock",
]
