"""Issue 31, point 10: ``export CHECKPOINT OUT`` never overwrites what it reads, nor a checkpoint of ours,
and its table gets the mode the umask gives (as the checkpoints do).

OUT may not be CHECKPOINT or ``--prompts INPUT`` (by name, through a symbolic link or a hard link),
nor an existing checkpoint (a JSONL one, by its header line; a SQLite file). Each refusal is one line,
exit status 2, and leaves every file as it was, byte for byte.
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


def _jsonl_checkpoint(path: Path) -> Path:
    anyio.run(write_checkpoint, JsonlArtifactStore(path, identity=IDENTITY))
    return path


def _sqlite_checkpoint(path: Path) -> Path:
    anyio.run(write_checkpoint, SqliteArtifactStore(path, identity=IDENTITY))
    return path


def _prompts(path: Path) -> Path:
    path.write_text('{"id": "a", "prompt": "one"}\n{"id": "b", "prompt": "two"}\n')
    return path


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and not p.is_symlink()}


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], expected: str) -> None:
    code = main(argv)
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trio-batch-llm: error: OUT "), output
    assert expected in lines[0], lines[0]


@pytest.mark.parametrize("case", [
    "out-is-the-prompts", "out-links-to-the-prompts", "out-hard-links-the-prompts",
    "out-links-to-the-checkpoint", "out-hard-links-the-checkpoint",
    "out-is-another-jsonl-checkpoint", "out-is-another-sqlite-checkpoint", "out-links-to-a-checkpoint",
])
def test_export_refuses_an_out_it_would_destroy(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                case: str) -> None:
    checkpoint = _jsonl_checkpoint(tmp_path / "results.jsonl")
    prompts = _prompts(tmp_path / "prompts.jsonl")
    out: Path
    expected = "is the --prompts input"
    if case == "out-is-the-prompts":
        out = prompts
    elif case == "out-links-to-the-prompts":
        out = tmp_path / "table.jsonl"
        out.symlink_to(prompts)
    elif case == "out-hard-links-the-prompts":
        out = tmp_path / "table.jsonl"
        os.link(prompts, out)
    elif case == "out-links-to-the-checkpoint":
        out, expected = tmp_path / "table.jsonl", "is the checkpoint"
        out.symlink_to(checkpoint)
    elif case == "out-hard-links-the-checkpoint":
        out, expected = tmp_path / "table.jsonl", "is the checkpoint"
        os.link(checkpoint, out)
    elif case == "out-is-another-jsonl-checkpoint":
        out, expected = _jsonl_checkpoint(tmp_path / "older.jsonl"), "is a trio-batch-llm checkpoint"
    elif case == "out-is-another-sqlite-checkpoint":
        out, expected = _sqlite_checkpoint(tmp_path / "older.jsonl"), "is a SQLite database"
    else:
        older = _jsonl_checkpoint(tmp_path / "older.jsonl")
        out, expected = tmp_path / "table.jsonl", "is a trio-batch-llm checkpoint"
        out.symlink_to(older)
    before = _snapshot(tmp_path)
    _refused(capsys, ["export", str(checkpoint), str(out), "--prompts", str(prompts)], expected)
    assert _snapshot(tmp_path) == before  # every input untouched, byte for byte; no temporary file left


def test_export_still_replaces_a_table_it_wrote(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    checkpoint = _jsonl_checkpoint(tmp_path / "results.jsonl")
    table = tmp_path / "table.csv"
    table.write_text("an older table\n")
    assert main(["export", str(checkpoint), str(table)]) == 0
    assert table.read_text().startswith("id,success,")
    assert main(["export", str(checkpoint), str(table)]) == 0  # and again: a table is not a checkpoint
    capsys.readouterr()


_UMASK_CHILD = """
import os, sys, anyio
from pathlib import Path
sys.path.insert(0, {root!r})
os.umask(int(sys.argv[1], 8))
from tests.cli.test_export_paths import _jsonl_checkpoint
from trio_batch_llm.cli import main
folder = Path(sys.argv[2])
checkpoint = _jsonl_checkpoint(folder / "results.jsonl")
for name in ("table.csv", "table.jsonl", "table.parquet"):
    assert main(["export", str(checkpoint), str(folder / name)]) == 0
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")
@pytest.mark.parametrize("umask", ["022", "002", "077"])
def test_export_tables_get_the_mode_the_umask_gives(tmp_path: Path, umask: str) -> None:
    root = str(ROOT)
    child = subprocess.run([sys.executable, "-c", _UMASK_CHILD.format(root=root), umask, str(tmp_path)],
                           capture_output=True, text=True, timeout=60, check=False)
    assert child.returncode == 0, child.stderr
    expected = 0o666 & ~int(umask, 8)
    checkpoint_mode = (tmp_path / "results.jsonl").stat().st_mode & 0o777
    for name in ("table.csv", "table.jsonl", "table.parquet"):
        mode = (tmp_path / name).stat().st_mode & 0o777
        assert mode == expected, (name, oct(mode), oct(expected))
        # The JSONL checkpoint asks for 0o644 (so a umask of 002 still leaves it 0o644): where the umask
        # takes no more than that away, table and checkpoint agree.
        if umask != "002":
            assert mode == checkpoint_mode, (name, oct(mode), oct(checkpoint_mode))


def test_the_help_says_what_out_may_not_be() -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    text = subparsers.choices["export"].format_help()  # type: ignore[attr-defined]
    flat = " ".join(text.split())
    assert "never CHECKPOINT, --prompts INPUT or another checkpoint" in flat
    assert "umask" in flat
