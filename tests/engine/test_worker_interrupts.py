"""A ``KeyboardInterrupt`` or ``SystemExit`` raised inside the work reaches the caller (issue 31).

CONTRACT C6.4 and C7: the terminal records it and the call that owns the worker
re-raises it, with its type (and exit code), after the ordered close, on both
backends. On asyncio it used to leave the event loop itself (``asyncio.run`` raised
it; ``main``'s own ``except KeyboardInterrupt`` never ran).

Each backend runs every scenario of ``tests/_interrupt_child.py`` in one child
process (an interrupt that escapes the loop must not end this session's).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from .._interrupt_child import scenarios
from .._paths import ROOT

_RUNS: dict[str, dict[tuple[str, str, str], dict[str, Any]]] = {}


def outcomes(backend: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    if backend not in _RUNS:
        done = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "_interrupt_child.py"), backend],
            capture_output=True, text=True, timeout=240, check=False,
        )
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        _RUNS[backend] = {(d["surface"], d["place"], d["kind"]): d for d in lines}
        assert len(_RUNS[backend]) == len(scenarios()), done.stderr[-3000:]
    return _RUNS[backend]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize(("surface", "place", "kind"), scenarios(), ids=["-".join(s) for s in scenarios()])
def test_the_owner_reraises_it_after_the_ordered_close(
    backend: str, surface: str, place: str, kind: str
) -> None:
    outcome = outcomes(backend)[(surface, place, kind)]
    assert outcome.get("escaped") is None, f"{kind} left the event loop: main's handler never ran"
    assert outcome["caught"] == kind
    if kind == "SystemExit":
        assert outcome["code"] == 3
    # Raised once; the strategy's cleanup (the ordered close's strategy phase) ran before main's handler.
    assert outcome["events"] == [f"raise in {place}", "cleanup", "caught"]
