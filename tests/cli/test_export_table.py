"""Issue 35, point 3: the table ``export`` writes, as a data person loads it with pandas and pyarrow.

Rows come in input order by default (``--prompts INPUT``'s order; without it the order each id was
first recorded), ``--order completion`` keeps the order of each id's last record; a CSV input's own
columns come back as columns with their types (numbers restored from the CSV's text); an object output
(``--response-schema``) is spread into ``output.<field>`` columns; ``--no-flatten`` keeps the old shape.

The export itself is synchronous (no event loop): only the end-to-end test, which runs ``run`` against
the mock server first, runs on both backends.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import anyio
import pandas as pd
import pyarrow.parquet as pq
import pytest

from trio_batch_llm import ArtifactIdentity, ErrorCategory, ItemTiming
from trio_batch_llm import WorkItemResult as Result
from trio_batch_llm._artifacts import JsonlArtifactStore, SqliteArtifactStore
from trio_batch_llm._cli._input import iter_input
from trio_batch_llm.cli import main
from trio_batch_llm.testing import MockServerConfig, serve_mock

from .test_cli import spawn

IDENTITY = ArtifactIdentity(provider="openai-compatible", model="mock-model")
FORMATS = ["jsonl", "csv", "parquet"]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def result(item_id: str, *, success: bool = True, output: Any = None, context: Any = None) -> Result[Any]:
    return Result(item_id=item_id, success=success, output=output, context=context, attempts=1,
                  error=None if success else "boom", error_category=None if success else ErrorCategory.SERVER,
                  token_usage={"input_tokens": 7, "output_tokens": 2, "total_tokens": 9} if success else {},
                  timing=ItemTiming(execution=0.25))


def write_checkpoint(path: Path, results: list[Result[Any]]) -> Path:
    kind = SqliteArtifactStore if path.suffix == ".sqlite" else JsonlArtifactStore
    store: Any = kind(path, identity=IDENTITY)

    async def write() -> None:
        async with store:
            for item in results:
                await store.append(item, fingerprint="f")

    anyio.run(write)
    return path


def load(table: Path) -> pd.DataFrame:
    """The table as pandas reads it, each format with pandas' own reader."""
    if table.suffix == ".parquet":
        return pd.read_parquet(table)
    if table.suffix == ".csv":
        return pd.read_csv(table, keep_default_na=True)
    return pd.read_json(table, lines=True, dtype=False)


