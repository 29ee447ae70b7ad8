#!/usr/bin/env python3
"""Bootstrap and run: ``python3 dev.py demo|test|lint|docs|bench|matrix``.

``matrix`` runs the cancellation and cleanup suites on every other supported
Python found (3.12, 3.13 through pyenv), each in its own ``.venv-X.Y``.

Creates ``.venv`` beside this file on first use (only the standard library is
needed to start), installs the project with its development extras, and
reinstalls when ``pyproject.toml`` changes; pip's own output is shown only when an
install fails. Extra arguments pass through to
the command (for example ``python3 dev.py test -k cleanup``). The whole suite runs in
two pytest-xdist workers, a file per worker; naming test files runs them in one process.
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
    _pip_install(PYTHON, "--upgrade", "pip")
    _pip_install(PYTHON, "-e", f"{ROOT}[dev]")
    STAMP.write_text(wanted)


def _pip_install(python: Path, *args: str) -> None:
    """``pip install`` quietly: its output is kept, and shown only if the install fails.

    Even with ``--quiet`` pip prints warnings (one per package on a machine whose pip
    configuration names extra indexes that are missing), which would bury the command's own
    first line; on failure they are the explanation, so they are printed then, whole.
    """
    command = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        sys.stdout.write(done.stdout)
        sys.stderr.write(done.stderr)
        what = " ".join(args)
        print(f"dev.py: pip install failed (exit {done.returncode}): {what}", file=sys.stderr, flush=True)
        raise SystemExit(done.returncode)


MATRIX_TESTS = [
    "tests/core/test_with_cleanup.py",
    "tests/contract/test_cleanup_contract.py",
    "tests/core/test_deliveries.py",
    "tests/core/test_ledger.py",
    "tests/core/test_leases.py",
    "tests/engine/test_engine.py",
    "tests/engine/test_resilience.py",
]


def _find_python(version: str) -> Path | None:
    roots = [Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"]
    for root in roots:
        for candidate in sorted(root.glob(f"{version}*/bin/python3"), reverse=True):
            return candidate
    return None


def _matrix(rest: list[str]) -> int:
    status = 0
    for version in ("3.12", "3.13"):
        python = _find_python(version)
        if python is None:
            print(f"dev.py matrix: Python {version} not found; skipped", flush=True)
            continue
        env_dir = ROOT / f".venv-{version}"
        env_python = env_dir / "bin" / "python"
        if not env_python.exists():
            code = _run([str(python), "-m", "venv", str(env_dir)])
            if code:
                return code
        print(f"dev.py matrix: Python {version} ({python})", flush=True)
        _pip_install(env_python, "-e", f"{ROOT}[dev]")
        code = _run([str(env_python), "-m", "pytest", "-q", *MATRIX_TESTS, *rest])
        status = status or code
    return status


def _run(args: list[str]) -> int:
    return subprocess.run(args, cwd=ROOT).returncode


def _parallel(rest: list[str]) -> list[str]:
    # The whole suite mostly waits (child processes, worker threads, loopback servers), so two
    # pytest workers cut its time by a third or more on two cores; a file per worker keeps each
    # module's shared event loop and servers in one process. Naming tests, or `-n`: as asked.
    if any(not arg.startswith("-") or arg.startswith(("-n", "--numprocesses")) for arg in rest):
        return []
    return ["-n", "2", "--dist", "loadfile"]


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"demo", "test", "lint", "bench", "matrix", "docs"}:
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "matrix":
        return _matrix(rest)
    _ensure_env()
    if command == "demo":
        return _run([str(PYTHON), "-m", "trio_batch_llm", "demo", *rest])
    if command == "test":
        return _run([str(PYTHON), "-m", "pytest", *_parallel(rest), *rest])
    if command == "docs":
        _pip_install(PYTHON, "-e", f"{ROOT}[docs]")
        env_site = ROOT / "site"
        return _run([str(BIN / "mkdocs"), "build", "--strict", "--site-dir", str(env_site), *rest])
    if command == "bench":
        return _run([str(PYTHON), "benchmarks/run_all.py", *rest])
    checks = [
        [str(PYTHON), "-m", "ruff", "check", "src", "tests", "benchmarks", "docs"],
        [str(PYTHON), "-m", "mypy", "--strict", "src"],
        [str(PYTHON), "-m", "mypy", "--strict", "docs/examples", "tests/typing"],
        [
            str(PYTHON),
            "-m",
            "flake8_async",
            "--anyio",
            "--enable=ASYNC1,ASYNC2,ASYNC910,ASYNC911",
            "--disable=ASYNC102,ASYNC109,ASYNC124,ASYNC120",
            *sorted(str(p) for p in (ROOT / "src").rglob("*.py")),
        ],
    ]
    for check in checks:
        print(
            "dev.py lint:",
            " ".join(Path(a).name if a.startswith(str(ROOT)) else a for a in check[:4]),
            flush=True,
        )
        code = _run(check)
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
