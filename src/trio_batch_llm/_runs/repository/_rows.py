"""The run tables as both dialects read them: column lists, the snapshot query, row decoding, checks.

The SQLite and PostgreSQL tables (:mod:`._sqlite_tables`, :mod:`._postgres_tables`)
have the same columns with the same meaning, so one query reads a run from
either and one function decodes the row. Nothing here opens or commits anything.
"""

from __future__ import annotations

import datetime
import json
from typing import Any, Final

from ..._values._artifact_identity import ArtifactIdentity
from .._schema import (
    LIVE_SUBMISSION_STATES,
    UNRESOLVED_SUBMISSION_STATES,
    NewSubmission,
    RunSnapshot,
    RunTermination,
    SourceCheckpoint,
)

__all__ = [
    "ALL_SUBMISSION_STATES", "LIVE", "RUN_COLUMNS", "SNAPSHOT", "SUBMISSION_COLUMNS", "UNRESOLVED",
    "check_new_submission", "check_states", "decode_snapshot", "is_count", "utc_now",
]

RUN_COLUMNS: Final = (
    "run_id, mode, identity, config, status, termination, source_position, source_cursor,"
    " source_fingerprint, source_last_item, source_exhausted, items, done, succeeded, failed,"
    " input_tokens, output_tokens, total_tokens, last_sequence, created_at, updated_at"
)
# Literal SQL lists (the states are ours, never a caller's string).
LIVE: Final = ", ".join(f"'{state}'" for state in sorted(LIVE_SUBMISSION_STATES))
UNRESOLVED: Final = ", ".join(f"'{state}'" for state in sorted(UNRESOLVED_SUBMISSION_STATES))
ALL_SUBMISSION_STATES: Final = LIVE_SUBMISSION_STATES | {"finished", "abandoned", "cancelled"}
# One statement, so the submission fields are read from the same snapshot as the run's counters
# (a submission ending between two reads would otherwise show its items both batched and done).
# The CAST: PostgreSQL sums a BIGINT column to NUMERIC (a Decimal in Python); SQLite's integer
# sum is unchanged by it.
SNAPSHOT: Final = (
    f"SELECT {RUN_COLUMNS},"
    f" (SELECT CAST(COALESCE(SUM(s.items), 0) AS BIGINT) FROM run_submissions s"
    f"  WHERE s.run_id = runs.run_id AND s.state IN ({LIVE})),"
    f" (SELECT COUNT(*) FROM run_submissions s WHERE s.run_id = runs.run_id AND s.state IN ({LIVE})),"
    f" (SELECT s.submission_id FROM run_submissions s"
    f"  WHERE s.run_id = runs.run_id AND s.state IN ({UNRESOLVED}) ORDER BY s.seq LIMIT 1)"
    " FROM runs WHERE run_id = ?"
)
SUBMISSION_COLUMNS: Final = (
    "submission_id, run_id, scope, state, items, tokens, input_file_id, batch_id, detail,"
    " created_at, updated_at"
)


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


def decode_snapshot(row: tuple[Any, ...]) -> RunSnapshot:
    (run_id, mode, identity, config, status, termination, position, cursor, fingerprint, last_item,
     exhausted, items, done, succeeded, failed, inp, out, total, last_seq, created, updated,
     batched, open_submissions, unresolved) = row
    term = json.loads(termination) if termination else None
    return RunSnapshot(
        run_id=run_id,
        status=status,
        mode=mode,
        identity=ArtifactIdentity(**json.loads(identity)),
        config=json.loads(config),
        termination=RunTermination(term["kind"], term.get("reason"), term.get("item_id")) if term else None,
        checkpoint=SourceCheckpoint(
            position=position, cursor=cursor, fingerprint=fingerprint, last_item_id=last_item,
            exhausted=bool(exhausted),
        ),
        items=items, done=done, succeeded=succeeded, failed=failed,
        input_tokens=inp, output_tokens=out, total_tokens=total, last_sequence=last_seq,
        created_at=created, updated_at=updated,
        batched=batched, open_submissions=open_submissions, unresolved_submission=unresolved,
    )


def is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_new_submission(submission: NewSubmission, capacity_limit: int | None) -> None:
    sid = submission.submission_id
    if not is_count(submission.tokens):
        raise ValueError(f"submission {sid!r}: tokens must be an int >= 0, not {submission.tokens!r}")
    if capacity_limit is not None and not is_count(capacity_limit):
        raise ValueError(f"capacity_limit must be None or an int >= 0, not {capacity_limit!r}")
    if not submission.item_ids:
        raise ValueError(f"submission {sid!r} lists no items")
    seen: set[str] = set()
    for item_id in submission.item_ids:
        if item_id in seen:
            raise ValueError(f"submission {sid!r} lists item {item_id!r} twice")
        seen.add(item_id)


def check_states(states: frozenset[str], allowed: frozenset[str], what: str) -> None:
    if not states <= allowed:
        raise ValueError(f"{what} must be among {sorted(allowed)}, not {sorted(states - allowed)}")
