"""What a first-time reader copies or reads first says what really happens.

The README's "Use it" program runs (against the mock server) and its snippets use no name
they do not define; the home page's "Ten lines" are ten lines of code; the getting-started
page's output is the program's real output, log lines included (modulo times and the order of
streamed results); the Redis example fails, naming Redis, when there is none; the migration
page says what its "before" program needs; and the benchmarks page and its limits plot speak
to users, not to the project's issue tracker.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import anyio
import pytest

from .._paths import ROOT

DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"


def _fenced(text: str, language: str) -> list[str]:
    """The bodies of the fenced blocks of ``language``, in order (indented fences too)."""
    pattern = rf"^([ \t]*)```{language}\n(.*?)^\1```"
    return [re.sub(rf"(?m)^{re.escape(indent)}", "", body)
            for indent, body in re.findall(pattern, text, flags=re.DOTALL | re.MULTILINE)]


def _section(text: str, heading: str) -> str:
    """The text under ``## heading`` up to the next heading of that level."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, flags=re.DOTALL | re.MULTILINE)
    assert match is not None, f"no section {heading!r}"
    return match.group(1)


# --- the README ---------------------------------------------------------------------------------


def _readme_blocks() -> list[str]:
    blocks = _fenced(_section((ROOT / "README.md").read_text(encoding="utf-8"), "Use it"), "python")
    assert len(blocks) == 2, "the README's 'Use it' shows a program and a stream snippet"
    return blocks


def _bound_and_used(tree: ast.AST) -> tuple[set[str], set[str]]:
    bound: set[str] = set()
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return bound, used


def test_readme_snippets_use_only_names_they_define() -> None:
    """The stream snippet goes inside the program's ``main()``: it may use what the program binds."""
    known = set(dir(builtins))
    for number, block in enumerate(_readme_blocks(), start=1):
        bound, used = _bound_and_used(ast.parse(textwrap.dedent(block)))
        known |= bound
        assert used <= known, f"README 'Use it' block {number} uses undefined {sorted(used - known)}"


@pytest.mark.anyio
async def test_readme_program_runs_against_the_mock(anyio_backend: str, tmp_path: Path) -> None:
    pytest.importorskip("openai")
    from trio_batch_llm.mock import serve_mock

    program = tmp_path / "use_it.py"
    program.write_text(_readme_blocks()[0], encoding="utf-8")
    async with serve_mock() as server:
        # The program names "openai:gpt-4o-mini" and reads its key; the SDK's own variables send it here.
        env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "sk-docs-test"}
        done = await anyio.run_process([sys.executable, str(program)], env=env, check=False, cwd=tmp_path)
    output = (done.stdout + done.stderr).decode()
    assert done.returncode == 0, output
    assert "Batch completed" in output
    assert re.search(r"items\s+2\s+succeeded 2\s+failed 0", output), output


# --- the home page's "Ten lines" ------------------------------------------------------------------


def _include(target: str) -> str:
    """What ``--8<-- "target"`` puts on the page: the file, or its ``[start:NAME]``..``[end:NAME]`` part."""
    path, _, name = target.partition(".py:")
    text = (ROOT / (path + ".py" if name else target)).read_text(encoding="utf-8")
    if not name:
        return text
    match = re.search(rf"# --8<-- \[start:{name}\]\n(.*?)# --8<-- \[end:{name}\]", text, flags=re.DOTALL)
    assert match is not None, f"{target}: no section {name!r}"
    return match.group(1)


def _ten_lines_programs() -> list[tuple[str, str]]:
    section = _section((DOCS / "index.md").read_text(encoding="utf-8"), "Ten lines")
    targets = re.findall(r'--8<--\s+"([^"]+)"', section)
    assert len(targets) == 2, "the Trio and the asyncio tab"
    return [(target, _include(target)) for target in targets]


@pytest.mark.parametrize(("target", "shown"), _ten_lines_programs())
def test_ten_lines_are_ten_lines_of_code(target: str, shown: str) -> None:
    code = [line for line in shown.splitlines() if line.strip()]
    assert len(code) <= 10, f"{target} shows {len(code)} lines of code under 'Ten lines'"
    # What is shown is the whole program (its docstring apart), so it runs as shown.
    whole = (ROOT / target.partition(":")[0]).read_text(encoding="utf-8")
    assert 'if __name__ == "__main__":' in shown
    assert "async def main()" in shown
    assert whole.rstrip().endswith("# --8<-- [end:shown]")
    assert ast.get_docstring(ast.parse(whole)) is not None
    ast.parse(shown)


# --- printed output shown on the pages --------------------------------------------------------------

_TIMED = re.compile(r"^\s+(wall time|admission|execution)\b")


def _normalized(lines: list[str]) -> list[str]:
    """Times masked; the lines after the summary (streamed results, their log line) in sorted order."""
    masked = [" ".join(re.sub(r"\d[\d,.]*", "#", line).split()) if _TIMED.match(line) else line.rstrip()
              for line in lines]
    cut = max((i for i, line in enumerate(masked) if line.lstrip().startswith("execution")), default=-1) + 1
    return masked[:cut] + sorted(masked[cut:])


