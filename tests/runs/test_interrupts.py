"""A ``KeyboardInterrupt`` or ``SystemExit`` raised inside a durable run reaches its caller (issue 31).

CONTRACT C6.4 and C7: the call that owns the work -- here ``Run.wait()`` -- re-raises
it, with its type (and exit code), after the ordered close, on both backends. On
asyncio one raised in a run's own tasks (the source reader, ingestion, the feeder)
left the event loop itself: ``asyncio.run`` raised it and ``main``'s own
``except KeyboardInterrupt`` never ran. As a Ctrl+C of ``runs start`` (docs/cli.md),
the interrupt stops this process's drive and leaves the run's status alone: it stays
``running``, nothing is marked failed, and a later ``wait()`` finishes it, each item
recorded once.

Each backend runs every scenario of ``tests/_runs_interrupt_child.py`` in one child
process (an interrupt that escapes the loop must not end this session's).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .._paths import ROOT
from .._runs_interrupt_child import ITEMS, scenarios

_RUNS: dict[str, dict[tuple[str, str, str], dict[str, Any]]] = {}


def outcomes(backend: str, root: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    if backend not in _RUNS:
        root.mkdir()
        done = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "_runs_interrupt_child.py"), backend, str(root)],
            capture_output=True, text=True, timeout=300, check=False,
        )
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        _RUNS[backend] = {(d["mode"], d["place"], d["kind"]): d for d in lines}
        assert len(_RUNS[backend]) == len(scenarios()), done.stderr[-3000:]
    return _RUNS[backend]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize(("mode", "place", "kind"), scenarios(), ids=["-".join(s) for s in scenarios()])
def test_wait_reraises_it_after_the_ordered_close(
    backend: str, mode: str, place: str, kind: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.getbasetemp() / f"runs-interrupts-{backend}"
    outcome = outcomes(backend, root)[(mode, place, kind)]
    assert outcome.get("escaped") is None, f"{kind} left the event loop: main's handler never ran"
    assert outcome["caught"] == kind
    if kind == "SystemExit":
        assert outcome["code"] == 3
    # Raised once; in live mode the strategy's cleanup (the segment processor's ordered close)
    # ran before main's handler. A provider-batch run has no processor.
    close = [] if mode == "batch" else ["cleanup"]
    assert outcome["events"] == [f"raise in {place}", *close, "caught"]
    # The interrupt stopped this drive only: the run was not failed, and it can be finished.
    assert outcome.get("db_error") is None
    assert (outcome["status"], outcome["termination"]) == ("running", None)
    if mode != "batch":
        assert outcome["resumed"] == "completed"
        assert (outcome["recorded"], outcome["recorded_twice"]) == (ITEMS, [])
