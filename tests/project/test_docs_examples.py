"""The documentation's examples run, print what the pages say they print, and the site builds.

Every example under ``docs/examples/`` is listed in ``EXAMPLES`` with the
backends it runs on and what its output must contain (or, when the page
shows its output, the exact output file the page includes). Each run loads
the file afresh, so module-level state never leaks from one run to the next,
and calls its ``main()`` under ``anyio.run``. ``trio-virtual`` runs Trio under
``MockClock(autojump_threshold=0)``: those examples use provider-scale times
and take no real time.

Other checks keep the pages honest: every example is shown on some page and
every file a page includes exists; the Trio and asyncio versions of the same
program define the same ``main()``; the example test module passes under
pytest; every ``trio-batch-llm`` command line shown in ``docs/cli.md`` parses;
and, when mkdocs is installed, ``mkdocs build --strict`` succeeds.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import pytest

from .._paths import ROOT
from .test_exports import NOT_FOR_USERS

DOCS = ROOT / "docs"
EXAMPLES_DIR = DOCS / "examples"
OUTPUTS_DIR = EXAMPLES_DIR / "output"

BOTH = ("trio", "asyncio")
TRIO = ("trio",)
ASYNCIO = ("asyncio",)
VIRTUAL = ("trio-virtual",)  # Trio on a virtual clock: provider-scale times in no real time


@dataclass(frozen=True)
class Example:
    name: str
    backends: tuple[str, ...]
    expect: tuple[str, ...] = ()
    """Substrings of the output (used when the page shows no output file)."""
    needs: tuple[str, ...] = ()
    """Modules that must be importable; the example is skipped without them."""

    @property
    def output_file(self) -> Path:
        return OUTPUTS_DIR / f"{self.name}.txt"


SERVER = ("hypercorn", "httpx2")
EXAMPLES = [
    Example("quickstart_trio", BOTH, ("Batch completed", "succeeded 100   failed 0"), SERVER),
    Example("quickstart_asyncio", BOTH, ("Batch completed", "succeeded 100   failed 0"), SERVER),
    Example("first_batch_trio", BOTH, (
        "r1: echo: Great battery life, terrible screen.",
        "r2 failed (content_policy): ProviderError: HTTP 400",
        "r3: echo: Does exactly what it says.",
        "streamed r1 True", "streamed r2 False", "streamed r3 True",
        "echo: Say hello.",
    ), SERVER),
    Example("first_batch_asyncio", BOTH, ("r2 failed (content_policy)", "echo: Say hello."), SERVER),
    Example("trio_deadline", TRIO, (
        "cancelled: True;", "calls still running: 0",
        "batch_deadline: ", "100 results in all",
    )),
    Example("asyncio_service", ASYNCIO, (
        "echo: question 0 (never more than 4 calls at once)",
        "timed out; requests still pending: 0",
        "batch timed out; calls still running: 0",
    )),
    Example("existing_client", BOTH, (
        "10 succeeded, 0 failed, 12 requests",
        "tokens: {'input_tokens': 40, 'output_tokens': 10, 'total_tokens': 50}",
    )),
    Example("custom_strategy", BOTH, ("{'target': 'fr'}", "20 translated; sessions opened 1, closed 1")),
    Example("provider_openai", BOTH, (
        "responses: 'echo: Name a colour.'", "chat: 'echo: Name a colour.'",
        "own client: echo: Hi.", "requests the server saw: 3",
    ), (*SERVER, "openai")),
    Example("provider_anthropic", BOTH, (
        "input=12 cache_write=9 cache_read=0", "input=12 cache_write=0 cache_read=9", "City",
        "requests the server saw: 3",
    ), (*SERVER, "anthropic", "pydantic")),
    Example("provider_compatible", BOTH, (
        "{'role': 'system', 'content': 'Answer in one word.'}", "'max_tokens': 16", "'top_k': 20",
        "the server received top_k = 20", "OpenAICompatibleStrategy meta-llama/Llama-3.1-8B-Instruct",
    ), SERVER),
    Example("provider_gemini", BOTH, (
        "'generationConfig': {'temperature': 0.0, 'maxOutputTokens': 16}", "[True, True]", "Capital",
        "succeeded: 4 cached tokens > 0: True", "GeminiStrategy gemini-2.5-flash",
    ), (*SERVER, "pydantic")),
    Example("pydantic_ai_agent", ASYNCIO, (
        "item-0: 'echo: You answer in one short sentence.\\nName a colour.' requests=1",
        "City 1 succeeded",
    ), (*SERVER, "openai", "pydantic_ai")),
    Example("mock_server", BOTH, ("61/61 succeeded after 69 requests: 1 rate-limited, 7 server errors",),
            SERVER),
    Example("rate_limits", VIRTUAL),
    Example("cooldown", VIRTUAL),
    Example("shared_limits", BOTH, (
        "two batches, at most 8 calls in flight together", "50 requests, at most 8 in flight",
    )),
    Example("retries", BOTH),
    Example("with_cleanup", BOTH, ("body error kept: the upload failed; note: True", "value: 42")),
    Example("escalation", BOTH),
    Example("guardrails", BOTH, (
        "item deadline: completed;", "['deadline']",
        "batch deadline: batch_deadline;", "['deadline', 'not_executed']",
        "fail fast: aborted;", "['authentication', 'not_executed']",
        "token budget: budget_exhausted;", "cost budget: budget_exhausted;",
    )),
    Example("checkpoint_resume", BOTH),
    Example("caching", BOTH, needs=SERVER),
    Example("cost_identity", BOTH, needs=SERVER),
    Example("output_codec", BOTH),
    Example("structured_output", BOTH, needs=(*SERVER, "pydantic")),
    Example("durable_run", BOTH, needs=SERVER),
    Example("batch_run", BOTH, needs=SERVER),
    Example("batch_providers", BOTH, needs=(*SERVER, "anthropic")),
    Example("scaling_out", BOTH, (
        "60 results from 3 drivers; re-executed after a lease expiry: 0", "the mock answered 60 requests",
    ), needs=SERVER),
    Example("streaming", BOTH, ("consumed 200 results; read ", "calls still running: 0")),
    Example("processor_streaming", BOTH, ("20 results; first few in completion order",)),
    Example("observability", BOTH),
    Example("async_observer", VIRTUAL, ("batch: 0.02 s; sink caught up after 0.41 s",
                                        "shipped 20 items; it saw: 20 succeeded, 0 failed")),
    Example("tracing_metrics", BOTH, needs=("opentelemetry.sdk", "prometheus_client")),
    Example("migration_before", ASYNCIO, ("2 True", "streamed item_0", "echo: hello"), ("async_batch_llm",)),
    Example("migration_after", BOTH, ("2 True", "streamed item-", "echo: hello")),
    Example("migration_context_manager_asyncio", BOTH, (
        "Processed: 5 items", "Succeeded: 5", "cleaned up automatically",
        "Without a block: 3 succeeded; closed",
    )),
    Example("migration_single_call_asyncio", BOTH, (
        "call_result() -> success=True, tokens=20", "recovered after a 429 -> 'Re: Try me once.'",
        "success=False, error='RuntimeError: mock failure'", "call() raised LLMCallError",
    )),
    Example("migration_gateway_asyncio", BOTH, (
        "request #7 -> 'answer to: request #7'", "submit after close -> AdmissionClosedError",
        "over-cap submit -> success=False", "timed-out submit -> success=False",
        "submit() raises LLMCallError -> deadline",
    )),
    Example("migration_callable_asyncio", BOTH, (
        "first run: 5 rows saved, 7 client calls", "prepared 1, closed 1",
        "resumed run: 5 rows saved, 0 client calls",
    )),
]
# Files under docs/examples that are not run as programs: the pipeline and its
# pytest module (run by test_the_example_test_module_passes); examples that need a server.
SUPPORT_FILES = {"my_pipeline", "test_my_pipeline", "shared_quota_redis"}  # last: test_quota_redis.py


def _load(example: Example, backend: str) -> ModuleType:
    """A fresh module object per run: examples keep state at module level."""
    path = EXAMPLES_DIR / f"{example.name}.py"
    spec = importlib.util.spec_from_file_location(f"docs_example_{example.name}_{backend}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_main(module: ModuleType, backend: str) -> None:
    if backend == "trio-virtual":
        import trio.testing

        options: dict[str, Any] = {"clock": trio.testing.MockClock(autojump_threshold=0)}
        anyio.run(module.main, backend="trio", backend_options=options)
    else:
        anyio.run(module.main, backend=backend)


def _cases() -> Iterator[Any]:
    for example in EXAMPLES:
        for backend in example.backends:
            yield pytest.param(example, backend, id=f"{example.name}-{backend}")


@pytest.mark.parametrize(("example", "backend"), list(_cases()))
def test_example_runs(example: Example, backend: str, capsys: pytest.CaptureFixture[str]) -> None:
    for needed in example.needs:
        pytest.importorskip(needed)
    _run_main(_load(example, backend), backend)
    printed = capsys.readouterr().out
    if example.output_file.exists():
        # The page includes this file as the example's output: it must be exact.
        assert printed == example.output_file.read_text(encoding="utf-8")
    else:
        assert example.expect, f"{example.name}: give it expected output or an output file"
        for fragment in example.expect:
            assert fragment in printed, f"{fragment!r} not in the output of {example.name}:\n{printed}"


def test_streaming_reads_only_what_it_needs(capsys: pytest.CaptureFixture[str]) -> None:
    example = next(e for e in EXAMPLES if e.name == "streaming")
    for backend in example.backends:
        _run_main(_load(example, backend), backend)
        match = re.search(r"consumed 200 results; read (\d+) of", capsys.readouterr().out)
        assert match is not None
        # 200 consumed, plus at most what the result queue (16), the workers (8) and the
        # input queue (32) hold, plus one item in the producer's hands per worker of slack.
        assert 200 <= int(match.group(1)) <= 200 + 16 + 8 + 32 + 8


def _example_files() -> set[str]:
    return {path.stem for path in EXAMPLES_DIR.glob("*.py")}


def test_every_example_file_is_listed() -> None:
    listed = {example.name for example in EXAMPLES}
    assert len(listed) == len(EXAMPLES), "an example is listed twice"
    assert _example_files() == listed | SUPPORT_FILES


def test_every_output_file_belongs_to_a_listed_example() -> None:
    listed = {example.name for example in EXAMPLES}
    assert {path.stem for path in OUTPUTS_DIR.glob("*.txt")} <= listed


_SNIPPET = re.compile(r'--8<--\s+"([^"]+)"')


def _snippets() -> dict[str, list[Path]]:
    """Each file a page includes, and the pages including it."""
    found: dict[str, list[Path]] = {}
    for page in DOCS.rglob("*.md"):
        for target in _SNIPPET.findall(page.read_text(encoding="utf-8")):
            target = re.sub(r"\.py:[\w-]+$", ".py", target)  # "file.py:section": part of the file
            found.setdefault(target, []).append(page)
    return found


def test_every_included_file_exists() -> None:
    for target, pages in _snippets().items():
        assert (ROOT / target).is_file(), f"{target} (included by {pages}) does not exist"


def test_every_example_is_shown_on_a_page() -> None:
    shown = {Path(target).stem for target in _snippets() if target.startswith("docs/examples/")}
    assert _example_files() <= shown
    outputs = {path.stem for path in OUTPUTS_DIR.glob("*.txt")}
    assert outputs <= {Path(t).stem for t in _snippets() if t.startswith("docs/examples/output/")}


CONTENT_COLUMNS = 88
"""What the site's content column shows of a code block without a horizontal scroll bar."""


