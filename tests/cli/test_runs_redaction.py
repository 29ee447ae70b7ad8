"""The note after a printed ``runs`` command names where its redacted secret was (issue 31, same kind as 11).

``runs start`` prints the command to continue with, its secrets shown as ``<redacted>``, and a note
saying what to put back. The run database's password (in a ``postgresql://`` URL or a libpq
``password=``) is not a key in ``--base-url``: the note says so, and names every place a secret was
taken out of.
"""

from __future__ import annotations

import pytest

from trio_batch_llm._cli._render import redaction_note, shown_command
from trio_batch_llm._cli._runs_db import RunDb
from trio_batch_llm._cli._runs_start import _shown_argv
from trio_batch_llm.cli import main

from .._servers.postgres import PASSWORD, USER, PostgresServer
from .test_runs import RUN, make_run

SECRET = "s3cret-Pg-pw"
URL = f"postgresql://app:{SECRET}@db.internal:5432/runs"
CONNINFO = f"host=db.internal port=5432 user=app password={SECRET} dbname=runs"
START = ["runs", "start", "DB", "nightly", "in.jsonl", "--model", "openai-compatible:m"]


def _printed(db: str, *extra: str) -> str:
    """The command ``runs start`` prints, as it makes it."""
    argv = [db if word == "DB" else word for word in START] + list(extra)
    command = shown_command(_shown_argv(argv, db, RunDb.of(db)))
    assert SECRET not in command and "<redacted>" in command
    return command


@pytest.mark.parametrize("db", [URL, CONNINFO], ids=["url", "libpq-keywords"])
def test_the_note_names_the_run_database_not_base_url(db: str) -> None:
    note = redaction_note(_printed(db, "--base-url", "http://127.0.0.1:9/v1"))
    assert "the run database" in note and "--base-url" not in note and "--api-key-env" not in note, note
    assert "PGPASSWORD" in note, "where libpq also takes the password from"


@pytest.mark.parametrize("db", [URL, CONNINFO], ids=["url", "libpq-keywords"])
def test_the_note_names_each_place_a_secret_was_taken_from(db: str) -> None:
    note = redaction_note(_printed(db, "--base-url", "http://user:sk-key@127.0.0.1:9/v1",
                                   "--quota", "redis://:redis-pw@127.0.0.1:6379/0"))
    assert "the run database" in note and "--base-url" in note and "--quota" in note, note
    assert "--api-key-env" in note


def test_the_notes_without_a_database_password_are_as_before() -> None:
    path = "/tmp/runs.sqlite"
    assert redaction_note(shown_command([*START, "--base-url", "http://u:sk-1@h/v1"])) == (
        " (a key in --base-url is shown as <redacted>: put it back, or better, pass it in an environment "
        "variable named by --api-key-env)")
    quota = shown_command([path, "--quota", "redis://:pw@127.0.0.1:6379/0"])
    assert redaction_note(quota) == " (the password in --quota is shown as <redacted>: put it back)"
    assert redaction_note(shown_command([path, "--base-url", "http://h/v1"])) == ""


@pytest.mark.parametrize("form", ["url", "libpq-keywords"])
def test_runs_pause_on_postgresql_prints_the_note_for_the_database(
    postgres_server: PostgresServer, postgres_url: str, capsys: pytest.CaptureFixture[str], form: str
) -> None:
    db = postgres_url if form == "url" else (
        f"host=127.0.0.1 port={postgres_server.port} user={USER} password='{PASSWORD}' "
        f"dbname={postgres_url.rsplit('/', 1)[1]}")
    make_run(db)  # type: ignore[arg-type]  # a PostgreSQL database is given as its text
    code = main(["runs", "pause", db, RUN])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert PASSWORD not in out + err
    line = next(line for line in out.splitlines() if "continue with:" in line)
    assert "<redacted>" in line and "the run database's password is shown as <redacted>" in line, line
    assert "--base-url" not in line, line
