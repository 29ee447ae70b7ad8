"""The layout rules of DESIGN.md that the imports can show (docs/architecture.md draws them).

Imports are read with ``ast`` from every module of ``src/trio_batch_llm`` —
module level, inside functions and under ``TYPE_CHECKING`` alike — so a rule
cannot be broken by a lazy import either.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from .._paths import ROOT as REPO

SRC = REPO / "src"
ROOT = SRC / "trio_batch_llm"
MAX_LINES = 400
LONG_REASON = re.compile(r"over 400 lines because", re.IGNORECASE)


@cache
def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    if node.level:
        base = module.split(".")
        if modules()[module].name != "__init__.py":
            base = base[:-1]
        if node.level > 1:
            base = base[: len(base) - (node.level - 1)]
        prefix = ".".join([*base, node.module] if node.module else base)
    else:
        prefix = node.module or ""
    yield prefix
    for alias in node.names:
        yield f"{prefix}.{alias.name}"


@cache
def import_graph() -> dict[str, frozenset[str]]:
    """Module -> the modules of the package it imports (the nearest existing module of each name)."""
    graph: dict[str, frozenset[str]] = {}
    known = modules()
    for module, path in known.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in _imported(module, node):
                while name and name not in known:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    targets.add(name)
        graph[module] = frozenset(targets)
    return graph


@cache
def external_imports() -> dict[str, frozenset[str]]:
    """Module -> the top-level names of what it imports from outside the package."""
    out: dict[str, frozenset[str]] = {}
    for module, path in modules().items():
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        out[module] = frozenset(names - {"trio_batch_llm"})
    return out


def _in(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _breaks(
    importer_in: tuple[str, ...], imported_in: tuple[str, ...], *, allowed: tuple[str, ...] = ()
) -> list[str]:
    return sorted(
        f"{a} -> {b}"
        for a, targets in import_graph().items()
        if _in(a, *importer_in) and not _in(a, *allowed)
        for b in targets
        if _in(b, *imported_in)
    )


P = "trio_batch_llm"


def test_no_import_cycle() -> None:
    # A package's __init__ importing its own children is its face, not a loop.
    graph = {
        m: {t for t in targets if not (modules()[m].name == "__init__.py" and t.startswith(m + "."))}
        for m, targets in import_graph().items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert cycles == []


def test_long_modules_say_why() -> None:
    unexplained = {}
    for module, path in modules().items():
        lines = path.read_text(encoding="utf-8").splitlines()
        if len(lines) > MAX_LINES and not LONG_REASON.search("\n".join(lines[:15])):
            unexplained[module] = len(lines)
    assert unexplained == {}


def _public_names(package: str) -> Iterator[tuple[str, object]]:
    mod = importlib.import_module(package)
    for name in mod.__all__:
        yield name, getattr(mod, name)


@pytest.mark.parametrize("package", [P, f"{P}.mock", f"{P}.testing"])
def test_public_names_report_a_public_module(package: str) -> None:
    wrong = {}
    for name, obj in _public_names(package):
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        module = obj.__module__
        if module.split(".")[-1].startswith("_") or not module.startswith(P):
            wrong[name] = module
    assert wrong == {}
    top = dict(_public_names(P))
    assert top["ParallelBatchProcessor"].__module__ == P  # type: ignore[attr-defined]


def _members(cls: type) -> Iterator[tuple[str, object]]:
    """A class's public functions and properties, its own and inherited (the functions under them)."""
    for name, attr in inspect.getmembers(cls):
        if name.startswith("_") and name not in {"__init__", "__aenter__", "__aexit__", "__call__"}:
            continue
        if isinstance(attr, property):
            yield from ((f"{name}.{part}", f) for part, f in (("fget", attr.fget), ("fset", attr.fset)) if f)
        else:
            yield name, getattr(attr, "__func__", attr)


@pytest.mark.parametrize("package", [P, f"{P}.mock", f"{P}.testing"])
def test_public_methods_report_a_public_module_inherited_ones_too(package: str) -> None:
    # help(ParallelBatchProcessor.aclose) and the reference pages must not send a reader to
    # trio_batch_llm._host._owner, where a private base class defines it.
    wrong = {}
    for name, obj in _public_names(package):
        if not inspect.isclass(obj):
            continue
        for member, function in _members(obj):
            module = getattr(function, "__module__", None)
            if isinstance(module, str) and module.startswith(P) and "._" in module:
                wrong[f"{name}.{member}"] = module
    assert dict(sorted(wrong.items())[:5]) == {}, f"{len(wrong)} methods report a private module"


def test_only_the_backend_adapters_import_a_backend() -> None:
    allowed = {f"{P}._backends._trio": "trio", f"{P}._backends._asyncio": "asyncio"}
    leaks = sorted(
        f"{m} imports {lib}"
        for m, names in external_imports().items()
        for lib in ("trio", "asyncio")
        if lib in names and allowed.get(m) != lib
    )
    assert leaks == []


