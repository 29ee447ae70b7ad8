"""Every public name and parameter of async-batch-llm 0.28 works here or has a row in the guide.

``tests/data/anchor_public_names.txt`` is the anchor's surface, frozen. An entry counts as
covered when the same name is exported here (a parameter: the same name in our signature;
an attribute: on our class), or when docs/migration.md names it in a code span, which is
where its replacement and the reason are given.
"""

from __future__ import annotations

import inspect
import re
from functools import cache
from typing import Any

import pytest

import trio_batch_llm
import trio_batch_llm.testing

from .._paths import ROOT, TESTS

NAMES = TESTS / "data" / "anchor_public_names.txt"
GUIDE = ROOT / "docs" / "migration.md"
_ENTRY = re.compile(r"(?P<name>(?:testing\.)?\w+)(?:\((?P<param>\w+)\)|\.(?P<attr>\w+))?")


def entries() -> list[str]:
    lines = NAMES.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


@cache
def code_spans() -> tuple[str, ...]:
    return tuple(re.findall(r"`([^`\n]+)`", GUIDE.read_text(encoding="utf-8")))


def in_guide(token: str) -> bool:
    word = re.compile(rf"(?<![\w]){re.escape(token)}(?![\w])")
    return any(word.search(span) for span in code_spans())


def ours(name: str) -> Any:
    module: Any = trio_batch_llm
    if name.startswith("testing."):
        module, name = trio_batch_llm.testing, name.removeprefix("testing.")
    return getattr(module, name) if name in module.__all__ else None


def parameters(obj: Any) -> set[str]:
    try:
        return set(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return set()


def covered(entry: str) -> bool:
    match = _ENTRY.fullmatch(entry)
    assert match is not None, f"malformed entry {entry!r}"
    obj = ours(match["name"])
    if match["param"]:
        return (obj is not None and match["param"] in parameters(obj)) or in_guide(match["param"])
    if match["attr"]:
        return (obj is not None and hasattr(obj, match["attr"])) or in_guide(match["attr"])
    return obj is not None or in_guide(match["name"].removeprefix("testing."))


def test_the_frozen_list_is_the_anchors_surface() -> None:
    names = entries()
    assert len(names) == len(set(names)) > 500
    # A few facts of async-batch-llm 0.28 that must never drop out of the list.
    assert {"ParallelBatchProcessor", "BaseMiddleware", "TokenEstimate", "testing.FakeRateLimitError",
            "ParallelBatchProcessor.get_stats", "SqliteArtifactStore(commit_interval_seconds)"} <= set(names)


def test_every_anchor_name_is_exported_or_in_the_guide() -> None:
    missing = [entry for entry in entries() if not covered(entry)]
    assert missing == [], f"neither exported nor in docs/migration.md: {missing}"


@pytest.mark.parametrize("entry", ["NoSuchName", "ParallelBatchProcessor(no_such_param)", "BatchResult.nope"])
def test_an_unknown_entry_is_not_covered(entry: str) -> None:
    assert not covered(entry)  # the check can fail
