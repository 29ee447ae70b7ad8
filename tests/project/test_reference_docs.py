"""The API reference shows public names only, and typed keyword arguments (issue 21).

Two layers: ``docs/_hooks/private_names.py`` fails the strict docs build on a
private name in a rendered signature or base list (its scanner is tested here
on HTML), and the signatures the reference pages are built from are checked
here directly, through griffe with the same extensions as ``mkdocs.yml``
(griffe comes with the docs tools, which CI installs before the tests).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from types import ModuleType
from typing import Any

import pytest

from .._paths import ROOT
from .test_exports import NOT_FOR_USERS

PRIVATE = re.compile(r"(?<![A-Za-z0-9_.])_[A-Za-z][A-Za-z0-9_]*")


def _hook(name: str) -> ModuleType:
    path = ROOT / "docs" / "_hooks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_build_hook_finds_private_names_and_untyped_kwargs() -> None:
    find = _hook("private_names").find_private
    page = (
        '<div class="doc-signature highlight"><span>OpenAIStrategy(timeout: float = '
        '<span class="n">_DEFAULT_TIMEOUT</span>)</span></div>'
        "<p>Bases: <code>_EndpointStrategy</code></p>"
        '<div class="doc-signature"><span>process(**processor_kwargs: Any)</span></div>'
        '<div class="doc-signature"><span>fine(self, x: int = 1, *, y: LLMCallStrategy[str]) '
        "-&gt; None</span></div>"
        '<div class="doc-signature"><span>dunder(obj: object = object.__class__)</span></div>'
    )
    problems = find(page)
    assert len(problems) == 3, problems
    assert "_DEFAULT_TIMEOUT" in problems[0] and "_EndpointStrategy" in problems[2]
    assert "untyped keyword arguments" in problems[1]
    assert find('<div class="doc-signature"><span>llm(spec: str, **kwargs: Any)</span></div>') == []


def _documented() -> list[str]:
    names: list[str] = []
    for page in sorted((ROOT / "docs" / "reference").glob("*.md")):
        names += re.findall(r"^::: (trio_batch_llm[\w.]*)", page.read_text(), re.M)
    return names


def _final(obj: Any, griffe: Any) -> Any:
    return obj.final_target if isinstance(obj, griffe.Alias) else obj


def _rendered(obj: Any, griffe: Any) -> list[tuple[str, Any]]:
    """(where, expression) for what a reference page renders of ``obj``: bases and signatures."""
    shown: list[tuple[str, Any]] = []
    functions: list[Any] = []
    if isinstance(obj, griffe.Class):
        shown += [(f"{obj.path} bases", base) for base in obj.bases]
        # Members listed on the class include those griffe_public moves up from a private base.
        functions += [_final(m, griffe) for name, m in obj.members.items()
                      if isinstance(_final(m, griffe), griffe.Function)
                      and (name == "__init__" or not name.startswith("_"))]
    elif isinstance(obj, griffe.Function):
        functions.append(obj)
    for function in functions:
        if f"{obj.name}.{function.name}" in NOT_FOR_USERS:
            continue  # not on the page (the test below checks)
        for parameter in function.parameters:
            where = f"{function.path}({parameter.name})"
            shown.append((where, parameter.annotation))
            shown.append((where, parameter.default))
            if parameter.kind is griffe.ParameterKind.var_keyword and str(parameter.annotation) == "Any":
                shown.append((where, "**: Any"))
        shown.append((f"{function.path} returns", function.returns))
    return shown


def _shown(obj: Any, griffe: Any) -> list[tuple[str, str]]:
    """(where, text) for what a reference page renders of ``obj``: bases and signatures."""
    return [(where, str(expr)) for where, expr in _rendered(obj, griffe)]


def _private_paths(expr: Any, griffe: Any) -> list[str]:
    """The private module paths behind the names of ``expr``: what a link or tooltip would show."""
    if not isinstance(expr, griffe.Expr):
        return []
    names = [part for part in expr.iterate(flat=True) if isinstance(part, griffe.ExprName)]
    return [path for name in names if (path := name.canonical_path).startswith("trio_batch_llm._")]


def _load_documented(griffe: Any) -> tuple[Any, list[str]]:
    public_names = str(ROOT / "docs/_hooks/griffe_public.py:PublicNames")
    extensions = griffe.load_extensions("unpack_typeddict", public_names)  # as in mkdocs.yml
    loader = griffe.GriffeLoader(search_paths=[str(ROOT / "src")], extensions=extensions)
    package = loader.load("trio_batch_llm")
    loader.resolve_aliases(implicit=False, external=False)
    return package, _documented()


def _object(package: Any, path: str, griffe: Any) -> Any:
    obj = package[path.removeprefix("trio_batch_llm.")] if path != "trio_batch_llm" else package
    return _final(obj, griffe)


def test_reference_signatures_show_no_private_names() -> None:
    griffe = pytest.importorskip("griffe", reason="the docs tools (python3 dev.py docs installs them)")
    package, documented = _load_documented(griffe)
    assert len(documented) > 40 and "trio_batch_llm.OpenAIStrategy" in documented
    problems: list[str] = []
    for path in documented:
        obj = _object(package, path, griffe)
        problems += [f"{where}: {expr} names {private}" for where, expr in _rendered(obj, griffe)
                     for private in _private_paths(expr, griffe)]
        for where, text in _shown(obj, griffe):
            # A TypedDict's keys show "..." as their default: optional keys (total=False).
            unset = text == "..." and "typed-dict" not in obj.labels
            if PRIVATE.search(text) or text == "**: Any" or unset:
                problems.append(f"{where}: {text}")
    # llm() forwards its keywords to the strategy its spec names (documented on those classes).
    problems = [p for p in problems if not p.startswith("trio_batch_llm._strategies._factory.llm(kwargs)")]
    assert problems == [], "\n".join(problems)


def test_the_build_hook_finds_private_module_paths_anywhere_on_a_page() -> None:
    find = _hook("private_names").find_private_modules
    page = (
        '<p>Bases: <code><span title="trio_batch_llm._core._owner.HostedOwner">HostedOwner</span></code></p>'
        '<a title="BatchLLMError (trio_batch_llm._values._errors.BatchLLMError)" href="#x">BatchLLMError</a>'
        '<code>from trio_batch_llm._runs._reader import read_lease_report</code>'
        '<a title="WorkItemResult (trio_batch_llm.WorkItemResult)" href="#y">WorkItemResult</a>'
    )
    problems = find(page)
    assert [p.split(":")[0] for p in problems] == [
        "names private module path trio_batch_llm._core._owner.HostedOwner",
        "names private module path trio_batch_llm._runs._reader",
        "names private module path trio_batch_llm._values._errors.BatchLLMError",
    ], problems
    assert find('<a title="WorkItemResult (trio_batch_llm.WorkItemResult)">trio_batch_llm.mock</a>') == []


def test_private_bases_give_way_to_their_public_ancestry_and_members() -> None:
    """``Bases: HostedOwner`` named a class nobody can import, and hid ``aclose()`` from the page."""
    griffe = pytest.importorskip("griffe", reason="the docs tools (python3 dev.py docs installs them)")
    package, _ = _load_documented(griffe)
    processor = _object(package, "trio_batch_llm.ParallelBatchProcessor", griffe)
    assert [str(base) for base in processor.bases] == ["Generic[TOutput]"]
    for name in ("aclose", "force_close", "shutdown", "cleanup", "state"):
        member = processor.members[name]
        assert member.is_public and member.docstring is not None, name
    store = _object(package, "trio_batch_llm.JsonlArtifactStore", griffe)
    assert "ThreadedStore" not in " ".join(str(base) for base in store.bases)
    assert {"load", "append", "statistics", "aclose"} <= set(store.members)


@pytest.mark.parametrize("package", ["trio_batch_llm", "trio_batch_llm.mock"])
def test_every_exported_name_has_a_reference_entry(package: str) -> None:
    """A name a signature shows is one a reader can look up (issue 35: 22 were exported nowhere)."""
    module = importlib.import_module(package)
    pages = "\n".join(page.read_text() for page in (ROOT / "docs" / "reference").glob("*.md"))
    documented = set(re.findall(rf"^::: {re.escape(package)}\.(\w+)\s*$", pages, re.M))
    missing = sorted(set(module.__all__) - documented - {"__version__"})
    assert missing == []


def test_the_entry_points_parameter_tables_show_the_real_defaults() -> None:
    # unpack_typeddict lists **processor_kwargs in the docstring's table with a default of "...":
    # the hook gives them the processor's own (the table's Default column read "..." throughout).
    griffe = pytest.importorskip("griffe", reason="the docs tools (python3 dev.py docs installs them)")
    package, _ = _load_documented(griffe)
    for name in ("process_prompts", "process_stream"):
        func = _object(package, f"trio_batch_llm.{name}", griffe)
        table = {p.name: str(p.value) for section in func.docstring.parsed
                 if section.kind is griffe.DocstringSectionKind.parameters for p in section.value}
        assert {"post_processor", "call_start_deadline", "post_processor_timeout"} <= table.keys()
        assert "..." not in table.values(), (name, table)
        assert table["post_processor"] == "None"


def test_rendered_docstrings_cite_public_pages_not_the_internal_contract() -> None:
    # "CONTRACT C4.7" means something only to us: the reader's page is the cleanup contract.
    griffe = pytest.importorskip("griffe", reason="the docs tools (python3 dev.py docs installs them)")
    package, documented = _load_documented(griffe)
    seen: set[int] = set()
    cited: list[str] = []

    def walk(obj: Any) -> None:
        try:
            obj = _final(obj, griffe)
        except griffe.AliasResolutionError:
            return  # another package's object: not ours to word
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if obj.docstring is not None and "CONTRACT" in obj.docstring.value:
            cited.append(obj.path)
        for name, member in obj.members.items():
            if not name.startswith("_") or name == "__init__":
                walk(member)

    for path in documented:
        walk(_object(package, path, griffe))
    assert cited == []
