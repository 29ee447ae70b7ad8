"""Issue 31, point 9: one rule for the keys of a request row, in every reader.

``process_prompts`` (a mapping entry), the command line's JSONL reader (its fast path and its
full check) and a run's JSONL source all refuse a row with both ``"prompt"`` and ``"messages"``
and a row with a key the rule does not know (a misspelt ``"temprature"``, a top-level
``"system"``), naming the field; the command line also names the file and the line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_batch_llm import FakeStrategy, process_prompts
from trio_batch_llm._cli._input_jsonl import classify_line, scan_range
from trio_batch_llm._engine._inputs import to_item
from trio_batch_llm._values._prompts import ROW_KEYS, row_problem

from .test_cli_input import run_args, run_cli, write

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "hi"}]

BAD_ROWS: list[tuple[str, dict[str, Any], str, str]] = [
    ("prompt-and-messages", {"id": "a", "prompt": "x", "messages": MESSAGES}, "messages",
     'give exactly one of "prompt" and "messages"'),
    ("prompt-and-messages-and-params", {"id": "a", "prompt": "x", "messages": MESSAGES, "params": {}},
     "messages", 'give exactly one of "prompt" and "messages"'),
    ("misspelt-param", {"id": "a", "prompt": "x", "temprature": 0}, "temprature", "unknown key"),
    ("top-level-system", {"id": "a", "prompt": "x", "system": "be brief"}, "system", "unknown key"),
    ("unknown-key-with-messages", {"id": "a", "messages": MESSAGES, "model": "m"}, "model", "unknown key"),
    ("id-and-item-id", {"id": "a", "item_id": "b", "prompt": "x"}, "item_id", 'give "id" or "item_id"'),
]


@pytest.mark.parametrize(("name", "row", "field", "problem"), BAD_ROWS, ids=[case[0] for case in BAD_ROWS])
def test_the_cli_refuses_the_row_naming_file_line_and_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, row: dict[str, Any], field: str,
    problem: str,
) -> None:
    source = write(tmp_path / "in.jsonl", '{"id": "ok", "prompt": "fine"}\n' + json.dumps(row) + "\n")
    out = tmp_path / "results.jsonl"
    code, output = run_cli(capsys, *run_args(source, out))
    assert code == 2, output
    assert f'trio-batch-llm: error: {source}, line 2, field "{field}": {problem}' in output
    assert not out.exists()


@pytest.mark.parametrize(("name", "row", "field", "problem"), BAD_ROWS, ids=[case[0] for case in BAD_ROWS])
async def test_the_api_refuses_the_same_rows(
    name: str, row: dict[str, Any], field: str, problem: str,
) -> None:
    strategy = FakeStrategy()
    with pytest.raises(ValueError, match=f"prompts\\[1\\], field '{field}': {problem}"):
        await process_prompts(strategy, [{"id": "ok", "prompt": "fine"}, row])
    assert strategy.calls == []


@pytest.mark.parametrize(("name", "row", "field", "problem"), BAD_ROWS, ids=[case[0] for case in BAD_ROWS])
async def test_a_runs_jsonl_source_refuses_the_same_rows(
    tmp_path: Path, name: str, row: dict[str, Any], field: str, problem: str,
) -> None:
    from trio_batch_llm import open_run

    source = write(tmp_path / "in.jsonl", '{"id": "ok", "prompt": "fine"}\n' + json.dumps(row) + "\n")
    strategy = FakeStrategy()
    with pytest.raises(Exception, match=f"field '{field}': {problem}") as caught:
        async with await open_run(tmp_path / "runs.sqlite", "r", strategy, source) as run:
            await run.wait()
    assert "entry 1" in str(caught.value)


# --- the fast path is exactly as strict as the full check ---------------------------------------

_keys = st.sampled_from(sorted(ROW_KEYS | {"temprature", "system", "model", "text", "Prompt"}))
_values = st.one_of(st.text(max_size=6), st.integers(-3, 3), st.none(), st.booleans(),
                    st.just(MESSAGES), st.just({}), st.just({"temperature": 0}), st.just("  "))
_rows = st.dictionaries(_keys, _values, max_size=6)


def _full(path: Path, row: dict[str, Any]) -> object:
    # The full check alone: a line longer than the fast path takes (padding after the object).
    return classify_line(path, json.dumps(row) + " " * 300, 1)


@settings(max_examples=400, deadline=None)
@given(_rows)
def test_the_fast_path_accepts_exactly_what_the_full_check_accepts(
    tmp_path_factory: pytest.TempPathFactory, row: dict[str, Any],
) -> None:
    path = tmp_path_factory.mktemp("fast") / "in.jsonl"
    line = json.dumps(row)
    fast = classify_line(path, line, 1)
    full = _full(path, row)
    assert isinstance(fast, ValueError) == isinstance(full, ValueError), (line, fast, full)
    if not isinstance(fast, ValueError):
        assert fast == full
    # scan_range writes the fast path out again: it must agree too.
    path.write_text(line + "\n", encoding="utf-8")
    part = scan_range(path)
    assert (part.problem_count == 1) == isinstance(full, ValueError)
    # And the row rule is the API's: a row the CLI accepts has keys the API accepts.
    if not isinstance(full, ValueError):
        assert row_problem(row) is None
        to_item(row, 0, FakeStrategy())
    elif row_problem(row) is not None:
        field, _ = row_problem(row)  # type: ignore[misc]
        assert f'field "{field}"' in str(full)


def test_a_good_row_with_item_id_is_read_as_the_api_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    assert classify_line(path, '{"item_id": "a", "prompt": "x"}', 1) == ("a", "x", None)
