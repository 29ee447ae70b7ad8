"""Static typing promises: one mypy run over the small files in tests/typing/, and no bare ``Any`` in a
public signature (read from the annotations of every public name)."""

from __future__ import annotations

import ast
import importlib
import inspect
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .._paths import TESTS

mypy_api = pytest.importorskip("mypy.api")

HERE = TESTS / "typing"


def test_typing_promises_hold(tmp_path: Path) -> None:
    files = sorted(str(p) for p in HERE.glob("check_*.py"))
    assert len(files) >= 2
    stdout, stderr, status = mypy_api.run(["--strict", "--cache-dir", str(tmp_path), *files])
    assert status == 0, stdout + stderr


# -- no bare Any in a public signature -------------------------------------------------------------

_PUBLIC_FACES = ("trio_batch_llm", "trio_batch_llm.testing", "trio_batch_llm.mock")
_DUNDERS_CHECKED = frozenset({"__init__", "__new__", "__call__"})


def _is_ours(obj: object) -> bool:
    module = getattr(obj, "__module__", None)
    return isinstance(module, str) and (module == "trio_batch_llm" or module.startswith("trio_batch_llm."))


def _members(cls: type) -> Iterator[tuple[str, object]]:
    """The functions a public class offers: its own and those inherited from our (private) bases."""
    seen: set[str] = set()
    for base in cls.__mro__:
        if not _is_ours(base):
            continue
        for attr, member in vars(base).items():
            if attr in seen or (attr.startswith("_") and attr not in _DUNDERS_CHECKED):
                continue
            seen.add(attr)
            if isinstance(member, property):
                for accessor in (member.fget, member.fset):
                    if accessor is not None:
                        yield f"{cls.__name__}.{attr}", accessor
                continue
            member = getattr(member, "__func__", member)  # class and static methods
            if inspect.isfunction(member) and _is_ours(member):
                yield f"{cls.__name__}.{attr}", member


def _public_functions() -> Iterator[tuple[str, object]]:
    for face in _PUBLIC_FACES:
        module = importlib.import_module(face)
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) and _is_ours(obj):
                yield from ((f"{face}.{where}", f) for where, f in _members(obj))
            elif inspect.isfunction(obj) and _is_ours(obj):
                yield f"{face}.{name}", obj


def _names_any(node: ast.expr) -> bool:
    """Whether an annotation's source says ``Any`` or ``Any | None`` (for one that cannot be resolved
    at run time: its names are imported under ``TYPE_CHECKING`` only)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = (node.left, node.right)
        return any(_names_any(side) for side in sides) and any(
            isinstance(side, ast.Constant) and side.value is None for side in sides)
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("Optional", "typing.Optional"):
        return _names_any(node.slice)
    return ast.unparse(node) in ("Any", "typing.Any")


def _hints(function: object) -> dict[str, object]:
    """``typing.get_type_hints(function)``; where a name is known only to the type checker, each
    annotation is resolved alone, and one that still cannot be is read from its source."""
    try:
        return typing.get_type_hints(function)
    except NameError:
        pass
    namespace = getattr(function, "__globals__", {})
    hints: dict[str, object] = {}
    for name, annotation in getattr(function, "__annotations__", {}).items():
        if not isinstance(annotation, str):
            hints[name] = annotation
            continue
        try:
            hints[name] = eval(annotation, namespace)  # our own annotations, from our own modules
        except NameError:
            hints[name] = Any if _names_any(ast.parse(annotation, mode="eval").body) else object
    return hints


def _is_bare_any(hint: object) -> bool:
    """``Any``, or ``Any | None`` (which says no more): ``dict[str, Any]`` and the like name a shape."""
    if hint is Any:
        return True
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and Any in typing.get_args(hint)


def test_public_signatures_have_no_bare_any() -> None:
    """Every parameter and return of a public function or method says what it takes: a real type, a
    Protocol, a TypeVar or ``object``, never a bare ``Any`` (which switches the checking off for the
    caller). Annotations are resolved, so a string annotation cannot hide one."""
    found: list[str] = []
    checked = 0
    for where, function in _public_functions():
        hints = _hints(function)
        checked += 1
        found += [f"{where}: {'return' if name == 'return' else name}"
                  for name, hint in hints.items() if _is_bare_any(hint)]
    assert checked > 100
    assert not found, "bare Any in public signatures:\n" + "\n".join(sorted(set(found)))
