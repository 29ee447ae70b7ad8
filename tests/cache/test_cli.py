"""Issue 34: the command line's response cache: the flags, the rows' ``sample``, the summary's cache line.

The flags are checked where ``run`` and ``runs start`` plan their work (no call, no file written
on a bad value, exit status 2, a URL's password never printed); the rows' ``sample`` reaches
the items the run adds; the summary counts hits, misses and the money the hits saved.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trio_batch_llm import (
    BatchResult,
    PostgresResponseCache,
    RedisResponseCache,
    SqliteResponseCache,
    WorkItemResult,
)
from trio_batch_llm._cli import _run
from trio_batch_llm._cli._input import InputError, read_input, scan_input
from trio_batch_llm._cli._main import build_parser, main
from trio_batch_llm._cli._render import redaction_note, shown_command
from trio_batch_llm._cli._run import RunPlan, plan_run
from trio_batch_llm._cli._runs_start import plan_start
from trio_batch_llm._cli._summary import RunSummary
from trio_batch_llm._values._results import BatchTermination

pytestmark = pytest.mark.anyio

DEAD_URL = "http://127.0.0.1:9/v1"  # nothing listens: a check that let a call through fails
SECRET = "s3cr3t-Pa55"
MODEL = "gpt-4o-mini"  # in the built-in rates: the saved money is priced


def run_argv(source: Path, out: Path, *extra: str) -> list[str]:
    return ["run", str(source), "--model", f"openai-compatible:{MODEL}", "--base-url", DEAD_URL,
            "--out", str(out), *extra]


def plan(argv: list[str]) -> RunPlan:
    return plan_run(build_parser().parse_args(argv), argv)


def run_cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text('{"id": "a", "prompt": "one"}\n{"id": "b", "prompt": "two", "sample": 1}\n')
    return path


# --- the flags reach the config ----------------------------------------------------------------------


def test_cache_flags_reach_the_processor_config(source: Path, tmp_path: Path) -> None:
    out, cache = tmp_path / "out.jsonl", tmp_path / "cache.sqlite3"
    config = plan(run_argv(source, out, "--cache", str(cache), "--cache-mode", "read-only",
                           "--cache-ttl", "90", "--cache-no-request")).config
    assert config.response_cache == SqliteResponseCache(str(cache), ttl=90.0, store_request=False)
    assert config.cache_mode == "read-only"
    plain = plan(run_argv(source, out)).config
    assert plain.response_cache is None and plain.cache_mode == "read-write"


def test_cache_takes_a_url_and_a_bare_flag_is_the_platform_file(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    pg = plan(run_argv(source, out, "--cache", f"postgresql://u:{SECRET}@db.example/cache")).config
    assert isinstance(pg.response_cache, PostgresResponseCache) and pg.response_cache.ttl is None
    assert SECRET not in repr(pg.response_cache)
    redis = plan(run_argv(source, out, "--cache", "redis://127.0.0.1:6379/3", "--cache-mode", "refresh"))
    assert isinstance(redis.config.response_cache, RedisResponseCache)
    assert redis.config.cache_mode == "refresh"
    bare = plan([*run_argv(source, out), "--cache"]).config.response_cache  # no value: the default file
    assert bare == SqliteResponseCache(None)


def test_runs_start_takes_the_cache_flags_in_live_mode_only(source: Path, tmp_path: Path) -> None:
    db, cache = tmp_path / "runs.sqlite3", tmp_path / "cache.sqlite3"
    plain = source.with_name("plain.jsonl")
    plain.write_text('{"id": "a", "prompt": "one"}\n')
    argv = ["runs", "start", str(db), "r1", str(plain), "--model", f"openai-compatible:{MODEL}",
            "--base-url", DEAD_URL, "--cache", str(cache), "--cache-mode", "write-only", "--cache-ttl", "5"]
    started = plan_start(build_parser().parse_args(argv), argv)
    assert started.config.response_cache == SqliteResponseCache(str(cache), ttl=5.0)
    assert started.config.cache_mode == "write-only"


def test_runs_start_refuses_the_cache_in_provider_batch_mode_and_a_sample(
        capsys: pytest.CaptureFixture[str], source: Path, tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite3"
    base = ["runs", "start", str(db), "r1", str(source), "--model", f"openai-compatible:{MODEL}",
            "--base-url", DEAD_URL]
    code, output = run_cli(capsys, [*base, "--mode", "provider-batch", "--cache", str(tmp_path / "c.db")])
    assert code == 2 and "--cache is not used with --mode provider-batch" in output
    code, output = run_cli(capsys, base)  # line 2 has "sample": 1, which a run cannot store yet
    assert code == 2 and f'{source}, line 2, field "sample": durable runs do not carry a sample' in output
    assert not db.exists()


# --- bad values: exit 2 before any work, no secret shown ----------------------------------------------


@pytest.mark.parametrize(("extra", "expected"), [
    (["--cache", f"mysql://root:{SECRET}@db/x"],
     "--cache mysql://<redacted>@db/x: must be a SQLite file path, a postgresql:// URL or a redis:// URL"),
    (["--cache-mode", "read-only"], "--cache-mode needs --cache"),
    (["--cache-ttl", "60"], "--cache-ttl needs --cache"),
    (["--cache-no-request"], "--cache-no-request needs --cache"),
    (["--cache", "{tmp}/no-such-dir/c.sqlite3"],
     "--cache {tmp}/no-such-dir/c.sqlite3: the directory {tmp}/no-such-dir does not exist"),
    (["--cache", "{tmp}"], "--cache {tmp}: not a regular file"),
    (["--cache", "{tmp}/in.jsonl"], "--cache {tmp}/in.jsonl is the input file"),
])
def test_a_bad_cache_flag_is_a_usage_error_naming_it(capsys: pytest.CaptureFixture[str], source: Path,
                                                     tmp_path: Path, extra: list[str], expected: str) -> None:
    out = tmp_path / "out.jsonl"
    extra = [arg.replace("{tmp}", str(tmp_path)) for arg in extra]
    code, output = run_cli(capsys, run_argv(source, out, *extra))
    assert code == 2
    assert f"error: {expected.replace('{tmp}', str(tmp_path))}" in output
    assert SECRET not in output and not out.exists()


@pytest.mark.parametrize(("flag", "value"), [("--cache-mode", "sometimes"), ("--cache-ttl", "0"),
                                             ("--cache-ttl", "nan")])
def test_argparse_refuses_a_bad_mode_or_ttl(capsys: pytest.CaptureFixture[str], source: Path,
                                            tmp_path: Path, flag: str, value: str) -> None:
    code, output = run_cli(capsys, run_argv(source, tmp_path / "out.jsonl", "--cache", "c.db", flag, value))
    assert code == 2 and f"argument {flag}: " in output and repr(value) in output


def test_a_cache_that_cannot_be_opened_is_exit_2_without_its_password(
        capsys: pytest.CaptureFixture[str], source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    url = f"postgresql://user:{SECRET}@127.0.0.1:9/cache?connect_timeout=5"  # nothing listens on port 9
    code, output = run_cli(capsys, run_argv(source, out, "--cache", url))
    assert code == 2
    assert "error: --cache postgresql://<redacted>@127.0.0.1:9/cache" in output and "cannot open it" in output
    assert SECRET not in output and not out.exists()


def test_the_resume_line_names_the_cache_password_not_the_run_database() -> None:
    command = shown_command(["run", "in.jsonl", "--cache", f"postgresql://u:{SECRET}@h/db", "--out", "o"])
    assert SECRET not in command
    assert redaction_note(command) == " (the password in --cache is shown as <redacted>: put it back)"


# --- "sample" in the input ---------------------------------------------------------------------------


def test_a_row_sample_is_read_from_jsonl_and_csv(tmp_path: Path) -> None:
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"id": "a", "prompt": "p"}\n{"id": "b", "prompt": "p", "sample": 2}\n'
                     '{"id": "c", "messages": [{"role": "user", "content": "p"}], "sample": 1}\n')
    assert [(r.item_id, r.sample) for r in read_input(jsonl)] == [("a", 0), ("b", 2), ("c", 1)]
    csv = tmp_path / "in.csv"
    csv.write_text("id,prompt,sample,lang\na,p,,en\nb,p,3,fr\n")
    rows = read_input(csv)
    assert [(r.item_id, r.sample, r.context) for r in rows] == [("a", 0, {"lang": "en"}),
                                                                 ("b", 3, {"lang": "fr"})]


@pytest.mark.parametrize("bad", ["-1", "1.5", "true", '"2"', "null"])
def test_a_bad_sample_names_the_file_line_and_field(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(f'{{"id": "a", "prompt": "p"}}\n{{"id": "b", "prompt": "p", "sample": {bad}}}\n')
    with pytest.raises(InputError) as caught:
        scan_input(path)
    assert str(caught.value).startswith(f'{path}, line 2, field "sample": must be a whole number >= 0')


def test_a_bad_csv_sample_names_the_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_text("id,prompt,sample\na,p,1\nb,p,-2\n")
    with pytest.raises(InputError) as caught:
        scan_input(path)
    assert str(caught.value).startswith(f'{path}, line 3, field "sample": must be a whole number >= 0')


class _Recorder:
    """Stands in for the processor ``_feed`` adds work to."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.finished = False

    async def add_work(self, item: Any) -> None:
        self.items.append(item)

    async def finish(self) -> None:
        self.finished = True


