"""Issue 8: the CLI's input checks. Every bad input is reported before any call, with the file,
the line and the field, exit status 2, and no output file.

These run ``main()`` in-process and never reach the network (the ``--base-url`` points at a
closed port, so a check that let a run start would fail loudly).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_batch_llm import ArtifactIdentity
from trio_batch_llm._artifacts import JsonlArtifactStore
from trio_batch_llm._cli._input import InputError, InputRecord, read_input
from trio_batch_llm.cli import main

DEAD_URL = "http://127.0.0.1:9/v1"


def write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, str):
        text = text.encode()
    path.write_bytes(text)
    return path


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def run_args(source: Path, out: Path, *extra: str) -> list[str]:
    return ["run", str(source), "--model", "openai-compatible:m", "--base-url", DEAD_URL,
            "--out", str(out), *extra]


GOOD = '{"id": "a", "prompt": "one"}\n{"id": "b", "prompt": "two"}\n'

BAD_FILES: list[tuple[str, str, bytes, list[str]]] = [
    ("malformed-json", "in.jsonl", b'{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": \n',
     ["in.jsonl, line 2: invalid JSON: Expecting value"]),
    ("missing-prompt", "in.jsonl", b'{"id": "a", "prompt": "x"}\n\n{"id": "c", "context": "y"}\n',
     ['in.jsonl, line 3, field "prompt": missing']),
    ("unknown-key", "in.jsonl", b'{"id": "a", "prompt": "x"}\n\n{"id": "c", "text": "y"}\n',
     ['in.jsonl, line 3, field "text": unknown key']),
    ("missing-id", "in.jsonl", b'{"prompt": "x"}\n', ['in.jsonl, line 1, field "id": missing']),
    ("duplicate-id", "in.jsonl", b'{"id": "a", "prompt": "x"}\n"s"\n{"id": "a", "prompt": "y"}\n',
     ['in.jsonl, line 3, field "id": duplicate id \'a\' (first on line 1)']),
    ("generated-id-collides", "in.jsonl", b'"first"\n{"id": "item-0", "prompt": "y"}\n',
     ['in.jsonl, line 2, field "id": duplicate id \'item-0\' (first on line 1)']),
    ("empty-prompt", "in.jsonl", b'{"id": "a", "prompt": "  "}\n',
     ['in.jsonl, line 1, field "prompt": is empty']),
    ("prompt-not-a-string", "in.jsonl", b'{"id": "a", "prompt": 5}\n',
     ['in.jsonl, line 1, field "prompt": must be a string, not a number']),
    ("id-wrong-type", "in.jsonl", b'{"id": 1.5, "prompt": "x"}\n',
     ['in.jsonl, line 1, field "id": must be a string or an integer, not a fractional number']),
    ("not-an-object", "in.jsonl", b'"ok"\n[1, 2]\n',
     ['in.jsonl, line 2: expected an object with "id" and "prompt", or a string; found an array']),
    ("non-utf8", "in.jsonl", b'{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "caf\xe9"}\n',
     ["in.jsonl, line 2: not valid UTF-8 (byte 0xe9 at column 27)"]),
    ("empty-file", "in.jsonl", b"\n\n", ["in.jsonl: contains no prompts"]),
    ("csv-missing-column", "in.csv", b"id,text\na,hello\n",
     ['in.csv, line 1, field "prompt": missing column (the header has: id, text)']),
    ("csv-field-count", "in.csv", b'id,prompt\na,hello\nb,"multi\nline",extra\n',
     ["in.csv, line 3: expected 2 fields (id, prompt), found 3"]),
    ("csv-empty-id", "in.csv", b"id,prompt\na,x\n ,y\n", ['in.csv, line 3, field "id": is empty']),
    ("csv-duplicate-id", "in.csv", b"id,prompt\na,x\nb,y\na,z\n",
     ['in.csv, line 4, field "id": duplicate id \'a\' (first on line 2)']),
    ("csv-non-utf8", "in.csv", b"id,prompt\na,\xff\n",
     ["in.csv, line 2: not valid UTF-8 (byte 0xff at column 3)"]),
    ("csv-bad-quoting", "in.csv", b'id,prompt\na,"open\n', ["in.csv, line 2: malformed CSV"]),
    ("unknown-extension", "in.txt", b"hello\n", ["in.txt: cannot tell the format from the extension '.txt'"]),
]


@pytest.mark.parametrize(("name", "filename", "content", "expected"),
                         BAD_FILES, ids=[case[0] for case in BAD_FILES])
def test_bad_input_is_reported_before_anything_runs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, filename: str, content: bytes,
    expected: list[str],
) -> None:
    source = write(tmp_path / filename, content)
    out = tmp_path / "results.jsonl"
    code, output = run_cli(capsys, *run_args(source, out))
    assert code == 2, output
    for fragment in expected:
        assert f"trio-batch-llm: error: {source.parent}/{fragment}" in output
    assert not out.exists()


def test_missing_input_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    code, output = run_cli(capsys, *run_args(tmp_path / "nope.jsonl", out))
    assert code == 2 and f"{tmp_path}/nope.jsonl: no such file" in output
    assert not out.exists()


BAD_ARGS: list[tuple[str, list[str], str]] = [
    ("unknown-provider", ["--model", "mistral:large"],
     "argument --model: unknown provider 'mistral' in 'mistral:large'; "
     "known: openai-compatible, openai, anthropic, gemini, openrouter"),
    ("no-provider", ["--model", "gpt-4o"],
     "argument --model: expected openai-compatible:MODEL or openai:MODEL or anthropic:MODEL or "
     "gemini:MODEL or openrouter:MODEL, got 'gpt-4o'"),
    ("empty-model", ["--model", "openai-compatible:"], "argument --model: the model name after"),
    ("concurrency-zero", ["--concurrency", "0"],
     "argument --concurrency: expected a whole number >= 1, got '0'"),
    ("concurrency-text", ["--concurrency", "lots"],
     "argument --concurrency: expected a whole number >= 1, got 'lots'"),
    ("rpm-negative", ["--rpm", "-5"], "argument --rpm: expected a number > 0, got '-5'"),
    ("tpm-fraction", ["--tpm", "1.5"], "argument --tpm: expected a whole number >= 1, got '1.5'"),
    ("attempt-timeout-nan", ["--attempt-timeout", "nan"],
     "argument --attempt-timeout: expected a number > 0, got 'nan'"),
    ("batch-timeout-inf", ["--batch-timeout", "inf"],
     "argument --batch-timeout: expected a number > 0, got 'inf'"),
    ("backend", ["--backend", "curio"], "argument --backend: invalid choice: 'curio'"),
]


@pytest.mark.parametrize(("name", "extra", "expected"), BAD_ARGS, ids=[case[0] for case in BAD_ARGS])
def test_bad_arguments_are_reported_by_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, extra: list[str], expected: str
) -> None:
    source = write(tmp_path / "in.jsonl", GOOD)
    out = tmp_path / "results.jsonl"
    code, output = run_cli(capsys, *run_args(source, out), *extra)
    assert code == 2, output
    assert expected in output
    assert not out.exists()


def test_existing_output_needs_resume(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = write(tmp_path / "in.jsonl", GOOD)
    out = write(tmp_path / "results.jsonl", '{"kind": "header"}\n')
    code, output = run_cli(capsys, *run_args(source, out))
    assert code == 2
    assert f"--out {out} already exists and is not empty: pass --resume" in output
    assert out.read_text() == '{"kind": "header"}\n'


@pytest.mark.parametrize(("extra", "expected"), [
    (["--base-url", "ftp://x"], "base_url='ftp://x': must be an http:// or https:// URL"),
    (["--out", "{tmp}/missing-dir/results.jsonl"], "the directory {tmp}/missing-dir does not exist"),
    (["--out", "{tmp}/in.jsonl"], "is the input file"),
])
def test_other_usage_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: list[str], expected: str
) -> None:
    source = write(tmp_path / "in.jsonl", GOOD)
    extra = [arg.replace("{tmp}", str(tmp_path)) for arg in extra]
    code, output = run_cli(capsys, *run_args(source, tmp_path / "results.jsonl"), *extra)
    assert code == 2
    assert expected.replace("{tmp}", str(tmp_path)) in output
    assert not (tmp_path / "results.jsonl").exists()


def test_resume_refuses_a_file_written_for_another_model(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    source = write(tmp_path / "in.jsonl", GOOD)
    out = tmp_path / "results.jsonl"

    async def create() -> None:
        async with JsonlArtifactStore(out, identity=ArtifactIdentity("openai-compatible", "old-model")):
            pass

    anyio.run(create)
    before = out.read_bytes()
    code, output = run_cli(capsys, *run_args(source, out), "--resume")
    assert code == 2, output
    # The command line's terms: the flag that continues the file, not the Python argument the
    # library's own message suggests (allow_identity_mismatch=True).
    assert (f"trio-batch-llm: error: --out {out} was written with --model openai-compatible:old-model, "
            "and this run is --model openai-compatible:m: pass --model openai-compatible:old-model to "
            "continue it, or choose another --out") in output
    assert "allow_identity_mismatch" not in output
    assert out.read_bytes() == before  # checked before anything was written


def test_openai_compatible_needs_a_base_url(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = write(tmp_path / "in.jsonl", GOOD)
    code, output = run_cli(capsys, "run", str(source), "--model", "openai-compatible:m",
                           "--out", str(tmp_path / "r.jsonl"))
    assert code == 2 and "--base-url is required with --model openai-compatible:m" in output


# --- what good input becomes -----------------------------------------------------------


def test_jsonl_objects_strings_contexts_and_bom(tmp_path: Path) -> None:
    source = write(tmp_path / "in.jsonl", "\ufeff" + "\n".join([
        '"first prompt"',
        '{"id": 7, "prompt": "int id", "context": {"k": [1, 2]}}',
        "",
        '{"id": "x", "prompt": "with ctx", "context": "plain"}',
        '"second prompt"',
    ]) + "\n")
    assert read_input(source) == [
        InputRecord("item-0", "first prompt", None, 1),
        InputRecord("7", "int id", {"k": [1, 2]}, 2),
        InputRecord("x", "with ctx", "plain", 4),
        InputRecord("item-3", "second prompt", None, 5),
    ]


def test_csv_extra_columns_become_context_and_fields_may_span_lines(tmp_path: Path) -> None:
    source = write(tmp_path / "in.csv", '\ufeffid, prompt ,lang\r\na,"hello, world",en\r\n\r\n'
                                         'b,"two\nlines",fr\r\nc,"say ""hi""",de\r\n')
    assert read_input(source) == [
        InputRecord("a", "hello, world", {"lang": "en"}, 2),
        InputRecord("b", "two\nlines", {"lang": "fr"}, 4),
        InputRecord("c", 'say "hi"', {"lang": "de"}, 6),
    ]
    plain = write(tmp_path / "plain.csv", "id,prompt\nq,p\n")
    assert read_input(plain) == [InputRecord("q", "p", None, 2)]


