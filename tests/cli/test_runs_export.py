"""``runs export DB RUN_ID OUT`` never overwrites what it must keep, as ``export`` does (issue 31, point 10).

OUT may not be the run database (by name, through a symbolic or a hard link, or one of its SQLite
journal files), nor an existing checkpoint or run database of ours (a JSONL checkpoint by its header
line; any SQLite file). Each refusal is one line, exit status 2, and leaves every file as it was, byte
for byte. The table is written beside OUT under a fresh name (never a fixed ``OUT.partial`` that may be
someone's file) and gets the mode a new file gets: ``0o666`` less the umask.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from trio_batch_llm._artifacts import JsonlArtifactStore, SqliteArtifactStore
from trio_batch_llm._cli._main import build_parser
from trio_batch_llm.cli import main

from .._paths import ROOT
from .test_operator import IDENTITY, write_checkpoint
from .test_runs import RUN, make_run


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mode) for p in sorted(folder.iterdir())
            if p.is_file() and not p.is_symlink()}


def _export(capsys: pytest.CaptureFixture[str], db: Path, out: Path) -> tuple[int, list[str]]:
    code = main(["runs", "export", str(db), RUN, str(out)])
    captured = capsys.readouterr()
    return code, (captured.out + captured.err).strip().splitlines()


CASES = ["out-links-to-the-db", "out-hard-links-the-db", "out-is-the-db-wal", "out-is-the-db-journal",
         "out-is-another-run-database", "out-is-a-sqlite-checkpoint", "out-is-a-jsonl-checkpoint",
         "out-links-to-a-jsonl-checkpoint"]


@pytest.mark.parametrize("case", CASES)
def test_runs_export_refuses_an_out_it_would_destroy(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                     case: str) -> None:
    db = tmp_path / "runs.sqlite"
    make_run(db)
    out = tmp_path / "table.jsonl"
    expected = "is the run database"
    if case == "out-links-to-the-db":
        out.symlink_to(db)
    elif case == "out-hard-links-the-db":
        os.link(db, out)
    elif case == "out-is-the-db-wal":
        out, expected = tmp_path / "runs.sqlite-wal", "is a journal file of the run database"
    elif case == "out-is-the-db-journal":
        out, expected = tmp_path / "runs.sqlite-journal", "is a journal file of the run database"
    elif case == "out-is-another-run-database":
        make_run(out)
        expected = "is a SQLite database"
    elif case == "out-is-a-sqlite-checkpoint":
        anyio.run(write_checkpoint, SqliteArtifactStore(out, identity=IDENTITY))
        expected = "is a SQLite database"
    elif case == "out-is-a-jsonl-checkpoint":
        anyio.run(write_checkpoint, JsonlArtifactStore(out, identity=IDENTITY))
        expected = "is a trio-batch-llm checkpoint"
    else:
        older = tmp_path / "older.jsonl"
        anyio.run(write_checkpoint, JsonlArtifactStore(older, identity=IDENTITY))
        out.symlink_to(older)
        expected = "is a trio-batch-llm checkpoint"
    before = _snapshot(tmp_path)
    code, lines = _export(capsys, db, out)
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("trio-batch-llm: error: OUT "), lines
    assert expected in lines[0], lines[0]
    assert _snapshot(tmp_path) == before  # every file as it was; nothing new beside them


def test_runs_export_leaves_a_file_named_like_its_temporary_alone(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = tmp_path / "runs.sqlite"
    make_run(db)
    out = tmp_path / "table.jsonl"
    bystander = tmp_path / "table.jsonl.partial"  # the name the export once wrote through and renamed
    bystander.write_bytes(b"someone's notes\n")
    bystander.chmod(0o600)
    code, lines = _export(capsys, db, out)
    assert code == 0, lines
    assert bystander.read_bytes() == b"someone's notes\n" and bystander.stat().st_mode & 0o777 == 0o600
    assert out.read_bytes() == b""  # the run has no results yet
    left = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("runs.sqlite-"))  # SQLite's own
    assert left == ["runs.sqlite", "table.jsonl", "table.jsonl.partial"]  # no temporary file left
    # An existing table (not a checkpoint) is replaced, as before.
    out.write_text('{"sequence": 1, "result": {}}\n')
    assert _export(capsys, db, out)[0] == 0 and out.read_bytes() == b""


_UMASK_CHILD = """
import os, sys
from pathlib import Path
sys.path.insert(0, {root!r})
os.umask(int(sys.argv[1], 8))
from tests.cli.test_runs import RUN, make_run
from trio_batch_llm.cli import main
folder = Path(sys.argv[2])
make_run(folder / "runs.sqlite")
(folder / "old.jsonl").write_text("an older table\\n")
os.chmod(folder / "old.jsonl", 0o600)
for name in ("new.jsonl", "old.jsonl"):
    assert main(["runs", "export", str(folder / "runs.sqlite"), RUN, str(folder / name)]) == 0
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")
@pytest.mark.parametrize("umask", ["022", "002", "077"])
def test_runs_export_tables_get_the_mode_the_umask_gives(tmp_path: Path, umask: str) -> None:
    root = str(ROOT)
    child = subprocess.run([sys.executable, "-c", _UMASK_CHILD.format(root=root), umask, str(tmp_path)],
                           capture_output=True, text=True, timeout=60, check=False)
    assert child.returncode == 0, child.stderr
    expected = 0o666 & ~int(umask, 8)
    for name in ("new.jsonl", "old.jsonl"):
        mode = (tmp_path / name).stat().st_mode & 0o777
        assert mode == expected, (name, oct(mode), oct(expected))


def test_the_help_says_what_out_may_not_be() -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    runs = subparsers.choices["runs"]  # type: ignore[attr-defined]
    inner = next(a for a in runs._actions if a.__class__.__name__ == "_SubParsersAction")
    flat = " ".join(inner.choices["export"].format_help().split())
    assert "never the run database" in flat and "checkpoint" in flat
    assert "umask" in flat