async def test_the_run_adds_each_row_with_its_sample(anyio_backend: str, source: Path,
                                                     tmp_path: Path) -> None:
    planned = plan(run_argv(source, tmp_path / "out.jsonl", "--cache", str(tmp_path / "c.db")))
    recorder = _Recorder()
    await _run._feed(recorder, planned, _run._RunOutcome(2))  # type: ignore[arg-type]
    assert [(item.item_id, item.sample) for item in recorder.items] == [("a", 0), ("b", 1)]
    assert recorder.finished


# --- the summary -------------------------------------------------------------------------------------

USAGE = {"input_tokens": 1_000_000, "output_tokens": 0, "total_tokens": 1_000_000}


def _result(item_id: str, *, cached: bool = False, key: str | None = "k") -> WorkItemResult[Any]:
    return WorkItemResult(item_id=item_id, success=True, output="x", cached=cached, cache_key=key,
                          token_usage={} if cached else dict(USAGE),
                          saved_usage=dict(USAGE) if cached else {}, metadata={"model": MODEL})


def test_the_summary_counts_hits_misses_and_the_money_saved() -> None:
    summary = RunSummary(4, model=MODEL)
    for result in (_result("a", cached=True), _result("b", cached=True), _result("c", cached=True),
                   _result("d")):
        summary.add(result)
    lines = summary.text(BatchTermination(), 1.0).splitlines()
    cost = next(line for line in lines if line.startswith("  cost"))
    cache = next(line for line in lines if line.startswith("  cache"))
    assert cost == "  cost           $0.1500   estimated, built-in rates of 2025-08-07"  # the one miss
    assert cache == "  cache hits           3   misses 1   rate 75.0 %   saved $0.4500"


