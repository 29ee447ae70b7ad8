"""``dev.py`` installs quietly: pip's own output is shown only when an install fails."""

from __future__ import annotations

import importlib.util
import stat
from pathlib import Path
from types import ModuleType

import pytest

from .._paths import ROOT

NOISE = "WARNING: Location 'file:///opt/extra/simple/pip/' is ignored: it is neither a file nor a directory."


def _dev() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dev_script_under_test", ROOT / "dev.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fake_python(tmp_path: Path, exit_code: int) -> Path:
    """An interpreter stand-in that prints what pip prints on a machine with extra indexes."""
    script = tmp_path / "python"
    script.write_text(
        "#!/bin/sh\n"
        f'i=0; while [ $i -lt 33 ]; do echo "{NOISE}" >&2; echo "Looking in indexes: x"; i=$((i+1)); done\n'
        f"exit {exit_code}\n",
        encoding="utf-8",
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _point_at(dev: ModuleType, monkeypatch: pytest.MonkeyPatch, python: Path, tmp_path: Path) -> None:
    monkeypatch.setattr(dev, "PYTHON", python)
    monkeypatch.setattr(dev, "STAMP", tmp_path / ".installed")


def test_a_successful_install_prints_only_its_own_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    dev = _dev()
    _point_at(dev, monkeypatch, _fake_python(tmp_path, 0), tmp_path)
    dev._ensure_env()
    out, err = capfd.readouterr()
    assert NOISE not in out + err
    assert "Looking in indexes" not in out + err
    assert out.splitlines() == ["dev.py: installing trio-batch-llm[dev] (first run only)"]
    assert err == ""
    assert (tmp_path / ".installed").exists()


def test_a_failed_install_shows_pips_output_and_exits_non_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    dev = _dev()
    _point_at(dev, monkeypatch, _fake_python(tmp_path, 3), tmp_path)
    with pytest.raises(SystemExit) as stopped:
        dev._ensure_env()
    assert stopped.value.code == 3
    out, err = capfd.readouterr()
    assert (out + err).count(NOISE) == 33  # everything pip said, once
    assert "dev.py: pip install failed (exit 3)" in err
    assert not (tmp_path / ".installed").exists()


def test_every_install_path_goes_through_the_quiet_helper() -> None:
    """demo, test, lint, docs and matrix all install through one helper, so none passes pip's noise on."""
    source = (ROOT / "dev.py").read_text(encoding="utf-8")
    assert source.count('"-m", "pip"') == 1, "pip is run from more than one place in dev.py"
    assert "check=True" not in source, "an install outside the helper would print pip's output"