def _unwrapped(block: str) -> list[str]:
    """The page's output block with its wrapped lines joined: a continuation is indented by four spaces."""
    lines: list[str] = []
    for line in block.rstrip("\n").splitlines():
        if re.match(r"^ {4}\S", line) and lines:
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return lines


def _printed(example: str) -> list[str]:
    """What a reader running the example sees: standard output and standard error, as they come."""
    done = subprocess.run([sys.executable, "-u", str(EXAMPLES / example)], cwd=EXAMPLES, timeout=120,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    assert done.returncode == 0, done.stdout
    return done.stdout.rstrip("\n").splitlines()


def test_getting_started_shows_what_the_program_prints() -> None:
    pytest.importorskip("hypercorn")
    page = (DOCS / "getting-started" / "trio.md").read_text(encoding="utf-8")
    shown = _fenced(_section(page, "A first program"), "text")[0]
    assert _normalized(_unwrapped(shown)) == _normalized(_printed("first_batch_trio.py"))


def test_home_page_shows_what_the_ten_lines_print() -> None:
    pytest.importorskip("hypercorn")
    page = (DOCS / "index.md").read_text(encoding="utf-8")
    shown = _fenced(_section(page, "Ten lines"), "text")[0]
    assert _normalized(_unwrapped(shown)) == _normalized(_printed("quickstart_trio.py"))


# --- examples that need something the project does not start ------------------------------------


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_redis_example_without_redis_fails_naming_redis() -> None:
    pytest.importorskip("coredis")
    url = f"redis://:not-shown@127.0.0.1:{_closed_port()}/0"
    done = subprocess.run([sys.executable, str(EXAMPLES / "shared_quota_redis.py")], cwd=EXAMPLES,
                          env={**os.environ, "REDIS_URL": url}, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "calls went" not in done.stdout
    assert "is a Redis server running at redis://<redacted>@127.0.0.1:" in done.stderr
    assert "not-shown" not in done.stdout + done.stderr


def test_the_migration_page_says_what_the_before_program_needs() -> None:
    page = (DOCS / "migration.md").read_text(encoding="utf-8")
    intro = _section(page, "The same program, before and after").split("=== ", 1)[0]
    install = "pip install async-batch-llm==0.28.0"
    assert install in intro
    assert install in (EXAMPLES / "migration_before.py").read_text(encoding="utf-8")


# --- the benchmarks page and its limits plot ---------------------------------------------------------


def test_the_benchmarks_page_speaks_to_users() -> None:
    page = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    assert re.findall(r"(?i)\bissues? \d+", page) == []
    assert re.findall(r"\bint\d\d\b", page) == []  # the project's integration branches
    headers = [line for i, line in enumerate(page.splitlines()[:-1])
               if line.startswith("|") and re.match(r"^\|( ?-+:? ?\|)+$", page.splitlines()[i + 1])]
    empty = [line for line in headers if not line.replace("|", "").strip()]
    assert empty == [], "a table with an empty header row"
    glance = _section(page, "At a glance")
    for internal in ("ABL", "floor", "drain", "redesign"):
        assert internal not in glance, f"'At a glance' says {internal!r}"


def _limits_benchmark() -> ModuleType:
    bench = ROOT / "benchmarks"
    sys.path.insert(0, str(bench))  # the script imports its siblings (_common, _mock_process)
    try:
        spec = importlib.util.spec_from_file_location("bench_limits_docs", bench / "limits.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(bench))


def test_the_limits_plot_names_every_client_and_scenario_in_words() -> None:
    limits = _limits_benchmark()
    for variant in limits.VARIANTS:
        label = limits.VARIANT_LABELS[variant.name]
        assert " " in label and not re.search(r"\b(ours|abl)\b|-\d*x|no-", label), label
    for name in limits.SCENARIOS:
        assert " " in limits.SCENARIO_TITLES[name]


def test_the_limits_plot_has_a_legend_and_labels_every_bar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    limits = _limits_benchmark()
    import json

    import matplotlib.figure

    rows = json.loads((ROOT / "benchmarks" / "results" / "limits.json").read_text(encoding="utf-8"))
    drawn: list[matplotlib.figure.Figure] = []
    monkeypatch.setattr(limits, "results_path", lambda name: tmp_path / name)
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, *a, **k: drawn.append(self))
    limits.plot(rows)
    (figure,) = drawn
    assert figure.legends, "the plot has no legend"
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert "async-batch-llm 0.28 (asyncio)" in legend and "goal" in legend
    for axes in figure.axes:
        bars = len(axes.patches)
        assert bars and len(axes.texts) == bars, f"{axes.get_title()}: a bar without its value"
    texts = [text.get_text() for axes in figure.axes for text in axes.texts]
    empty = [text for text in texts if text.startswith(" 0 %")]
    assert empty and all("nothing after its first 429" in text for text in empty)


def test_the_changelog_and_the_guides_speak_to_users() -> None:
    # Our issue numbers mean nothing to a reader: say what changed and why it matters instead.
    pages = [ROOT / "CHANGELOG.md", ROOT / "README.md", *sorted(DOCS.glob("**/*.md"))]
    number = re.compile(r"(?i)(?<!pydantic-ai )\bissues? #?\d+")  # another project's issue is a citation
    texts = {page.name: page.read_text(encoding="utf-8") for page in pages}
    assert {name: found for name, text in texts.items() if (found := number.findall(text))} == {}