def _code_lines() -> Iterator[tuple[str, int, str]]:
    """Every line a reader sees in a code block: the example files, their outputs, and the
    fenced blocks written into the pages (an include line stands for its file)."""
    for path in sorted([*EXAMPLES_DIR.glob("*.py"), *OUTPUTS_DIR.glob("*.txt")]):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            yield str(path.relative_to(ROOT)), number, line
    for page in sorted(DOCS.rglob("*.md")):
        inside = False
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
            if line.lstrip().startswith("```"):
                inside = not inside
            elif inside and "--8<--" not in line:
                yield str(page.relative_to(ROOT)), number, line


def test_code_fits_the_content_column() -> None:
    wide = [f"{where}:{number} ({len(line)})" for where, number, line in _code_lines()
            if len(line) > CONTENT_COLUMNS]
    assert wide == []


def test_no_example_or_page_uses_a_private_module() -> None:
    """What a reader copies imports public names only: ``trio_batch_llm._x`` is ours to change."""
    readme = ROOT / "README.md"
    lines = [*_code_lines(), *((str(readme.name), n, line) for n, line in
                               enumerate(readme.read_text(encoding="utf-8").splitlines(), start=1))]
    private = [f"{where}:{number}: {line.strip()}" for where, number, line in lines
               if PRIVATE_MODULE.search(line)]
    assert private == []


