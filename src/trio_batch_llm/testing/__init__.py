"""Helpers for testing pipelines built on trio-batch-llm: the scripted fake, the mock server."""

from .._strategies._fake import FakeStrategy as FakeStrategy
from ._mock_app import MockOpenAIApp as MockOpenAIApp
from ._mock_server import MockServer as MockServer
from ._mock_server import run_mock_server as run_mock_server
from ._mock_server import serve_mock as serve_mock
from ._mock_state import MockServerConfig as MockServerConfig
from ._mock_state import MockServerStats as MockServerStats
from ._mock_state import RecordedRequest as RecordedRequest

__all__ = [
    "FakeStrategy",
    "MockOpenAIApp",
    "MockServer",
    "MockServerConfig",
    "MockServerStats",
    "RecordedRequest",
    "run_mock_server",
    "serve_mock",
]