def test_the_run_summary_with_a_cache_reads_like_batch_summary() -> None:
    results = [_result("a", cached=True), _result("b"), _result("c", key=None),
               WorkItemResult(item_id="d", success=True, output="y", cache_key="k2",
                              metadata={"model": MODEL},
                              token_usage={"input_tokens": 10, "output_tokens": 2, "total_tokens": 12,
                                           "cached_input_tokens": 4})]
    summary = RunSummary(len(results), model=MODEL)
    for result in results:
        summary.add(result)
    termination = BatchTermination()
    expected = BatchResult.from_results(results, termination=termination, wall_time=1.0).summary()
    assert summary.text(termination, 1.0) == expected
    assert "  cache hits           1   misses 2   rate 33.3 %   saved $0.1500" in expected
    assert "   cached 4 (0.0 %)" in expected  # the prompt cache's tokens, on the tokens line


def test_the_summary_has_no_cache_line_without_a_cache() -> None:
    summary = RunSummary(1, model=MODEL)
    summary.add(_result("a", key=None))
    assert "cache" not in summary.text(BatchTermination(), 1.0)


def test_json_rows_with_a_sample_keep_working_with_the_fast_path(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    rows = [{"id": f"r{n}", "prompt": "same", "sample": n} for n in range(3)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + '{"id": "z", "prompt": "fast"}\n')
    assert scan_input(path).items == 4
    assert [r.sample for r in read_input(path)] == [0, 1, 2, 0]