PRIVATE_MODULE = re.compile(r"\btrio_batch_llm\._[\w.]*")


def _main_source(name: str) -> str:
    tree = ast.parse((EXAMPLES_DIR / f"{name}.py").read_text(encoding="utf-8"))
    mains = [node for node in tree.body if isinstance(node, ast.AsyncFunctionDef) and node.name == "main"]
    assert len(mains) == 1
    return ast.dump(mains[0])


@pytest.mark.parametrize("program", ["quickstart", "first_batch"])
def test_trio_and_asyncio_versions_are_the_same_program(program: str) -> None:
    assert _main_source(f"{program}_trio") == _main_source(f"{program}_asyncio")


@pytest.mark.parametrize("name", sorted(e.name for e in EXAMPLES))
def test_example_runs_as_a_script(name: str) -> None:
    """Each example ends in the ``__main__`` block a reader runs it with, on the backend it is shown on."""
    source = (EXAMPLES_DIR / f"{name}.py").read_text(encoding="utf-8")
    tail = source.split('if __name__ == "__main__":', 1)
    assert len(tail) == 2, f"{name} has no __main__ block"
    example = next(e for e in EXAMPLES if e.name == name)
    if example.backends == ASYNCIO:
        assert "asyncio.run(main())" in tail[1]
    elif example.backends == VIRTUAL:
        assert "trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))" in tail[1]
    elif name.endswith("_asyncio"):
        assert "asyncio.run(main())" in tail[1]
    else:
        assert "trio.run(main)" in tail[1]


