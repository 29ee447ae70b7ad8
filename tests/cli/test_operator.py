"""Issue 21: the command line as an operator and a data person meet it.

Problems in an input file are reported 20 at a time; the checking pass gives the same answer
on several cores as on one; ``--max-attempts`` and ``--resume-policy``; a summary that says
"not run" for items a stop kept from starting, counted as results arrive; ``export`` to a flat
table (JSONL, CSV, Parquet) that round-trips; help text on every option.
"""

from __future__ import annotations

import argparse
import csv
import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pyarrow.parquet as pq
import pytest

from trio_batch_llm import ArtifactIdentity, BatchResult, BatchTermination, ErrorCategory, ItemTiming
from trio_batch_llm import WorkItemResult as Result
from trio_batch_llm._artifacts import JsonlArtifactStore, SqliteArtifactStore
from trio_batch_llm._cli import _summary
from trio_batch_llm._cli._main import build_parser
from trio_batch_llm._cli._summary import LatencySketch, RunSummary
from trio_batch_llm.cli import main
from trio_batch_llm.testing import MockServerConfig, serve_mock

from .test_cli import MODEL, load, run_args, spawn, write_prompts

DEAD_URL = "http://127.0.0.1:9/v1"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- bad input: the first 20 problems ---------------------------------------------------------------


def test_up_to_20_problems_are_reported_in_line_order(capsys: pytest.CaptureFixture[str],
                                                       tmp_path: Path) -> None:
    lines = []
    for n in range(40):
        if n % 2 == 1:
            lines.append(f'{{"id": "x{n}"}}')  # no prompt: lines 2, 4, ..., 40
        elif n == 4:
            lines.append('{"id": "a0", "prompt": "again"}')  # line 5 repeats line 1's id
        else:
            lines.append(json.dumps({"id": f"a{n}", "prompt": f"p{n}"}))
    lines.append("{not json")  # line 41
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    code, stdout, stderr = run_cli(capsys, "run", str(source), "--model", "openai-compatible:m",
                                   "--base-url", DEAD_URL, "--out", str(out))
    assert code == 2 and stdout == ""
    errors = stderr.splitlines()
    assert len(errors) == 21  # the first 20, then the count
    numbers = [int(line.split(", line ")[1].split(",")[0].split(":")[0]) for line in errors[:20]]
    assert numbers == sorted([*range(2, 41, 2), 5])[:20]  # in line order, the duplicate among them
    assert errors[0] == f'trio-batch-llm: error: {source}, line 2, field "prompt": missing'
    assert (f"trio-batch-llm: error: {source}, line 5, field \"id\": duplicate id 'a0' (first on line 1)"
            in errors)
    assert errors[-1] == (f"trio-batch-llm: error: 22 problems in {source}; the first 20 are listed above: "
                          "fix them and run again")
    assert not out.exists()


def test_a_few_problems_are_all_listed_with_their_count(capsys: pytest.CaptureFixture[str],
                                                        tmp_path: Path) -> None:
    source = tmp_path / "in.csv"
    source.write_text("id,prompt\na,x\n,y\nb,\na,z\n")
    code, _, stderr = run_cli(capsys, "run", str(source), "--model", "openai-compatible:m",
                              "--base-url", DEAD_URL, "--out", str(tmp_path / "out.jsonl"))
    assert code == 2
    assert stderr.splitlines() == [
        f'trio-batch-llm: error: {source}, line 3, field "id": is empty',
        f'trio-batch-llm: error: {source}, line 4, field "prompt": is empty',
        f"trio-batch-llm: error: {source}, line 5, field \"id\": duplicate id 'a' (first on line 2)",
        f"trio-batch-llm: error: 3 problems in {source}: fix them and run again",
    ]


PARALLEL_CHECK = textwrap.dedent("""
    import json, random, sys
    from pathlib import Path
    from trio_batch_llm._cli import _input, _input_scan
    from trio_batch_llm._cli._input_records import InputError

    def outcome(path):
        try:
            return ("ok", _input.scan_input(path).items)
        except InputError as exc:
            return ("error", [str(p) for p in getattr(exc, "problems", [exc])], getattr(exc, "count", 1))

    rng = random.Random(int(sys.argv[2]))
    path = Path(sys.argv[1])
    kinds = ['{"id": "k%d", "prompt": "p"}', '"bare %d"', '', '  ', '{"id": "item-%d", "prompt": "q"}',
             '{"id": "k%d"}', '[%d]', '{"id": "dup", "prompt": "d%d"}', '{"id": %d, "prompt": "int"}']
    for trial in range(25):
        lines = [rng.choice(kinds).replace("%d", str(rng.randrange(60))) for _ in range(rng.randrange(1, 80))]
        text = "\\n".join(lines) + rng.choice(["", "\\n"])
        path.write_bytes((rng.choice(["", "\\ufeff"]) + text).encode())
        _input_scan.PARALLEL_FROM_BYTES = 10**12
        one = outcome(path)
        _input_scan.PARALLEL_FROM_BYTES = 0
        _input_scan.MAX_WORKERS = rng.choice([2, 3, 4])
        _input_scan._workers = lambda size: _input_scan.MAX_WORKERS
        many = outcome(path)
        assert one == many, (text, one, many)
    print("same")
""")


