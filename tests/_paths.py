"""Where the test tree lives: tests in folders reach the shared data, children and the repository by these."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
"""The tests/ folder: child scripts, servers, simulators and data live here, shared by every folder."""
ROOT = TESTS.parent
"""The repository."""
DATA = TESTS / "data"