def test_the_example_test_module_passes() -> None:
    pytest.importorskip("hypercorn")
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "docs/examples/test_my_pipeline.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "7 passed, 1 skipped" in completed.stdout


def _cli_commands() -> list[str]:
    page = (DOCS / "cli.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```text\n(.*?)```", page, flags=re.DOTALL)
    # A command may go on over several lines, each but the last ending in a backslash.
    lines = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    return [" ".join(line.split()) for line in lines if line.startswith("trio-batch-llm ")]


def test_cli_page_shows_every_command() -> None:
    shown = {shlex.split(line)[1] for line in _cli_commands()}
    assert shown == {"run", "export", "runs", "demo", "serve-mock"}


@pytest.mark.parametrize("line", _cli_commands())
def test_cli_command_lines_in_the_docs_parse(line: str) -> None:
    from trio_batch_llm.cli import build_parser

    args = build_parser().parse_args(shlex.split(line)[1:])
    assert args.command == shlex.split(line)[1]


def test_cli_options_in_the_docs_exist() -> None:
    """Every ``--option`` the CLI page mentions is an option of some subcommand."""
    from trio_batch_llm.cli import build_parser

    def options(parser: argparse.ArgumentParser) -> set[str]:
        """Every option string of ``parser`` and its subcommands, at any depth (``runs start``)."""
        found = set(parser._option_string_actions)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    found |= options(sub)
        return found

    known = options(build_parser())
    mentioned = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", (DOCS / "cli.md").read_text(encoding="utf-8")))
    assert mentioned <= known, f"the CLI page mentions unknown options: {sorted(mentioned - known)}"


@pytest.mark.timeout(300)  # the build's own limit below; on a busy machine it passes the default 60 s
def test_the_site_builds_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings")
    site = tmp_path / "site"
    completed = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(site)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    limits = (site / "guides" / "limits" / "index.html").read_text(encoding="utf-8")
    assert "calls started per second" in limits  # the example output was included
    reference = (site / "reference" / "entry-points" / "index.html").read_text(encoding="utf-8")
    assert "process_stream" in reference and ":class:" not in reference
    # No page names a private module, not even in a tooltip (the build hook refuses it too).
    private = sorted({f"{page.relative_to(site)}: {m}" for page in site.rglob("*.html")
                      for m in PRIVATE_MODULE.findall(page.read_text(encoding="utf-8"))})
    assert private == []
    owners = (site / "reference" / "owners" / "index.html").read_text(encoding="utf-8")
    assert 'id="trio_batch_llm.ParallelBatchProcessor.aclose"' in owners  # inherited from a private base
    assert "HostedOwner" not in owners
    rendered = "".join(p.read_text(encoding="utf-8") for p in (site / "reference").rglob("*.html"))
    assert [name for name in NOT_FOR_USERS if f'id="trio_batch_llm.{name}"' in rendered
            or f'id="trio_batch_llm.mock.{name}"' in rendered] == []