@pytest.mark.parametrize("seed", [1, 2])
def test_the_check_gives_the_same_answer_on_several_cores(tmp_path: Path, seed: int) -> None:
    # In a child process: the check forks only where no other thread runs (the test process has some).
    done = subprocess.run([sys.executable, "-c", PARALLEL_CHECK, str(tmp_path / "in.jsonl"), str(seed)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "same"


# --- --max-attempts, --resume-policy, "not run" ------------------------------------------------------

@pytest.mark.anyio
async def test_max_attempts_bounds_the_attempts_per_item(anyio_backend: str, tmp_path: Path) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(source, 4)
    async with serve_mock(MockServerConfig(model=MODEL, server_error_rate=1.0)) as server:
        args = run_args(server, source, out, anyio_backend, "--max-attempts", "2")
        async with spawn(*args) as cli:
            pass
        assert server.stats.requests == 8  # 4 items × 2 attempts, not the default 3
    assert cli.returncode == 1, cli.output
    assert all(r.result["attempts"] == 2 for r in (await load(out)).values())
    assert "failed 4" in cli.output and "first server failure: item" in cli.output


@pytest.mark.anyio
async def test_resume_policy_all_keeps_failures_that_would_fail_again(anyio_backend: str,
                                                                      tmp_path: Path) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join(json.dumps({"id": f"q{n}", "prompt": f"p{n}" + (" [[content_policy]]" if n < 2
                                                                                 else "")})
                                for n in range(5)) + "\n")
    async with serve_mock(MockServerConfig(model=MODEL)) as server:
        async with spawn(*run_args(server, source, out, anyio_backend)) as first:
            pass
        assert first.returncode == 1 and server.stats.requests == 5
        async with spawn(*run_args(server, source, out, anyio_backend, "--resume-policy", "all")) as again:
            pass
        assert server.stats.requests == 5  # nothing ran: successes and terminal refusals both kept
        assert again.returncode == 1 and "replayed 5" in again.output
        async with spawn(*run_args(server, source, out, anyio_backend, "--resume")) as rerun:
            pass
        assert server.stats.requests == 7  # --resume (successes) runs the two refusals again
    assert rerun.returncode == 1 and "replayed 3" in rerun.output


@pytest.mark.anyio
async def test_items_a_stop_kept_from_starting_are_not_run_not_failed(anyio_backend: str,
                                                                      tmp_path: Path) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(source, 400)
    async with (serve_mock(MockServerConfig(model=MODEL, latency=0.05)) as server,
                spawn(*run_args(server, source, out, anyio_backend, "--concurrency", "2")) as cli):
        await server.wait_for(lambda stats: stats.succeeded >= 4)
        cli.send_signal(signal.SIGINT)
    assert cli.returncode == 130, cli.output
    items_line = next(line for line in cli.output.splitlines() if line.startswith("  items"))
    succeeded = int(items_line.split("succeeded ")[1].split()[0])
    not_run = int(items_line.split("not run ")[1].split()[0].replace(",", ""))
    assert items_line.split()[1] == "400" and "failed 0" in items_line
    assert succeeded + not_run == 400 and succeeded >= 4
    assert "failures" not in cli.output  # no failure line: nothing failed
    assert "first not_executed failure" not in cli.output


def result(item_id: str, *, success: bool = True, category: ErrorCategory | None = None, attempts: int = 1,
           replayed: bool = False, execution: float = 0.0, admission: float = 0.0) -> Result[Any]:
    return Result(item_id=item_id, success=success, output="o" if success else None,
                  error=None if success else f"{category} of {item_id}", error_category=category,
                  attempts=attempts, token_usage={"input_tokens": 3, "output_tokens": 2, "total_tokens": 5},
                  timing=ItemTiming(admission_wait=admission, execution=execution), replayed=replayed)


RESULTS = [
    result("a", execution=0.010, admission=0.001),
    result("b", attempts=3, execution=0.030),
    result("c", success=False, category=ErrorCategory.SERVER, attempts=3, execution=0.020),
    result("d", success=True, replayed=True),
    result("e", success=False, category=ErrorCategory.CONTENT_POLICY, execution=0.005),
    result("f", success=False, category=ErrorCategory.NOT_EXECUTED, attempts=0),
    result("g", success=False, category=ErrorCategory.NOT_EXECUTED, attempts=0),
    result("h", success=False, category=ErrorCategory.SERVER, attempts=3, execution=0.040),
]


def test_batch_summary_says_not_run_for_items_that_never_started() -> None:
    termination = BatchTermination("interrupted", "interrupted by SIGINT")
    text = BatchResult.from_results(RESULTS, termination=termination, wall_time=2.0).summary()
    lines = text.splitlines()
    assert lines[0] == "Batch interrupted (interrupted by SIGINT)"
    # issue 35: the 5 items this run ran itself ("new") apart from the replayed one
    assert lines[1] == "  items                8   succeeded 3   failed 3   not run 2   replayed 1   new 5"
    assert "  failures    content_policy 1, server 2" in lines  # not_executed is no failure
    # the 4 that ran, not the 2 never started (nor the replayed one)
    assert "  wall time        2.000 s   2 items/s (new items only)" in lines


def test_the_run_summary_counted_as_results_arrive_reads_like_batch_summary() -> None:
    termination = BatchTermination("interrupted", "interrupted by SIGINT")
    summary = RunSummary(total=len(RESULTS))
    for item in RESULTS:
        summary.add(item)
    expected = BatchResult.from_results(RESULTS, termination=termination, wall_time=2.0).summary()
    assert summary.text(termination, 2.0) == expected
    assert summary.first_failure_lines() == [
        "first server failure: item 'c': server of c",
        "first content_policy failure: item 'e': content_policy of e",
    ]
    # Items of the input that never got a result (the stop came before they were read) are not run.
    bigger = RunSummary(total=len(RESULTS) + 5)
    for item in RESULTS:
        bigger.add(item)
    assert "   failed 3   not run 7   replayed 1" in bigger.text(termination, 2.0)
    assert (bigger.succeeded, bigger.unfinished) == (3, 10)


def test_latency_sketch_is_exact_then_within_one_percent(monkeypatch: pytest.MonkeyPatch) -> None:
    values = [0.001 * (1.0007 ** n) for n in range(20_000)]
    exact = LatencySketch()
    for value in values:
        exact.add(value)
    ordered = sorted(values)
    for q in (0.5, 0.95, 0.99):
        assert exact.percentile(q) == ordered[round(q * (len(values) - 1))]
    monkeypatch.setattr(_summary, "EXACT_VALUES", 1_000)
    sketch = LatencySketch()
    for value in [*values, 0.0, 0.0]:
        sketch.add(value)
    assert len(sketch) == 20_002
    ordered = sorted([*values, 0.0, 0.0])
    for q in (0.0, 0.5, 0.95, 0.99, 1.0):
        true = ordered[round(q * (len(ordered) - 1))]
        assert sketch.percentile(q) == pytest.approx(true, rel=0.01, abs=1e-9)


# --- export ---------------------------------------------------------------------------------------------

IDENTITY = ArtifactIdentity(provider="openai-compatible", model=MODEL)


def stored(item_id: str, *, success: bool, output: Any = None, attempts: int = 1,
           context: Any = None) -> Result[Any]:
    return Result(item_id=item_id, success=success, output=output, attempts=attempts, context=context,
                  error=None if success else "boom", error_category=None if success else ErrorCategory.SERVER,
                  token_usage={"input_tokens": 7, "output_tokens": 2, "total_tokens": 9} if success else {},
                  timing=ItemTiming(execution=0.25))


CHECKPOINT = [
    stored("a", success=False, attempts=3, context={"row": 1}),
    stored("b", success=True, output="plain text, with a comma", context="ctx"),
    stored("c", success=True, output={"label": "spam", "score": 0.9}),
    stored("a", success=True, output="second try", attempts=1, context={"row": 1}),  # a resume
    stored("d", success=False),
]


async def write_checkpoint(store: JsonlArtifactStore | SqliteArtifactStore) -> None:
    async with store:
        for item in CHECKPOINT:
            await store.append(item, fingerprint="f")


@pytest.fixture(params=["jsonl", "sqlite"])
def checkpoint(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    if request.param == "jsonl":
        path = tmp_path / "results.jsonl"
        anyio.run(write_checkpoint, JsonlArtifactStore(path, identity=IDENTITY))
    else:
        path = tmp_path / "results.sqlite"
        anyio.run(write_checkpoint, SqliteArtifactStore(path, identity=IDENTITY))
    return path


EXPECTED_IDS = ["b", "c", "a", "d"]  # in the order of each id's last record (--order completion)


def test_export_csv_round_trips_through_the_csv_module(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                        checkpoint: Path) -> None:
    table = tmp_path / "table.csv"
    code, _, stderr = run_cli(capsys, "export", str(checkpoint), str(table), "--order", "completion")
    assert code == 0, stderr
    assert f"wrote 4 row(s), one per item id, to {table} (csv)" in stderr
    with table.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [row["id"] for row in rows] == EXPECTED_IDS
    a = rows[2]
    assert (a["success"], a["output"], a["attempts"], a["error"], a["error_category"]) == (
        "True", "second try", "1", "", "")
    assert json.loads(a["context"]) == {"row": 1}
    assert rows[0]["output"] == "plain text, with a comma" and rows[0]["context"] == "ctx"
    assert json.loads(rows[1]["output"]) == {"label": "spam", "score": 0.9}
    assert (rows[3]["success"], rows[3]["error"], rows[3]["error_category"], rows[3]["input_tokens"]) == (
        "False", "boom", "server", "")
    assert (a["input_tokens"], a["output_tokens"], a["total_tokens"], a["execution_seconds"]) == (
        "7", "2", "9", "0.25")


def test_export_parquet_round_trips_through_pyarrow(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                    checkpoint: Path) -> None:
    table = tmp_path / "table.parquet"
    code, _, stderr = run_cli(capsys, "export", str(checkpoint), str(table), "--order", "completion")
    assert code == 0, stderr
    read = pq.read_table(table)
    assert read.schema.field("attempts").type == "int64" and read.schema.field("success").type == "bool"
    rows = read.to_pylist()
    assert [row["id"] for row in rows] == EXPECTED_IDS
    assert rows[2] == {"id": "a", "success": True, "output": "second try", "error": None,
                       "error_category": None, "stop_reason": None, "attempts": 1, "input_tokens": 7,
                       "output_tokens": 2, "total_tokens": 9, "execution_seconds": 0.25,
                       "context": '{"row": 1}'}
    assert rows[3]["input_tokens"] is None and rows[3]["error_category"] == "server"
    assert json.loads(rows[1]["output"]) == {"label": "spam", "score": 0.9}


def test_export_jsonl_keeps_json_values_and_adds_prompts(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                         checkpoint: Path) -> None:
    prompts = tmp_path / "in.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": i, "prompt": f"prompt of {i}"}) for i in "abcd") + "\n")
    table = tmp_path / "flat.txt"
    code, _, stderr = run_cli(capsys, "export", str(checkpoint), str(table), "--format", "jsonl",
                              "--prompts", str(prompts), "--order", "completion")
    assert code == 0, stderr
    rows = [json.loads(line) for line in table.read_text().splitlines()]
    assert [row["id"] for row in rows] == EXPECTED_IDS
    assert rows[1]["output"] == {"label": "spam", "score": 0.9} and rows[2]["context"] == {"row": 1}
    assert [row["prompt"] for row in rows] == [f"prompt of {i}" for i in EXPECTED_IDS]


