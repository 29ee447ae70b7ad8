#!/usr/bin/env python3
"""Bootstrap and run: ``python3 dev.py demo``, ``python3 dev.py test``, ``python3 dev.py lint``.

Creates ``.venv`` beside this file on first use (only the standard library is
needed to start), installs the project with its development extras, and
reinstalls when ``pyproject.toml`` changes. Extra arguments pass through to
the command (for example ``python3 dev.py test -k cleanup``).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".installed"


def _ensure_env() -> None:
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == wanted and PYTHON.exists():
        return
    if not PYTHON.exists():
        print(f"dev.py: creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    print("dev.py: installing trio-batch-llm[dev] (first run only)", flush=True)
    pip = [str(PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "-e", f"{ROOT}[dev]"], check=True)
    STAMP.write_text(wanted)


def _run(args: list[str]) -> int:
    return subprocess.run(args, cwd=ROOT).returncode


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"demo", "test", "lint", "bench"}:
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    _ensure_env()
    if command == "demo":
        return _run([str(PYTHON), "-m", "trio_batch_llm", "demo", *rest])
    if command == "test":
        return _run([str(PYTHON), "-m", "pytest", *rest])
    if command == "bench":
        return _run([str(PYTHON), "benchmarks/run_all.py", *rest])
    checks = [
        [str(PYTHON), "-m", "ruff", "check", "src", "tests", "benchmarks", "docs"],
        [str(PYTHON), "-m", "mypy", "--strict", "src"],
        [str(PYTHON), "-m", "flake8_async", "--anyio", "--enable=ASYNC1,ASYNC2,ASYNC910,ASYNC911",
         "--disable=ASYNC102,ASYNC109,ASYNC124,ASYNC120", *sorted(str(p) for p in (ROOT / "src").rglob("*.py"))],
    ]
    for check in checks:
        print("dev.py lint:", " ".join(Path(a).name if a.startswith(str(ROOT)) else a for a in check[:4]),
              flush=True)
        code = _run(check)
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
