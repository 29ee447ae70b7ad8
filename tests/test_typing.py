"""Static typing promises, checked by one mypy run over the small files in tests/typing/."""

from __future__ import annotations

from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")

HERE = Path(__file__).parent / "typing"


def test_typing_promises_hold(tmp_path: Path) -> None:
    files = sorted(str(p) for p in HERE.glob("check_*.py"))
    assert len(files) >= 2
    stdout, stderr, status = mypy_api.run(["--strict", "--cache-dir", str(tmp_path), *files])
    assert status == 0, stdout + stderr