def test_one_module_imports_the_http_client() -> None:
    importers = sorted(m for m, names in external_imports().items() if "httpx2" in names or "httpx" in names)
    assert importers == [f"{P}._strategies.openai._http"]


def test_values_know_no_runtime() -> None:
    runtime = tuple(
        f"{P}.{p}" for p in ("_core", "_host", "_admission", "_engine", "_runs", "_observe", "_cli", "mock")
    )
    assert _breaks((f"{P}._values",), runtime) == []
    async_libs = sorted(
        m for m, names in external_imports().items() if _in(m, f"{P}._values") and "anyio" in names
    )
    assert async_libs == []


def test_the_kernel_stands_on_values_and_backends_only() -> None:
    # _core/ is the ground the rest stands on (the cleanup ledger, deliveries, leases): what owns
    # admission and strategies (the host) lives above it, so the kernel can be read and tested alone.
    kernel = f"{P}._core"
    ground = (kernel, f"{P}._values", f"{P}._backends")
    up = sorted(
        f"{a} -> {b}"
        for a, targets in import_graph().items()
        if _in(a, kernel)
        for b in targets
        if not _in(b, *ground)
    )
    assert up == []


# DESIGN.md's layout from the ground up (docs/architecture.md draws it): a package imports only
# packages on floors below its own, lazily or for the type checker alike. Packages on one floor know
# nothing of each other. The package's own face (``trio_batch_llm``) and the faces of the command line
# and the test helpers stand on top.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("_values", "_backends", "_version", "_public"),
    ("_core",),
    ("_observe",),
    ("_admission",),
    ("_strategies", "mock"),
    ("_artifacts",),
    ("_host",),
    ("_cache",),
    ("_engine",),
    ("_runs",),
    ("_compat",),
    ("_cli",),
    ("",),  # trio_batch_llm/__init__.py: the public face
    ("cli", "testing"),
    ("__main__",),
)
# The one arrow back up, for the type checker only: an item names the strategy type that serves it.
UP_FOR_TYPES: frozenset[tuple[str, str]] = frozenset({(f"{P}._values._requests", f"{P}._strategies._base")})


def _floor_of(module: str) -> int:
    rest = module[len(P) + 1:] if module != P else ""
    package = rest.split(".")[0]
    for floor, packages in enumerate(FLOORS):
        if package in packages:
            return floor
    raise AssertionError(f"{module}: no floor in FLOORS; give its package one")


def test_every_package_imports_only_the_floors_below_it() -> None:
    up = sorted(
        f"{a} -> {b}"
        for a, targets in import_graph().items()
        for b in targets
        if a.split(".")[:2] != b.split(".")[:2]  # within a package any import is its own affair
        and _floor_of(b) >= _floor_of(a)
        and (a, b) not in UP_FOR_TYPES
    )
    assert up == []


def test_the_item_path_knows_no_particular_provider() -> None:
    item_path = (f"{P}._engine", f"{P}._admission", f"{P}._core", f"{P}._host")
    assert _breaks(item_path, (f"{P}._strategies.openai",)) == []


def test_runs_reach_providers_only_through_the_batch_endpoint_protocol() -> None:
    assert _breaks((f"{P}._runs",), (f"{P}._strategies.openai",)) == []


def test_stores_are_used_they_do_not_drive() -> None:
    drivers = tuple(f"{P}.{p}" for p in ("_engine", "_runs", "_cli", "_core", "_host", "_admission"))
    assert _breaks((f"{P}._artifacts",), drivers) == []


def test_the_engine_knows_no_terminal() -> None:
    engine = (f"{P}._engine", f"{P}._core", f"{P}._host", f"{P}._admission", f"{P}._runs")
    assert _breaks(engine, (f"{P}._cli",)) == []


def test_only_the_cli_and_the_mock_import_the_mock() -> None:
    outside = _breaks((P,), (f"{P}.mock",), allowed=(f"{P}.mock", f"{P}._cli", f"{P}.testing"))
    assert outside == []


def test_production_code_never_imports_testing() -> None:
    assert _breaks((P,), (f"{P}.testing",), allowed=(f"{P}.testing",)) == []


def test_only_the_command_line_faces_import_the_cli_package() -> None:
    faces = (f"{P}._cli", f"{P}.cli", f"{P}.__main__")
    assert _breaks((P,), (f"{P}._cli",), allowed=faces) == []


def test_the_mock_imports_nothing_from_the_strategies() -> None:
    # The mock is written from the providers' documented wire formats: a wire bug in a client
    # must not be made identically on the server side, where no test could see it.
    assert _breaks((f"{P}.mock",), (f"{P}._strategies",)) == []
