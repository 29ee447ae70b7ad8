"""What the mock's Files and Batch APIs read: the multipart upload and the JSONL input file.

The multipart parser works on bytes (no decoding round trip), so an uploaded
file keeps its exact bytes and its reported size.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, final

from .._values._openai_text import openai_prompt_text
from ._openai import Api
from ._state import mock_token_count

__all__ = ["BATCH_ENDPOINTS", "InputLine", "parse_input_file", "parse_multipart"]

BATCH_ENDPOINTS: dict[str, Api] = {"/v1/chat/completions": "chat", "/v1/responses": "responses"}
_BOUNDARY = re.compile(r';\s*boundary="?([^";]+)"?', re.I)


@final
@dataclass(frozen=True, slots=True)
class InputLine:
    custom_id: str
    body: dict[str, Any]
    prompt: str
    tokens: int  # input tokens, as the enqueued-token limit counts them


def parse_multipart(content_type: str, raw: bytes) -> dict[str, tuple[str | None, bytes]] | None:
    """A ``multipart/form-data`` body's fields as ``name -> (filename, value)``; ``None`` if malformed."""
    if content_type.partition(";")[0].strip().lower() != "multipart/form-data":
        return None
    boundary = _BOUNDARY.search(content_type)
    if boundary is None:
        return None
    # Every delimiter is CRLF + "--" + boundary; the first one may start the body without its CRLF.
    chunks = (b"\r\n" + raw).split(b"\r\n--" + boundary.group(1).encode("latin-1"))
    if len(chunks) < 3 or not chunks[-1].startswith(b"--"):
        return None  # no part, or no closing delimiter
    fields: dict[str, tuple[str | None, bytes]] = {}
    for chunk in chunks[1:-1]:
        head, separator, value = chunk.partition(b"\r\n\r\n")
        if not separator:
            return None
        disposition = ""
        for line in head.decode("utf-8", "replace").split("\r\n"):
            name, _, header_value = line.partition(":")
            if name.strip().lower() == "content-disposition":
                disposition = header_value
        field_name = _header_param(disposition, "name")
        if field_name is None:
            return None
        fields[field_name] = (_header_param(disposition, "filename"), value)
    return fields


def _header_param(header: str, key: str) -> str | None:
    found = re.search(rf'(?:^|;)\s*{key}\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^;\s]*))', header, re.I)
    if found is None:
        return None
    quoted = found.group(1)
    return re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else found.group(2)


def parse_input_file(content: bytes, endpoint: str) -> tuple[list[InputLine], list[tuple[int | None, str]]]:
    """The lines of a batch input file, and its problems as ``(1-based line or None, message)``.

    Blank lines are skipped (a trailing newline is normal) but still counted in line numbers.
    """
    api = BATCH_ENDPOINTS[endpoint]
    lines: list[InputLine] = []
    problems: list[tuple[int | None, str]] = []
    seen: set[str] = set()
    for number, text in enumerate(content.split(b"\n"), start=1):
        if not text.strip():
            continue
        try:
            entry: Any = json.loads(text)
        except ValueError:
            problems.append((number, "the line is not valid JSON"))
            continue
        problem = _line_problem(entry, endpoint, api, seen)
        if problem is not None:
            problems.append((number, problem))
            continue
        prompt = openai_prompt_text(api, entry["body"]) or ""  # not None: checked above
        seen.add(entry["custom_id"])
        lines.append(InputLine(entry["custom_id"], entry["body"], prompt, mock_token_count(prompt)))
    if not lines and not problems:
        problems.append((None, "the input file has no requests"))
    return lines, problems


def _line_problem(entry: Any, endpoint: str, api: Api, seen: set[str]) -> str | None:
    if not isinstance(entry, dict):
        return "the line is not a JSON object"
    custom_id = entry.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return "custom_id must be a non-empty string"
    if custom_id in seen:
        return f"custom_id {custom_id!r} is not unique in the file"
    if entry.get("method") != "POST":
        return f"method must be 'POST', got {entry.get('method')!r}"
    if entry.get("url") != endpoint:
        return f"url must be the batch endpoint {endpoint!r}, got {entry.get('url')!r}"
    body = entry.get("body")
    if not isinstance(body, dict) or openai_prompt_text(api, body) is None:
        need = "messages" if api == "chat" else "input"
        return f"body must be a JSON object with {need} for {endpoint}"
    return None