def test_input_error_carries_its_location(tmp_path: Path) -> None:
    source = write(tmp_path / "in.jsonl", '{"id": "a"}\n')
    with pytest.raises(InputError) as caught:
        read_input(source)
    error = caught.value
    assert (error.path, error.line, error.field, error.problem) == (str(source), 1, "prompt", "missing")


_chars = st.characters(codec="utf-8", exclude_categories=["Cs"])
ids = st.text(_chars, min_size=1, max_size=8).filter(str.strip)
prompts = st.text(_chars, min_size=1, max_size=30).filter(str.strip)
contexts = (st.none() | st.integers() | st.text(max_size=5)
            | st.dictionaries(st.text(max_size=3), st.booleans()))


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(ids, st.tuples(prompts, contexts), min_size=1, max_size=10))
def test_jsonl_round_trip(tmp_path_factory: pytest.TempPathFactory,
                          entries: dict[str, tuple[str, Any]]) -> None:
    path = tmp_path_factory.mktemp("rt") / "in.jsonl"
    lines = [json.dumps({"id": item_id, "prompt": prompt, "context": context})
             for item_id, (prompt, context) in entries.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    records = read_input(path)
    assert [(r.item_id, r.prompt, r.context) for r in records] == [
        (item_id, prompt, context) for item_id, (prompt, context) in entries.items()
    ]
    assert [r.line for r in records] == list(range(1, len(entries) + 1))