def test_export_refuses_what_it_cannot_do_and_leaves_out_alone(capsys: pytest.CaptureFixture[str],
                                                              tmp_path: Path, checkpoint: Path) -> None:
    existing = tmp_path / "table.csv"
    existing.write_text("keep me")
    not_ours = tmp_path / "other.jsonl"
    not_ours.write_text('{"some": "file"}\n')
    cases = [
        (["export", str(checkpoint), str(tmp_path / "table.xlsx")], "pass --format jsonl, csv or parquet"),
        (["export", str(tmp_path / "missing.jsonl"), str(existing)], "missing.jsonl: no such file"),
        (["export", str(checkpoint), str(checkpoint), "--format", "csv"], "is the checkpoint"),
        (["export", str(not_ours), str(existing)], "other.jsonl"),
        (["export", str(checkpoint), str(tmp_path / "nodir" / "t.csv")], "does not exist"),
    ]
    for argv, expected in cases:
        code, _, stderr = run_cli(capsys, *argv)
        assert code == 2 and expected in stderr, (argv, stderr)
    assert existing.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp files left


# --- help text ----------------------------------------------------------------------------------------


def _parsers(parser: argparse.ArgumentParser, name: str = "trio-batch-llm") -> list[tuple[str, Any]]:
    found = [(name, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                found += _parsers(sub, f"{name} {sub_name}")
    return found


def test_every_option_of_every_command_has_help() -> None:
    missing = [
        f"{name} {'/'.join(action.option_strings) or action.dest}"
        for name, parser in _parsers(build_parser())
        for action in parser._actions
        if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) and not action.help
    ]
    assert missing == []


def test_run_help_says_which_file_is_which(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--out CHECKPOINT.jsonl the checkpoint: every result as it finishes" in text
    assert "trio-batch-llm export CHECKPOINT OUT" in text