@pytest.fixture(params=["jsonl", "sqlite"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# --- order ----------------------------------------------------------------------------------------------

# Written as a run with a resume writes them: c finished first, a failed then succeeded on the resume.
SHUFFLED = [result("c"), result("a", success=False), result("b"), result("d"), result("a")]
INPUT_IDS = ["a", "b", "c", "d"]
FIRST_RECORDED = ["c", "a", "b", "d"]
COMPLETION = ["c", "b", "d", "a"]  # the order of each id's last record


def _prompts(tmp_path: Path, ids: list[str]) -> Path:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": i, "prompt": f"prompt of {i}"}) + "\n" for i in ids))
    return source


@pytest.mark.parametrize("kind", FORMATS)
def test_rows_follow_the_input_by_default(capsys: pytest.CaptureFixture[str], tmp_path: Path, store_kind: str,
                                          kind: str) -> None:
    checkpoint = write_checkpoint(tmp_path / f"results.{store_kind}", SHUFFLED)
    table = tmp_path / f"table.{kind}"
    code, err = run_cli(capsys, "export", str(checkpoint), str(table), "--prompts",
                        str(_prompts(tmp_path, INPUT_IDS)))
    assert code == 0, err
    frame = load(table)
    assert list(frame["id"]) == INPUT_IDS
    assert list(frame["prompt"]) == [f"prompt of {i}" for i in INPUT_IDS]
    assert list(frame["success"]) == [True, True, True, True]  # a's last record won
    assert "first recorded" not in err


def test_ids_missing_from_the_input_come_after_it_in_first_recorded_order(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, store_kind: str) -> None:
    checkpoint = write_checkpoint(tmp_path / f"results.{store_kind}", SHUFFLED)
    table = tmp_path / "table.jsonl"
    code, err = run_cli(capsys, "export", str(checkpoint), str(table), "--prompts",
                        str(_prompts(tmp_path, ["d", "x", "b"])))
    assert code == 0, err
    rows = [json.loads(line) for line in table.read_text().splitlines()]
    assert [(r["id"], r["prompt"]) for r in rows] == [
        ("d", "prompt of d"), ("b", "prompt of b"), ("c", None), ("a", None)]


def test_without_the_input_rows_come_in_first_recorded_order_and_it_says_so(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, store_kind: str) -> None:
    checkpoint = write_checkpoint(tmp_path / f"results.{store_kind}", SHUFFLED)
    table = tmp_path / "table.csv"
    code, err = run_cli(capsys, "export", str(checkpoint), str(table))
    assert code == 0, err
    assert list(load(table)["id"]) == FIRST_RECORDED
    assert f"wrote 4 row(s), one per item id, to {table} (csv)" in err
    assert "in the order each id was first recorded" in err and "--prompts INPUT" in err


@pytest.mark.parametrize("with_prompts", [False, True])
def test_order_completion_keeps_the_order_of_the_last_records(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, store_kind: str, with_prompts: bool) -> None:
    checkpoint = write_checkpoint(tmp_path / f"results.{store_kind}", SHUFFLED)
    table = tmp_path / "table.parquet"
    extra = ["--prompts", str(_prompts(tmp_path, INPUT_IDS))] if with_prompts else []
    code, err = run_cli(capsys, "export", str(checkpoint), str(table), "--order", "completion", *extra)
    assert code == 0, err
    assert pq.read_table(table).column("id").to_pylist() == COMPLETION
    assert "first recorded" not in err


def test_more_rows_than_the_buffer_are_put_in_order_through_a_temporary_file(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, store_kind: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from trio_batch_llm._cli import _export_order

    monkeypatch.setattr(_export_order, "BUFFERED_ROWS", 7)
    ids = [f"q{n:02}" for n in range(40)]
    done = ids[::-1]  # finished in reverse: every row is out of place
    checkpoint = write_checkpoint(tmp_path / f"results.{store_kind}",
                                  [result(i, output={"n": n, "tags": [n]}) for n, i in enumerate(done)])
    spilled: list[Path] = []
    opened = _export_order.spill_file

    def watched(directory: Path, name: str) -> Any:
        spill = opened(directory, name)
        spilled.append(Path(spill))
        return spill

    monkeypatch.setattr(_export_order, "spill_file", watched)
    for kind in FORMATS:
        table = tmp_path / "out" / f"table.{kind}"
        table.parent.mkdir(exist_ok=True)
        code, err = run_cli(capsys, "export", str(checkpoint), str(table), "--prompts",
                            str(_prompts(tmp_path, ids)))
        assert code == 0, err
        frame = load(table)
        assert list(frame["id"]) == ids, kind
        assert list(frame["output.n"]) == [39 - n for n in range(40)], kind
    assert len(spilled) == 3 and not any(p.exists() for p in spilled)
    left = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert left == ["table.csv", "table.jsonl", "table.parquet"]  # no temporary file


# --- a CSV input's own columns --------------------------------------------------------------------------

CSV_INPUT = (
    "id,prompt,n,score,zip,label,error,flag\n"
    "r1,first,3,0.5,02134,spam,x,true\n"
    "r2,second,-12,,90210,ham,,false\n"
    "r3,third,0,2,00501,\"eggs, and more\",y,true\n"
)


def _csv_checkpoint(tmp_path: Path, store_kind: str) -> Path:
    """A checkpoint whose contexts are what the command line's CSV input gives each item."""
    source = tmp_path / "in.csv"
    source.write_text(CSV_INPUT)
    records = list(iter_input(source))
    assert records[0].context["n"] == "3"  # CSV cells are text when read: export restores the numbers
    return write_checkpoint(tmp_path / f"results.{store_kind}",
                            [result(r.item_id, output=f"answer {r.item_id}", context=r.context)
                             for r in reversed(records)])


def _check_csv_columns(frame: pd.DataFrame) -> None:
    assert list(frame["id"]) == ["r1", "r2", "r3"]
    assert "context" not in frame.columns
    assert list(frame.columns[-7:]) == ["n", "score", "zip", "label", "input.error", "flag", "prompt"]
    assert frame["n"].dtype == "int64" and list(frame["n"]) == [3, -12, 0]
    assert frame["score"].dtype == "float64"
    assert frame["score"][0] == 0.5 and pd.isna(frame["score"][1]) and frame["score"][2] == 2.0
    assert list(frame["label"]) == ["spam", "ham", "eggs, and more"]
    assert frame["error"].isna().all()  # our own column: every item succeeded
    assert list(frame["output"]) == ["answer r1", "answer r2", "answer r3"]


@pytest.mark.parametrize("kind", FORMATS)
def test_a_csv_inputs_columns_come_back_as_typed_columns(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                        store_kind: str, kind: str) -> None:
    checkpoint = _csv_checkpoint(tmp_path, store_kind)
    table = tmp_path / f"table.{kind}"
    code, err = run_cli(capsys, "export", str(checkpoint), str(table), "--prompts", str(tmp_path / "in.csv"))
    assert code == 0, err
    frame = load(table) if kind != "csv" else pd.read_csv(table, dtype={"zip": str})
    _check_csv_columns(frame)
    assert list(frame["zip"]) == ["02134", "90210", "00501"]  # leading zeros: a number would lose them
    assert list(frame["input.error"].fillna("")) == ["x", "", "y"]
    if kind != "csv":  # (pandas' CSV reader guesses booleans itself)
        assert list(frame["flag"]) == ["true", "false", "true"]  # text stays text: no guessing at booleans
    if kind == "parquet":
        schema = pq.read_schema(table)
        assert [str(schema.field(name).type) for name in ("n", "score", "zip", "input.error")] == [
            "int64", "double", "string", "string"]
    if kind == "jsonl":
        rows = [json.loads(line) for line in table.read_text().splitlines()]
        assert [(r["n"], r["score"], r["zip"]) for r in rows] == [(3, 0.5, "02134"), (-12, None, "90210"),
                                                                   (0, 2.0, "00501")]


def test_a_column_mixing_numbers_and_text_stays_text(capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path) -> None:
    checkpoint = write_checkpoint(tmp_path / "results.jsonl", [
        result("a", context={"v": "1", "w": "1", "big": "1"}), result("b", context={"v": "n/a", "w": "2.5"}),
        result("c", context={"v": "3", "w": "1e3", "big": "12345678901234567890"}),
        result("d", context={"v": "", "w": ""}),
    ])
    table = tmp_path / "table.parquet"
    code, err = run_cli(capsys, "export", str(checkpoint), str(table))
    assert code == 0, err
    read = pq.read_table(table)
    assert str(read.schema.field("v").type) == "string"
    assert read.column("v").to_pylist() == ["1", "n/a", "3", ""]
    assert str(read.schema.field("w").type) == "double"
    assert read.column("w").to_pylist() == [1.0, 2.5, 1000.0, None]
    assert str(read.schema.field("big").type) == "string"  # 64 bits cannot hold it; a float would change it
    assert read.column("big").to_pylist() == ["1", None, "12345678901234567890", None]


# --- a --response-schema output -------------------------------------------------------------------------

SCHEMA_RESULTS = [
    result("a", output={"label": "spam", "score": 0.9, "where": {"city": "Oslo", "geo": {"lat": 59.9}},
                        "tags": ["x", "y"], "count": 2}),
    result("b", success=False),
    result("c", output={"label": "ham", "score": 1, "where": None, "tags": [], "count": 0}),
]
OUTPUT_COLUMNS = ["output.label", "output.score", "output.where.city", "output.where.geo.lat", "output.tags",
                  "output.count"]


@pytest.mark.parametrize("kind", FORMATS)
def test_an_object_output_is_spread_into_output_columns(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                        store_kind: str, kind: str) -> None:
    checkpoint = write_checkpoint(tmp_path / f"results.{store_kind}", SCHEMA_RESULTS)
    table = tmp_path / f"table.{kind}"
    code, err = run_cli(capsys, "export", str(checkpoint), str(table))
    assert code == 0, err
    frame = load(table)
    columns = list(frame.columns)
    assert "output" not in columns
    assert columns[columns.index("success") + 1:columns.index("error")] == OUTPUT_COLUMNS
    assert list(frame["output.label"].fillna("-")) == ["spam", "-", "ham"]
    assert frame["output.score"].dtype == "float64" and frame["output.score"][2] == 1.0
    assert frame["output.where.geo.lat"][0] == 59.9 and frame["output.where.geo.lat"][1:].isna().all()
    tags = list(frame["output.tags"])
    if kind == "jsonl":
        assert tags[0] == ["x", "y"] and tags[2] == []
    else:  # lists stay JSON: one text cell
        assert json.loads(tags[0]) == ["x", "y"] and json.loads(tags[2]) == [] and pd.isna(tags[1])
    if kind == "parquet":
        schema = pq.read_schema(table)
        assert (str(schema.field("output.count").type), str(schema.field("output.score").type)) == (
            "int64", "double")


def test_no_flatten_keeps_one_json_cell_each(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    checkpoint = write_checkpoint(tmp_path / "results.jsonl",
                                  [result("a", output={"label": "spam", "n": 1}, context={"n": "3"})])
    table = tmp_path / "table.csv"
    code, err = run_cli(capsys, "export", str(checkpoint), str(table), "--no-flatten")
    assert code == 0, err
    with table.open(newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert "output.label" not in row and "n" not in row
    assert json.loads(row["output"]) == {"label": "spam", "n": 1} and json.loads(row["context"]) == {"n": "3"}


def test_outputs_that_are_not_all_objects_stay_one_column(capsys: pytest.CaptureFixture[str],
                                                          tmp_path: Path) -> None:
    checkpoint = write_checkpoint(tmp_path / "results.jsonl", [
        result("a", output={"label": "spam"}, context={"row": 1}),
        result("b", output="plain", context="ctx")])
    table = tmp_path / "table.parquet"
    code, err = run_cli(capsys, "export", str(checkpoint), str(table))
    assert code == 0, err
    rows = pq.read_table(table).to_pylist()
    assert [json.loads(r["output"]) if r["id"] == "a" else r["output"] for r in rows] == [{"label": "spam"},
                                                                                         "plain"]
    assert [r["context"] for r in rows] == ['{"row": 1}', "ctx"]


def test_the_help_says_what_order_and_what_flattening(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--order input|completion" in text and "first recorded" in text
    assert "--no-flatten" in text and "output.<field>" in text


# --- end to end: a CSV input and a response schema through `run`, then pandas --------------------------

SCHEMA = {"type": "object", "properties": {"label": {"type": "string"}, "score": {"type": "integer"},
                                           "meta": {"type": "object",
                                                    "properties": {"lang": {"type": "string"}},
                                                    "required": ["lang"], "additionalProperties": False}},
          "required": ["label", "score", "meta"], "additionalProperties": False}


@pytest.mark.anyio
async def test_a_csv_run_with_a_schema_exports_a_typed_table(anyio_backend: str, tmp_path: Path) -> None:
    source, out = tmp_path / "in.csv", tmp_path / "results.jsonl"
    rows = "".join(f"p{i},prompt {i},{i * 10},{i}.25\n" for i in range(12))
    source.write_text("id,prompt,n,price\n" + rows)
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    async with serve_mock(MockServerConfig(model="mock-model")) as server:
        argv = ["run", str(source), "--model", "openai-compatible:mock-model", "--base-url", server.base_url,
                "--out", str(out), "--backend", anyio_backend, "--concurrency", "6", "--response-schema",
                str(schema)]
        async with spawn(*argv) as cli:
            pass
    assert cli.returncode == 0, cli.output
    table = tmp_path / "table.parquet"
    assert main(["export", str(out), str(table), "--prompts", str(source)]) == 0
    frame = pd.read_parquet(table)
    assert list(frame["id"]) == [f"p{i}" for i in range(12)]
    assert frame["n"].dtype == "int64" and list(frame["n"]) == [i * 10 for i in range(12)]
    assert frame["price"].dtype == "float64" and list(frame["price"]) == [i + 0.25 for i in range(12)]
    assert frame["output.score"].dtype == "int64" and frame["output.label"].map(type).eq(str).all()
    assert frame["output.meta.lang"].map(type).eq(str).all()


# --- failures leave nothing behind ---------------------------------------------------------------------


def test_a_corrupt_checkpoint_is_refused_before_anything_is_written(capsys: pytest.CaptureFixture[str],
                                                                    tmp_path: Path) -> None:
    checkpoint = write_checkpoint(tmp_path / "results.jsonl", [result(f"q{n}") for n in range(5)])
    lines = checkpoint.read_text().splitlines()
    lines[3] = '{"kind": "result", "item_id": "q2", broken'
    checkpoint.write_text("\n".join(lines) + "\n")
    table = tmp_path / "table.csv"
    table.write_text("keep me")
    code, err = run_cli(capsys, "export", str(checkpoint), str(table))
    assert code == 2 and f"CHECKPOINT {checkpoint}" in err and "line 4 is corrupt" in err
    assert table.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl", "table.csv"]


def test_a_write_that_fails_midway_leaves_no_temporary_file(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from trio_batch_llm._cli import _export, _export_order

    monkeypatch.setattr(_export_order, "BUFFERED_ROWS", 3)
    checkpoint = write_checkpoint(tmp_path / "results.jsonl", [result(f"q{n}") for n in reversed(range(10))])

    def full(f: Any, rows: Any, columns: list[str]) -> None:
        next(rows)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_export, "_write_csv", full)
    with pytest.raises(OSError, match="No space left"):
        main(["export", str(checkpoint), str(tmp_path / "table.csv"), "--prompts",
              str(_prompts(tmp_path, [f"q{n}" for n in range(10)]))])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "results.jsonl"]


def test_an_id_written_between_the_two_reads_is_left_out(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from trio_batch_llm._cli import _export

    reads = [[result("a"), result("b")], [result("a"), result("b"), result("late")]]  # a run still writing
    monkeypatch.setattr(_export, "_results", lambda checkpoint: lambda: iter(reads.pop(0)))
    table = tmp_path / "table.jsonl"
    code, err = run_cli(capsys, "export", str(tmp_path / "results.jsonl"), str(table))
    assert code == 0, err
    assert [json.loads(line)["id"] for line in table.read_text().splitlines()] == ["a", "b"]
