"""``trio-batch-llm runs``: durable runs from the command line.

End to end: every command runs in a subprocess (``--backend`` set to the
test's backend) against the mock server, served in the test process so the
tests can set its batch knobs and read its counters. Nothing waits on the wall
clock: a driver is stopped at a known point by a prompt that hangs
(``[[hang]]``/``[[hangx1]]``) or a batch create that never answers, and the
tests wait for the server's counters; the one ``--timeout`` used watches a
paused run, which cannot finish whatever the timing.

Bad usage is checked in-process through ``main()`` (no event loop starts, no
call is made): exit status 2 and a message naming the file, line, field or flag.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from trio_batch_llm import ArtifactIdentity
from trio_batch_llm._runs import open_run, read_run_snapshot
from trio_batch_llm._strategies.openai._compatible import OpenAICompatibleStrategy
from trio_batch_llm.cli import main
from trio_batch_llm.testing import MockServer, MockServerConfig, serve_mock

from .test_cli import ENV, MODEL, WAIT, command, spawn

pytestmark = pytest.mark.anyio

DEAD_URL = "http://127.0.0.1:9/v1"  # nothing listens: a bad-usage check that let a call through fails
RUN = "nightly"


def write_items(path: Path, prompts: list[str]) -> list[str]:
    ids = [f"q{n}" for n in range(len(prompts))]
    lines = [json.dumps({"id": i, "prompt": p}) + "\n" for i, p in zip(ids, prompts, strict=True)]
    path.write_text("".join(lines), encoding="utf-8")
    return ids


def start_args(server: MockServer, db: Path, source: Path, backend: str, *extra: str) -> list[str]:
    return ["runs", "start", str(db), RUN, str(source), "--model", f"openai-compatible:{MODEL}",
            "--base-url", server.base_url, "--backend", backend, *extra]


async def cli(*args: str) -> tuple[int, str, str]:
    """Run one command to its end: ``(exit status, stdout, stderr)``."""
    with anyio.fail_after(WAIT):
        done = await anyio.run_process(command(*args), check=False, env=ENV)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def status(db: Path) -> dict[str, Any]:
    code, out, err = await cli("runs", "status", str(db), RUN, "--json")
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    return data


async def exported(db: Path, out: Path, backend: str, *extra: str) -> list[dict[str, Any]]:
    code, _, err = await cli("runs", "export", str(db), RUN, str(out), "--backend", backend, *extra)
    assert code == 0, err
    text = await anyio.Path(out).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def _poll_done(db: Path, count: int) -> int:
    deadline = time.monotonic() + WAIT
    while (done := read_run_snapshot(db, RUN).done) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return done


async def wait_until_done(db: Path, count: int) -> None:
    """Until ``count`` results are stored (a driver records a result just after its call returns).

    The database changes in another process: nothing to wait on but the file, polled in a
    thread (bounded)."""
    assert await anyio.to_thread.run_sync(_poll_done, db, count) == count


def assert_exactly_once(lines: list[dict[str, Any]], ids: list[str]) -> None:
    assert [line["sequence"] for line in lines] == list(range(1, len(ids) + 1))
    assert sorted(line["result"]["item_id"] for line in lines) == sorted(ids)
    assert all(line["result"]["success"] for line in lines)


# --- driving to the end ----------------------------------------------------------------


async def test_a_live_run_completes_then_status_export_and_a_second_start(
    anyio_backend: str, tmp_path: Path
) -> None:
    db, source = tmp_path / "runs.sqlite", tmp_path / "in.jsonl"
    ids = write_items(source, [f"prompt {n}" for n in range(12)])
    async with serve_mock(MockServerConfig(model=MODEL)) as server:
        code, out, err = await cli(*start_args(server, db, source, anyio_backend, "--concurrency", "4"))
        assert code == 0, out + err
        assert f"starting run {RUN}" in err and f"run {RUN}: completed" in out
        assert "done 12 (succeeded 12, failed 0), pending 0" in out
        assert server.stats.requests == 12

        code, out, err = await cli("runs", "status", str(db), RUN)
        assert code == 0 and f"run {RUN}: completed" in out and "mode live" in out, out + err
        snap = await status(db)
        assert (snap["status"], snap["mode"], snap["items"], snap["done"], snap["last_sequence"]) == (
            "completed", "live", 12, 12, 12)
        assert snap["identity"]["model"] == MODEL and snap["ingestion_complete"] is True

        lines = await exported(db, tmp_path / "all.jsonl", anyio_backend)
        assert_exactly_once(lines, ids)
        by_id = {line["result"]["item_id"]: line["result"] for line in lines}
        assert by_id["q3"]["output"] == "echo: prompt 3"
        tail = await exported(db, tmp_path / "tail.jsonl", anyio_backend, "--after", "10")
        assert [line["sequence"] for line in tail] == [11, 12]

        # A second start finds the run completed: nothing is called again.
        code, out, err = await cli(*start_args(server, db, source, anyio_backend))
        assert code == 0 and f"continuing run {RUN}" in err, out + err
        assert server.stats.requests == 12
        # A completed run cannot be paused (the run refuses: status 1, not a usage error).
        code, _, err = await cli("runs", "pause", str(db), RUN, "--backend", anyio_backend)
        assert code == 1 and "is completed; only a running run can be paused" in err, err


async def test_a_provider_batch_run_completes(anyio_backend: str, tmp_path: Path) -> None:
    db, source = tmp_path / "runs.sqlite", tmp_path / "in.jsonl"
    ids = write_items(source, [f"prompt {n}" for n in range(10)])
    async with serve_mock(MockServerConfig(model=MODEL)) as server:
        code, out, err = await cli(*start_args(server, db, source, anyio_backend, "--mode", "provider-batch",
                                               "--batch-size", "4", "--poll-interval", "0.05"))
        assert code == 0, out + err
        assert "mode provider-batch" in out and "provider batches open: 0" in out
        assert server.stats.batches_created == 3  # 4 + 4 + 2 requests
        assert server.stats.requests == 0 and server.stats.batch_lines == 10  # no live call
        assert_exactly_once(await exported(db, tmp_path / "out.jsonl", anyio_backend), ids)


# --- control from other processes ---------------------------------------------------------


async def test_status_pause_signal_timeout_resume_from_other_processes(
    anyio_backend: str, tmp_path: Path
) -> None:
    db, source = tmp_path / "runs.sqlite", tmp_path / "in.jsonl"
    # One call at a time; q2's first call never answers, so the driver stops right there.
    ids = write_items(source, ["a", "b", "c [[hangx1]]", "d", "e", "f"])
    async with serve_mock(MockServerConfig(model=MODEL)) as server:
        args = start_args(server, db, source, anyio_backend, "--concurrency", "1")
        async with spawn(*args) as driver:
            await server.wait_for(lambda stats: stats.hangs == 1)
            await wait_until_done(db, 2)
            snap = await status(db)  # read-only, while the other process drives
            assert (snap["status"], snap["done"], snap["pending"]) == ("running", 2, 4)

            code, out, err = await cli("runs", "pause", str(db), RUN, "--reason", "maintenance",
                                       "--backend", anyio_backend)
            assert code == 0 and f"run {RUN}: paused: maintenance" in out, out + err
            assert "runs resume" in out
            # The driver drains, but the hanging call never finishes: stop it (the call is abandoned).
            driver.send_signal(signal.SIGTERM)
        assert driver.returncode == 128 + signal.SIGTERM, driver.output
        assert "stopped driving on SIGTERM; the run is paused" in driver.output
        assert f"continue with: trio-batch-llm runs start {db} {RUN}" in driver.output

        # A start on a paused run watches it, and cannot finish before its --timeout.
        code, out, err = await cli(*args, "--timeout", "0.5")
        assert code == 3, out + err
        assert "it is paused" in err and "not finished after 0.5 s; the run is paused" in err

        code, out, err = await cli("runs", "resume", str(db), RUN, "--backend", anyio_backend)
        assert code == 0 and f"run {RUN}: running" in out, out + err
        code, out, err = await cli(*args)
        assert code == 0 and f"run {RUN}: completed" in out, out + err
        # q2 was called twice (the abandoned call, then again); every other item once.
        assert server.stats.requests == len(ids) + 1
    assert_exactly_once(await exported(db, tmp_path / "out.jsonl", anyio_backend), ids)


async def test_cancel_from_another_process_ends_the_run_for_good(anyio_backend: str, tmp_path: Path) -> None:
    db, source = tmp_path / "runs.sqlite", tmp_path / "in.jsonl"
    write_items(source, ["a", "b [[hang]]", "c", "d"])
    async with serve_mock(MockServerConfig(model=MODEL)) as server:
        args = start_args(server, db, source, anyio_backend, "--concurrency", "1")
        async with spawn(*args) as driver:
            await server.wait_for(lambda stats: stats.hangs == 1)
            await wait_until_done(db, 1)
            code, out, err = await cli("runs", "cancel", str(db), RUN, "--reason", "wrong prompts",
                                       "--backend", anyio_backend)
            assert code == 0, out + err
            assert f"run {RUN}: cancelled: wrong prompts" in out and "3 pending item(s) will never run" in out
        # The driver noticed, cancelled the hanging call and ended with the run's status.
        assert driver.returncode == 1, driver.output
        assert f"run {RUN}: cancelled: wrong prompts" in driver.output
        requests = server.stats.requests

        code, _, err = await cli("runs", "resume", str(db), RUN, "--backend", anyio_backend)
        assert code == 1 and "cannot be resumed" in err, err
        code, out, err = await cli(*args)
        assert code == 1 and f"run {RUN}: cancelled" in out, out + err
        assert server.stats.requests == requests
    snap = await status(db)
    assert (snap["status"], snap["done"], snap["termination"]["reason"]) == ("cancelled", 1, "wrong prompts")


# --- batch creates with an unknown outcome ------------------------------------------------


def batch_args(server: MockServer, db: Path, source: Path, backend: str) -> list[str]:
    # The create gets 0.2 s: then its outcome is unknown, and without a listing only an operator can tell.
    return start_args(server, db, source, backend, "--mode", "provider-batch", "--request-timeout", "0.2",
                      "--poll-interval", "0.05")


async def stop_at_an_unknown_create(server: MockServer, args: list[str], db: Path,
                                    reached: Callable[[Any], bool]) -> dict[str, Any]:
    """Drive until the create is sent and unanswered; stop the driver; the snapshot it left."""
    async with spawn(*args) as driver:
        await server.wait_for(reached)
        driver.send_signal(signal.SIGINT)
    assert driver.returncode == 128 + signal.SIGINT, driver.output
    assert f"runs resolve {db} {RUN} --created BATCH_ID" in driver.output  # the hint names the command
    snap = await status(db)
    assert snap["status"] == "running" and snap["unresolved_submission"] is not None
    assert snap["unresolved_submission"] in driver.output
    return snap


async def test_resolve_a_create_that_made_nothing(anyio_backend: str, tmp_path: Path) -> None:
    db, source = tmp_path / "runs.sqlite", tmp_path / "in.jsonl"
    ids = write_items(source, [f"prompt {n}" for n in range(5)])
    config = MockServerConfig(model=MODEL, batch_create_faults=("hang_before_create",), batch_list=False)
    async with serve_mock(config) as server:
        args = batch_args(server, db, source, anyio_backend)
        snap = await stop_at_an_unknown_create(server, args, db, lambda stats: stats.hangs == 1)
        assert (snap["batched"], snap["open_submissions"], server.stats.batches_created) == (5, 1, 0)

        # Cancelling would have to reach the provider's open batch: that needs its endpoint.
        code, _, err = await cli("runs", "cancel", str(db), RUN, "--backend", anyio_backend)
        assert code == 2 and "1 batch(es) open at the provider: pass --base-url" in err, err

        code, out, err = await cli("runs", "resolve", str(db), RUN, "--not-created",
                                   "--backend", anyio_backend)
        assert code == 0, out + err
        assert f"resolved submission {snap['unresolved_submission']}: not created" in out
        after = await status(db)
        assert (after["unresolved_submission"], after["batched"], after["pending"]) == (None, 0, 5)

        code, out, err = await cli(*args)
        assert code == 0 and f"run {RUN}: completed" in out, out + err
        assert server.stats.batches_created == 1
    assert_exactly_once(await exported(db, tmp_path / "out.jsonl", anyio_backend), ids)


async def test_resolve_a_create_that_made_a_batch(anyio_backend: str, tmp_path: Path) -> None:
    db, source = tmp_path / "runs.sqlite", tmp_path / "in.jsonl"
    ids = write_items(source, [f"prompt {n}" for n in range(5)])
    config = MockServerConfig(model=MODEL, batch_create_faults=("hang_after_create",), batch_list=False)
    async with serve_mock(config) as server:
        args = batch_args(server, db, source, anyio_backend)
        await stop_at_an_unknown_create(server, args, db, lambda stats: stats.batches_created == 1)
        [made] = server.app.batches

        code, out, err = await cli("runs", "resolve", str(db), RUN, "--created", made["id"],
                                   "--backend", anyio_backend)
        assert code == 0 and f"created as batch {made['id']}" in out, out + err
        after = await status(db)
        assert (after["unresolved_submission"], after["batched"], after["open_submissions"]) == (None, 5, 1)

        code, out, err = await cli(*args)
        assert code == 0 and f"run {RUN}: completed" in out, out + err
        assert server.stats.batches_created == 1  # collected, never submitted again
        code, _, err = await cli("runs", "resolve", str(db), RUN, "--not-created", "--backend", anyio_backend)
        assert code == 1 and "no batch submission with an unknown outcome" in err, err
    assert_exactly_once(await exported(db, tmp_path / "out.jsonl", anyio_backend), ids)


async def test_cancel_a_provider_batch_run_cancels_its_open_batch(anyio_backend: str, tmp_path: Path) -> None:
    db, source = tmp_path / "runs.sqlite", tmp_path / "in.jsonl"
    write_items(source, [f"prompt {n}" for n in range(3)])
    async with serve_mock(MockServerConfig(model=MODEL, batch_latency=3600.0)) as server:
        async with spawn(*batch_args(server, db, source, anyio_backend)) as driver:
            await server.wait_for(lambda stats: stats.batches_created == 1)
            driver.send_signal(signal.SIGINT)  # the batch stays open at the provider
        assert driver.returncode == 128 + signal.SIGINT, driver.output
        assert (await status(db))["open_submissions"] == 1

        code, out, err = await cli("runs", "cancel", str(db), RUN, "--base-url", server.base_url,
                                   "--backend", anyio_backend)
        assert code == 0, out + err
        assert [batch["status"] for batch in server.app.batches] == ["cancelling"]  # asked to cancel it
        server.app.advance_batches()
        assert server.stats.batches_cancelled == 1
    snap = await status(db)
    assert (snap["status"], snap["open_submissions"], snap["batched"], snap["done"]) == ("cancelled", 0, 0, 0)


# --- bad usage: exit status 2, nothing runs ------------------------------------------------


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def make_run(db: Path, mode: str = "live") -> None:
    """A stored run named RUN (no items), created through the library."""
    async def create() -> None:
        strategy = OpenAICompatibleStrategy(MODEL, base_url=DEAD_URL, api_key_env=None)
        identity = ArtifactIdentity(provider="openai-compatible", model=MODEL)
        async with await open_run(db, RUN, strategy, None, mode=mode, identity=identity):
            pass

    anyio.run(create)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    good = tmp_path / "good.jsonl"
    good.write_text('{"id": "a", "prompt": "x"}\n"bare"\n', encoding="utf-8")
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": \n', encoding="utf-8")
    duplicate = tmp_path / "dup.jsonl"
    duplicate.write_text('{"id": "a", "prompt": "x"}\n\n{"id": "a", "prompt": "y"}\n', encoding="utf-8")
    no_prompt = tmp_path / "noprompt.csv"
    no_prompt.write_text("id,prompt\nr1,hello\nr2,\n", encoding="utf-8")
    (tmp_path / "adir").mkdir()
    not_db = tmp_path / "text.sqlite"
    not_db.write_text("not a database\n", encoding="utf-8")
    return {"good": good, "bad_json": bad_json, "duplicate": duplicate, "no_prompt": no_prompt,
            "dir": tmp_path / "adir", "missing_dir": tmp_path / "nope" / "x", "db": tmp_path / "runs.sqlite",
            "not_db": not_db, "tmp": tmp_path}


MODEL_ARGS = ("--model", f"openai-compatible:{MODEL}", "--base-url", DEAD_URL)

START_CASES: list[tuple[str, Callable[[dict[str, Path]], list[str]], str]] = [
    ("missing input", lambda f: [str(f["db"]), RUN, str(f["tmp"] / "none.jsonl"), *MODEL_ARGS],
     "none.jsonl: no such file"),
    ("bad json", lambda f: [str(f["db"]), RUN, str(f["bad_json"]), *MODEL_ARGS],
     "bad.jsonl, line 2: invalid JSON"),
    ("duplicate id", lambda f: [str(f["db"]), RUN, str(f["duplicate"]), *MODEL_ARGS],
     "dup.jsonl, line 3, field \"id\": duplicate id 'a' (first on line 1)"),
    ("csv without prompt", lambda f: [str(f["db"]), RUN, str(f["no_prompt"]), *MODEL_ARGS],
     'noprompt.csv, line 3, field "prompt": is empty'),
    ("unknown format", lambda f: [str(f["db"]), RUN, str(f["tmp"] / "in.txt"), *MODEL_ARGS],
     "cannot tell the format"),
    ("no base url", lambda f: [str(f["db"]), RUN, str(f["good"]), "--model", "openai-compatible:m"],
     "--base-url is required with --model openai-compatible:m"),
    ("unknown provider", lambda f: [str(f["db"]), RUN, str(f["good"]), "--model", "acme:m"],
     "unknown provider 'acme'"),
    ("unknown mode", lambda f: [str(f["db"]), RUN, str(f["good"]), *MODEL_ARGS, "--mode", "offline"],
     "argument --mode: invalid choice: 'offline'"),
    ("batch flag in live mode", lambda f: [str(f["db"]), RUN, str(f["good"]), *MODEL_ARGS,
                                           "--batch-size", "5"],
     "--batch-size is not used with --mode live"),
    ("live flag in batch mode", lambda f: [str(f["db"]), RUN, str(f["good"]), *MODEL_ARGS,
                                           "--mode", "provider-batch", "--concurrency", "4"],
     "--concurrency is not used with --mode provider-batch"),
    ("batch too big", lambda f: [str(f["db"]), RUN, str(f["good"]), *MODEL_ARGS, "--mode", "provider-batch",
                                 "--batch-size", "50001"],
     "argument --batch-size: expected at most 50000"),
    ("zero timeout", lambda f: [str(f["db"]), RUN, str(f["good"]), *MODEL_ARGS, "--timeout", "0"],
     "argument --timeout: expected a number > 0, got '0'"),
    ("empty run id", lambda f: [str(f["db"]), " ", str(f["good"]), *MODEL_ARGS],
     "argument RUN_ID: must not be empty"),
    ("db is a directory", lambda f: [str(f["dir"]), RUN, str(f["good"]), *MODEL_ARGS],
     "adir: not a regular file"),
    ("db directory missing", lambda f: [str(f["missing_dir"]), RUN, str(f["good"]), *MODEL_ARGS],
     "the directory"),
    ("db is the input", lambda f: [str(f["good"]), RUN, str(f["good"]), *MODEL_ARGS],
     "good.jsonl is the input file"),
    ("not a run database", lambda f: [str(f["not_db"]), RUN, str(f["good"]), *MODEL_ARGS],
     f"cannot open run '{RUN}'"),
]


@pytest.mark.parametrize(("case", "argv", "message"), START_CASES, ids=[c[0] for c in START_CASES])
def test_start_refuses_bad_usage(capsys: pytest.CaptureFixture[str], files: dict[str, Path], case: str,
                                 argv: Callable[[dict[str, Path]], list[str]], message: str) -> None:
    code, output = run_main(capsys, "runs", "start", *argv(files))
    assert code == 2, output
    assert message in output
    assert not files["db"].exists()  # nothing was created


def test_start_refuses_another_mode_or_model_than_the_stored_run(
    capsys: pytest.CaptureFixture[str], files: dict[str, Path]
) -> None:
    db, good = str(files["db"]), str(files["good"])
    make_run(files["db"], mode="provider-batch")
    code, output = run_main(capsys, "runs", "start", db, RUN, good, *MODEL_ARGS)
    assert code == 2 and f"run '{RUN}' was started with --mode provider-batch" in output, output
    code, output = run_main(capsys, "runs", "start", db, RUN, good, "--model", "openai-compatible:other",
                            "--base-url", DEAD_URL, "--mode", "provider-batch")
    assert code == 2 and f"run '{RUN}' was started with --model openai-compatible:{MODEL}" in output, output


CONTROL = [["status"], ["pause"], ["resume"], ["cancel"], ["resolve", "--not-created"],
           ["export", "out.jsonl"]]


@pytest.mark.parametrize("words", CONTROL, ids=[w[0] for w in CONTROL])
def test_control_commands_refuse_an_unknown_database_or_run(
    capsys: pytest.CaptureFixture[str], files: dict[str, Path], words: list[str]
) -> None:
    db = str(files["db"])
    code, output = run_main(capsys, "runs", words[0], db, RUN, *words[1:])
    assert code == 2 and "runs.sqlite: no such run database" in output, output
    assert not files["db"].exists()
    make_run(files["db"])
    code, output = run_main(capsys, "runs", words[0], db, "other", *words[1:])
    assert code == 2 and "no run named 'other'" in output, output
    code, output = run_main(capsys, "runs", words[0], str(files["not_db"]), RUN, *words[1:])
    assert code == 2 and f"cannot read run '{RUN}'" in output, output


@pytest.mark.parametrize(("argv", "message"), [
    (["resolve", "DB", RUN], "one of the arguments --created --not-created is required"),
    (["resolve", "DB", RUN, "--created", "b1", "--not-created"], "not allowed with argument"),
    (["resolve", "DB", RUN, "--created", ""], "argument --created: must not be empty"),
    (["export", "DB", RUN, "OUT", "--after", "-1"], "argument --after: expected a whole number >= 0"),
    (["export", "DB", RUN, "MISSING_DIR"], "the directory"),
    (["export", "DB", RUN, "DIR"], "adir: not a regular file"),
    (["export", "DB", RUN, "DB"], "is the run database"),
], ids=["resolve-neither", "resolve-both", "resolve-empty-id", "after-negative", "out-dir-missing",
        "out-is-dir", "out-is-db"])
def test_control_argument_errors(capsys: pytest.CaptureFixture[str], files: dict[str, Path],
                                 argv: list[str], message: str) -> None:
    make_run(files["db"])
    paths = {"DB": str(files["db"]), "OUT": str(files["tmp"] / "o.jsonl"),
             "MISSING_DIR": str(files["missing_dir"]), "DIR": str(files["dir"])}
    code, output = run_main(capsys, "runs", *[paths.get(word, word) for word in argv])
    assert code == 2 and message in output, output
    assert not (files["tmp"] / "o.jsonl").exists()


def test_list_prints_one_line_per_run(capsys: pytest.CaptureFixture[str], files: dict[str, Path]) -> None:
    db = str(files["db"])
    code, output = run_main(capsys, "runs", "list", db)
    assert code == 2 and "no such run database" in output
    make_run(files["db"])
    code, output = run_main(capsys, "runs", "list", db)
    assert code == 0 and output.split("\t")[:3] == [RUN, "running", "live"], output
    code, output = run_main(capsys, "runs", "list", db, "--json")
    assert code == 0 and json.loads(output)["run_id"] == RUN
    code, output = run_main(capsys, "runs", "list", str(files["not_db"]))
    assert code == 2 and "cannot list the runs" in output, output
