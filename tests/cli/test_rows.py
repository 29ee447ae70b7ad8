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

from trio_batch_llm import FakeStrategy, OpenAICompatibleStrategy, process_prompts
from trio_batch_llm._cli._input_jsonl import classify_line, scan_range
from trio_batch_llm._engine._inputs import to_item
from trio_batch_llm._values._prompts import ROW_KEYS, row_problem

from .test_input import run_args, run_cli, write

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


# The CLI's own strategy kind: it takes chat messages and request params (FakeStrategy takes text only).
_WIRE = OpenAICompatibleStrategy("m", base_url="http://127.0.0.1:9/v1", api_key="k", api_key_env=None)


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
        to_item(row, 0, _WIRE)  # a strategy that sends messages and params, as the CLI's does
    elif row_problem(row) is not None:
        field, _ = row_problem(row)  # type: ignore[misc]
        assert f'field "{field}"' in str(full)


def test_a_good_row_with_item_id_is_read_as_the_api_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    assert classify_line(path, '{"item_id": "a", "prompt": "x"}', 1) == ("a", "x", None, 0)


# --- a key given twice (a JSON reader keeps only the last) --------------------------------------

REPEATED_LINES: list[tuple[str, str, str]] = [
    ("id-twice", '{"id": "a", "prompt": "x", "id": "b"}', "id"),
    ("prompt-twice", '{"id": "a", "prompt": "x", "prompt": "y"}', "prompt"),
    ("context-twice", '{"id": "a", "prompt": "x", "context": 1, "context": 2}', "context"),
    ("escaped-id", '{"id": "a", "prompt": "x", "\\u0069d": "b"}', "id"),
    ("messages-twice", '{"id": "a", "messages": [{"role": "user", "content": "hi"}], '
                       '"messages": [{"role": "user", "content": "ho"}]}', "messages"),
    ("params-twice", '{"id": "a", "prompt": "x", "params": {}, "params": {"temperature": 1}}', "params"),
]


@pytest.mark.parametrize(("name", "line", "field"), REPEATED_LINES, ids=[case[0] for case in REPEATED_LINES])
def test_the_cli_refuses_a_key_given_twice(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, line: str, field: str,
) -> None:
    source = write(tmp_path / "in.jsonl", '{"id": "ok", "prompt": "fine"}\n' + line + "\n")
    out = tmp_path / "results.jsonl"
    code, output = run_cli(capsys, *run_args(source, out))
    assert code == 2, output
    assert f'trio-batch-llm: error: {source}, line 2, field "{field}": given twice' in output
    assert not out.exists()


@pytest.mark.parametrize(("name", "line", "field"), REPEATED_LINES, ids=[case[0] for case in REPEATED_LINES])
async def test_a_runs_jsonl_source_refuses_a_key_given_twice(
    tmp_path: Path, name: str, line: str, field: str,
) -> None:
    from trio_batch_llm import open_run

    source = write(tmp_path / "in.jsonl", '{"id": "ok", "prompt": "fine"}\n' + line + "\n")
    strategy = FakeStrategy()
    with pytest.raises(Exception, match=f"field '{field}': given twice") as caught:
        async with await open_run(tmp_path / "runs.sqlite", "r", strategy, source) as run:
            await run.wait()
    assert "entry 1" in str(caught.value)


def test_a_key_repeated_inside_a_value_or_used_as_a_value_is_not_a_repeated_key(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    # A value that reads like a key sends the line down the full check, which accepts it.
    assert classify_line(path, '{"id": "id", "prompt": "prompt"}', 1) == ("id", "prompt", None, 0)
    assert classify_line(path, '{"id": "a", "prompt": "x", "context": {"id": 1, "id": 2}}', 1) == (
        "a", "x", {"id": 2}, 0)
    assert classify_line(path, '{"id": "a", "prompt": "say \\"id\\""}', 1) == ("a", 'say "id"', None, 0)


_pair_keys = st.sampled_from(["id", "prompt", "context", "\\u0069d", "messages"])
_pair_values = st.sampled_from(['"a"', '"b"', '"id"', '"prompt"', "1", "{}", '{"id": 1}',
                                '[{"role": "user", "content": "hi"}]'])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_pair_keys, _pair_values), min_size=1, max_size=5))
def test_every_path_agrees_on_repeated_keys(
    tmp_path_factory: pytest.TempPathFactory, pairs: list[tuple[str, str]],
) -> None:
    path = tmp_path_factory.mktemp("rep") / "in.jsonl"
    line = "{" + ", ".join(f'"{key}": {value}' for key, value in pairs) + "}"
    names = [json.loads(f'"{key}"') for key, _ in pairs]
    repeated = len(set(names)) != len(names)
    fast = classify_line(path, line, 1)
    full = classify_line(path, line + " " * 300, 1)
    assert isinstance(fast, ValueError) == isinstance(full, ValueError), (line, fast, full)
    if repeated:  # refused: for the repeat, unless the row breaks the key rule first
        assert isinstance(full, ValueError), (line, full)
        if row_problem(json.loads(line)) is None:
            assert "given twice" in str(full), (line, full)
    path.write_text(line + "\n", encoding="utf-8")
    assert (scan_range(path).problem_count == 1) == isinstance(full, ValueError), line


# --- CSV: a column named like a part of the request ---------------------------------------------


@pytest.mark.parametrize(("column", "kind"), [
    ("messages", "key"), ("params", "key"), ("item_id", "key"),
    ("temperature", "parameter"), ("system", "parameter"), ("max_tokens", "parameter"),
])
def test_a_csv_column_named_like_the_request_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, column: str, kind: str,
) -> None:
    # Every column but id and prompt is the item's context, which is never sent: the column would
    # silently not be part of the request, as an unknown JSONL key would not be.
    source = write(tmp_path / "in.csv", f"id,prompt,{column}\na,hello,0\n")
    out = tmp_path / "results.jsonl"
    code, output = run_cli(capsys, *run_args(source, out))
    assert code == 2, output
    assert (f'trio-batch-llm: error: {source}, line 1, field "{column}": a column named like a request '
            f"{kind} would be the item's context") in output
    assert not out.exists()


def test_other_csv_columns_are_still_the_context(tmp_path: Path) -> None:
    from trio_batch_llm._cli._input_csv import csv_entries

    source = write(tmp_path / "in.csv", "id,prompt,topic,temprature\na,hello,cats,0\n")
    (record,) = list(csv_entries(source))
    expected = ("a", "hello", {"topic": "cats", "temprature": "0"})
    assert (record.item_id, record.prompt, record.context) == expected
