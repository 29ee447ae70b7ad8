"""The JSONL checkpoint's bytes: the fixed prefixes that prove a file is ours, and line checks.

Every line this store writes starts with one of two fixed byte strings, at
byte 0 of the line, because ``encode_record`` keeps key order and compact
separators::

    {"kind":"header","format":"trio-batch-llm-artifacts",   line 1 (the magic)
    {"kind":"result","item_id":                              every later line

A write that is cut short leaves a *prefix* of a line, so even a torn write
still shows (a prefix of) these bytes. That is the whole proof of ownership:

* an empty file is new, and is initialised;
* a first line that starts with the magic is our header (it must also parse,
  or the file is refused as corrupt, not repaired);
* a file that is one unterminated line which is a prefix of the magic (or
  starts with it and does not parse) is a torn header: the first write of a run
  was interrupted, nothing was stored, and it is started afresh;
* anything else is not ours: it is refused, byte for byte untouched.

NUL bytes at the end are ignored by these checks: after a power loss a file
can keep its new length while the data never reached the disk.

The header of every earlier release starts with the same bytes, so files
written before the magic had a name stay ours.
"""

from __future__ import annotations

import json
import re
from typing import BinaryIO, Final

__all__ = [
    "HEADER_MAGIC",
    "RECORD_MAGIC",
    "last_newline_end",
    "line_number",
    "looks_torn",
    "parses",
    "preview",
    "torn_item_id",
]

HEADER_MAGIC: Final = b'{"kind":"header","format":"trio-batch-llm-artifacts",'
RECORD_MAGIC: Final = b'{"kind":"result","item_id":'

_PREVIEW_BYTES: Final = 60
_CHUNK: Final = 1 << 16
_ITEM_ID: Final = re.compile(rb'"((?:[^"\\]|\\.)*)"')


def looks_torn(data: bytes, magic: bytes) -> bool:
    """Whether ``data`` (an unterminated line that does not parse) is a cut-short line of ours."""
    data = data.rstrip(b"\0")
    return data.startswith(magic) or magic.startswith(data)


def parses(data: bytes) -> bool:
    """Whether ``data`` is one whole JSON value: a cut-short line of ours never is."""
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


def preview(data: bytes) -> str:
    """A short, printable view of some bytes, for a message."""
    head = repr(data[:_PREVIEW_BYTES])
    more = len(data) - _PREVIEW_BYTES
    return head + (f"... ({more} more bytes)" if more > 0 else "")


def torn_item_id(data: bytes) -> str | None:
    """The item id a cut-short result line was for, when the cut left it whole."""
    if not data.startswith(RECORD_MAGIC):
        return None
    match = _ITEM_ID.match(data, len(RECORD_MAGIC))
    if match is None:
        return None
    try:
        item_id = json.loads(match.group(0))
    except ValueError:
        return None
    return item_id if isinstance(item_id, str) else None


def last_newline_end(f: BinaryIO, size: int) -> int:
    """Offset just past the last ``\\n`` in the first ``size`` bytes (0 if there is none)."""
    end = size
    while end > 0:
        start = max(0, end - _CHUNK)
        f.seek(start)
        chunk = f.read(end - start)
        index = chunk.rfind(b"\n")
        if index >= 0:
            return start + index + 1
        end = start
    return 0


def line_number(f: BinaryIO, offset: int) -> int:
    """The 1-based number of the line that starts at ``offset`` (reads up to there: messages only)."""
    f.seek(0)
    lines, left = 0, offset
    while left > 0:
        chunk = f.read(min(_CHUNK, left))
        if not chunk:
            break
        lines += chunk.count(b"\n")
        left -= len(chunk)
    return lines + 1
