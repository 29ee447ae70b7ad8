"""Issue 31, point 7: a Redis quota backend that cannot be used is a QuotaBackendError, before any call.

A wrong or missing password, a database the server does not have, nothing listening: the API
raises :class:`QuotaBackendError` (never coredis's own error) and the strategy is never called;
a URL that cannot be parsed (a port that is not a number, a database that is not one, another
scheme) is refused when the backend is made. No message holds the password. The command line
says it in one line, exit status 2, and writes no checkpoint.
"""

from __future__ import annotations

import gc
import socket
import warnings
from pathlib import Path

import pytest

from trio_batch_llm import (
    ConfigurationError,
    FakeStrategy,
    ProcessorConfig,
    QuotaBackendError,
    RedisQuotaBackend,
    process_prompts,
)
from trio_batch_llm.cli import main

from .._servers.redis import PASSWORD, RedisServer

WRONG = "WRONG-pw-5678"
DEAD_URL = "http://127.0.0.1:9/v1"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _urls(server: RedisServer) -> dict[str, tuple[str, str]]:
    """name -> (URL, a fragment the message must hold)."""
    port = server.port
    return {
        "wrong-password": (f"redis://:{WRONG}@127.0.0.1:{port}/0", "AuthenticationFailureError"),
        "no-password": (f"redis://127.0.0.1:{port}/0", "AuthenticationRequiredError"),
        "user-and-wrong-password": (f"redis://default:{WRONG}@127.0.0.1:{port}/0",
                                    "AuthenticationFailureError"),
        "database-out-of-range": (f"redis://:{PASSWORD}@127.0.0.1:{port}/99", "DB index is out of range"),
        "nothing-listening": (f"redis://:{PASSWORD}@127.0.0.1:{_closed_port()}/0", "unreachable_timeout"),
    }


CASES = ["wrong-password", "no-password", "user-and-wrong-password", "database-out-of-range",
         "nothing-listening"]


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES)
async def test_a_backend_that_refuses_is_a_quota_backend_error_before_any_call(
    redis_server: RedisServer, case: str,
) -> None:
    url, fragment = _urls(redis_server)[case]
    strategy = FakeStrategy()
    backend = RedisQuotaBackend(url, unreachable_timeout=0.3, connect_timeout=0.2, command_timeout=1.0)
    config = ProcessorConfig(concurrency=4, max_requests_per_minute=1000, quota_backend=backend)
    errors: list[BaseException] = []
    # coredis 6.9 leaves the memory streams of a connection that never connected unclosed: their
    # ResourceWarning is expected here (see test_quota_redis's unreachable case).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            try:
                await process_prompts(strategy, ["a", "b", "c"], config=config)
            except* QuotaBackendError as group:
                errors.extend(group.exceptions)
        finally:
            gc.collect()
    assert len(errors) == 1, errors
    message = str(errors[0])
    assert fragment in message and "127.0.0.1:" in message, message
    assert WRONG not in message and PASSWORD not in message
    assert strategy.calls == []  # the strategy was never called


@pytest.mark.parametrize(("url", "fragment"), [
    (f"redis://:{WRONG}@127.0.0.1:abc/0", "port 'abc'"),
    (f"redis://:{WRONG}@127.0.0.1:99999/0", "port '99999'"),
    (f"redis://:{WRONG}@127.0.0.1:6379/zero", "database 'zero'"),
    (f"redis://:{WRONG}@127.0.0.1:6379/-1", "database '-1'"),
    (f"redis://:{WRONG}@127.0.0.1:6379/0?db=x", "database 'x'"),
    (f"http://:{WRONG}@127.0.0.1:6379/0", "redis://, rediss:// or unix://"),
    ("unix://", "socket path"),
])
def test_a_url_that_cannot_be_parsed_is_refused_when_the_backend_is_made(url: str, fragment: str) -> None:
    with pytest.raises(QuotaBackendError) as caught:
        RedisQuotaBackend(url)
    assert isinstance(caught.value, ConfigurationError)  # also what every bad config value raises
    message = str(caught.value)
    assert fragment in message and "quota_backend" in message
    assert WRONG not in message


def _cli(capsys: pytest.CaptureFixture[str], tmp_path: Path, url: str) -> tuple[int, str, Path]:
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "prompt": "one"}\n')
    out = tmp_path / "results.jsonl"
    code = main(["run", str(source), "--model", "openai-compatible:m", "--base-url", DEAD_URL,
                 "--out", str(out), "--rpm", "100", "--quota", url])
    captured = capsys.readouterr()
    return code, captured.out + captured.err, out


@pytest.mark.parametrize("case", ["wrong-password", "no-password", "database-out-of-range"])
def test_the_cli_says_it_in_one_line_with_exit_status_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, redis_server: RedisServer, case: str,
) -> None:
    url, fragment = _urls(redis_server)[case]
    code, output, out = _cli(capsys, tmp_path, url)
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith("trio-batch-llm: error: --quota: the Redis quota backend ")
    assert fragment in lines[0]
    assert WRONG not in output and PASSWORD not in output and "Traceback" not in output
    assert not out.exists()  # refused before the checkpoint was made


def test_the_cli_refuses_a_url_it_cannot_parse_without_a_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    code, output, out = _cli(capsys, tmp_path, f"redis://:{WRONG}@127.0.0.1:abc/0")
    assert code == 2, output
    assert output.strip().splitlines() == [
        "trio-batch-llm: error: --quota redis://<redacted>@127.0.0.1:abc/0: the port 'abc' is not a number"
        " from 0 to 65535"]
    assert WRONG not in output and "Traceback" not in output
    assert not out.exists()


def test_the_cli_waits_its_bound_for_nothing_listening_then_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import functools

    from trio_batch_llm._cli import _args

    # The command line keeps the backend's default bound (30 s); a test has no half minute.
    monkeypatch.setattr(_args, "RedisQuotaBackend",
                        functools.partial(RedisQuotaBackend, unreachable_timeout=0.3, connect_timeout=0.2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            code, output, out = _cli(capsys, tmp_path, f"redis://:{WRONG}@127.0.0.1:{_closed_port()}/0")
        finally:
            gc.collect()
    assert code == 2, output
    assert "--quota" in output and "unreachable" in output and WRONG not in output
    assert "Traceback" not in output and not out.exists()


def test_a_working_backend_still_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                      redis_url: str) -> None:
    code, output, _ = _cli(capsys, tmp_path, redis_url)
    assert "error: --quota" not in output and PASSWORD not in output  # past the check: the run ran
    assert code == 1  # the run's one call went to a closed port


def test_the_resume_note_names_the_quota_flag_not_base_url() -> None:
    from trio_batch_llm._cli._render import redaction_note, shown_command

    command = shown_command(["run", "in.jsonl", "--quota", f"redis://:{WRONG}@127.0.0.1:6379/0", "--resume"])
    assert WRONG not in command
    assert redaction_note(command) == " (the password in --quota is shown as <redacted>: put it back)"
    keyed = shown_command(["run", "in.jsonl", "--base-url", "http://u:sk-1@h/v1", "--resume"])
    assert "--api-key-env" in redaction_note(keyed)
