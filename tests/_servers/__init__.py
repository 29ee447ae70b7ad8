"""Real servers the test session starts on loopback (one module per server)."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def unavailable(reason: str) -> NoReturn:
    """A server a test needs could not start: a failure under ``CI=true``, a skip with the reason locally."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)
