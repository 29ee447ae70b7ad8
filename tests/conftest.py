"""Shared fixtures: every behavioural test runs on both backends.

``anyio_backend`` is module-scoped (hypothesis rejects function-scoped
fixtures). Modules that assert exact times override it with
``virtual_time_backends`` below: Trio under ``MockClock(autojump_threshold=0)``.
"""

from __future__ import annotations

from typing import Any

import pytest

BACKENDS = [
    pytest.param("asyncio", id="asyncio"),
    pytest.param("trio", id="trio"),
]


@pytest.fixture(scope="module", params=BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


def trio_virtual_clock() -> Any:
    import trio.testing

    return ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})
