"""Static typing promises, checked by running mypy on small files under tests/typing/."""

from __future__ import annotations

from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")

HERE = Path(__file__).parent / "typing"


@pytest.mark.parametrize("path", sorted(HERE.glob("check_*.py")), ids=lambda p: p.name)
def test_typing_file(path: Path, tmp_path: Path) -> None:
    stdout, stderr, status = mypy_api.run(
        ["--strict", "--no-incremental", "--cache-dir", str(tmp_path), str(path)]
    )
    assert status == 0, stdout + stderr
