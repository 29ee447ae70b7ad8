"""Helpers for testing pipelines built on trio-batch-llm: the scripted fake, and the mock server re-exported.

Every name of :mod:`trio_batch_llm.mock` is here too, so a test needs one import.
"""

from .. import mock as _mock
from .._compat._testing import FakeRateLimitError as FakeRateLimitError
from .._public import fixup_module_metadata as _fixup_module_metadata
from .._strategies._fake import FakeStrategy as FakeStrategy
from ..mock import MockOpenAIApp as MockOpenAIApp
from ..mock import MockServer as MockServer
from ..mock import MockServerConfig as MockServerConfig
from ..mock import MockServerStats as MockServerStats
from ..mock import RecordedRequest as RecordedRequest
from ..mock import run_mock_server as run_mock_server
from ..mock import serve_mock as serve_mock

# Every name of the mock, after the fake's (both sorted; test_exports checks the whole list).
__all__ = ["FakeRateLimitError", "FakeStrategy", *_mock.__all__]

_fixup_module_metadata(__name__, globals())
del _fixup_module_metadata
