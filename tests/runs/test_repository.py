"""The run repository's provider-batch part: submissions, shared enqueued-token capacity, migration.

Repository level and synchronous (the repository is a blocking protocol with
no async behaviour of its own). Capacity is checked three ways: against a
model (hypothesis stateful), and by racing reservations from several
repository objects on one file, in threads and in separate processes, while
``held_tokens`` is read concurrently.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from trio_batch_llm import ArtifactIdentity, ArtifactStoreError
from trio_batch_llm._artifacts._fingerprint import canonical_json, identity_fingerprint
from trio_batch_llm._artifacts._sqlite_file import SqliteFile
from trio_batch_llm._runs import RunRepository, RunStateError, SqliteRunRepository
from trio_batch_llm._runs._schema import (
    LIVE_SUBMISSION_STATES,
    NewItem,
    NewResult,
    NewSubmission,
    RunSnapshot,
    RunSpec,
    SourceCheckpoint,
)
from trio_batch_llm._runs.repository._locate import repository_at
from trio_batch_llm._runs.repository._sqlite_tables import RUNS_SCHEMA_VERSION

IDENTITY = ArtifactIdentity("test-model", "batch-prompts")
SCOPE = "batch|https://api.example|key|model"


def _ingest(repo: RunRepository, run_id: str, item_ids: list[str]) -> None:
    repo.attach(RunSpec(run_id, "provider-batch", IDENTITY, {}))
    items = [NewItem(i, f"prompt of {i}", json.dumps({"id": i}), f"fp-{i}") for i in item_ids]
    repo.ingest(run_id, items, SourceCheckpoint(position=len(items), exhausted=True))


def _items(run_id: str, n: int) -> list[str]:
    return [f"{run_id}-{i}" for i in range(n)]


def _result(item_id: str, *, success: bool = True) -> NewResult:
    return NewResult(item_id, success, None if success else "provider", json.dumps({"id": item_id}), 3, 2, 5)


def _sub(sid: str, item_ids: list[str], tokens: int = 10, scope: str = SCOPE) -> NewSubmission:
    return NewSubmission(sid, scope, tuple(item_ids), tokens)


def _to_submitted(repo: RunRepository, run_id: str, sid: str) -> None:
    assert repo.update_submission(run_id, sid, from_states=frozenset({"reserved"}), to="creating")
    assert repo.update_submission(
        run_id, sid, from_states=frozenset({"creating", "unknown"}), to="submitted", batch_id=f"batch_{sid}"
    )


def _pending_ids(repo: RunRepository, run_id: str) -> list[str]:
    return [p.item_id for p in repo.pending(run_id, after_ingest_seq=0, limit=1000)]


STORES = [pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres")]


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the repository under test keeps its runs: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "postgres":
        url: str = request.getfixturevalue("postgres_url")
        return url
    return str(tmp_path / "runs.sqlite")


@pytest.fixture
def repo(store: str) -> Iterator[RunRepository]:
    repository = repository_at(store)
    repository.open()
    _ingest(repository, "r", _items("r", 6))
    try:
        yield repository
    finally:
        repository.close()


# --- shape ------------------------------------------------------------------------------


def test_the_repository_provides_the_protocol(repo: RunRepository) -> None:
    assert isinstance(repo, RunRepository)
    assert RUNS_SCHEMA_VERSION == 3
    snap = repo.snapshot("r")
    assert (snap.batched, snap.open_submissions, snap.unresolved_submission) == (0, 0, None)
    assert [p.attempts for p in repo.pending("r", after_ingest_seq=0, limit=10)] == [0] * 6


# --- reserve ----------------------------------------------------------------------------


def test_reserve_takes_the_items_and_holds_the_tokens(repo: RunRepository) -> None:
    assert repo.reserve_submission("r", _sub("s1", ["r-3", "r-1"], tokens=40), capacity_limit=100)
    assert _pending_ids(repo, "r") == ["r-0", "r-2", "r-4", "r-5"]
    items = repo.submission_items("r", "s1")
    assert [(i.item_id, i.ingest_seq, i.attempts) for i in items] == [("r-1", 2, 0), ("r-3", 4, 0)]
    assert items[0].prompt == "prompt of r-1" and items[0].context_json == '{"id": "r-1"}'
    (record,) = repo.submissions("r")
    assert (record.submission_id, record.run_id, record.scope, record.state) == ("s1", "r", SCOPE, "reserved")
    assert (record.items, record.tokens, record.input_file_id, record.batch_id, record.detail) == (
        2, 40, None, None, None
    )
    assert repo.held_tokens(SCOPE) == 40 and repo.held_tokens("other") == 0
    snap = repo.snapshot("r")
    assert (snap.batched, snap.open_submissions, snap.unresolved_submission) == (2, 1, None)
    assert (snap.done, snap.pending) == (0, 6)  # batched items are not done
    assert repo.record("r", [_result("r-1")]).done == 0  # record() takes pending items only


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ("r-4", "'r-4' is 'done'"),
        ("r-2", "'r-2' is 'batched' (in submission 'first')"),
        ("nope", "'nope' is not an item of this run"),
    ],
)
def test_reserve_refuses_an_item_that_is_not_pending_naming_it_and_writes_nothing(
    repo: RunRepository, bad: str, named: str
) -> None:
    repo.record("r", [_result("r-4")])
    assert repo.reserve_submission("r", _sub("first", ["r-2"], tokens=5), capacity_limit=None)
    before = (repo.snapshot("r"), _pending_ids(repo, "r"), repo.submissions("r"))
    with pytest.raises(ValueError, match=re.escape(named)):
        repo.reserve_submission("r", _sub("second", ["r-0", "r-1", bad, "r-5"], 5), capacity_limit=None)
    assert (repo.snapshot("r"), _pending_ids(repo, "r"), repo.submissions("r")) == before
    assert repo.held_tokens(SCOPE) == 5
    assert repo.reserve_submission("r", _sub("second", ["r-0", "r-1"], tokens=5), capacity_limit=None)


def test_reserve_rejects_bad_arguments_and_unknown_runs(repo: RunRepository) -> None:
    cases = [
        (_sub("s", [], tokens=1), None, "lists no items"),
        (_sub("s", ["r-0", "r-1", "r-0"]), None, "lists item 'r-0' twice"),
        (_sub("s", ["r-0"], tokens=-1), None, "tokens must be an int >= 0"),
        (_sub("s", ["r-0"]), -5, "capacity_limit must be None or an int >= 0"),
    ]
    for submission, limit, message in cases:
        with pytest.raises(ValueError, match=message):
            repo.reserve_submission("r", submission, capacity_limit=limit)
    with pytest.raises(RunStateError, match="no run named 'ghost'"):
        repo.reserve_submission("ghost", _sub("s", ["r-0"]), capacity_limit=None)
    assert repo.reserve_submission("r", _sub("s", ["r-0"]), capacity_limit=None)
    with pytest.raises(ValueError, match="submission id 's' is taken"):
        repo.reserve_submission("r", _sub("s", ["r-1"]), capacity_limit=None)
    assert repo.submissions("r")[0].items == 1 and _pending_ids(repo, "r") == _items("r", 6)[1:]


def test_capacity_is_per_scope_shared_by_runs_and_refusal_writes_nothing(repo: RunRepository) -> None:
    _ingest(repo, "q", _items("q", 3))
    assert repo.reserve_submission("r", _sub("a", ["r-0"], tokens=60), capacity_limit=100)
    assert not repo.reserve_submission("q", _sub("b", ["q-0"], tokens=41), capacity_limit=100)
    assert repo.submissions("q") == [] and _pending_ids(repo, "q") == _items("q", 3)
    assert repo.reserve_submission("q", _sub("b", ["q-0"], tokens=40), capacity_limit=100)  # exactly full
    assert repo.held_tokens(SCOPE) == 100
    assert not repo.reserve_submission("q", _sub("c", ["q-1"], tokens=0), capacity_limit=99)
    assert repo.reserve_submission("q", _sub("c", ["q-1"], tokens=0), capacity_limit=100)
    assert repo.reserve_submission("q", _sub("d", ["q-2"], tokens=500, scope="other"), capacity_limit=500)
    assert not repo.reserve_submission("r", _sub("e", ["r-1"], tokens=101, scope="empty"), capacity_limit=100)
    assert repo.reserve_submission("r", _sub("e", ["r-1"], tokens=10**9), capacity_limit=None)
    held = (repo.held_tokens(SCOPE), repo.held_tokens("other"), repo.held_tokens("empty"))
    assert held == (10**9 + 100, 500, 0)


# --- update -----------------------------------------------------------------------------


def test_update_is_a_compare_and_set_that_keeps_fields_it_is_not_given(repo: RunRepository) -> None:
    repo.reserve_submission("r", _sub("s", ["r-0", "r-1"]), capacity_limit=None)
    reserved = frozenset({"reserved"})
    assert repo.update_submission("r", "s", from_states=reserved, to="reserved", input_file_id="file-1")
    assert repo.update_submission("r", "s", from_states=reserved, to="creating", detail="sending")
    assert not repo.update_submission("r", "s", from_states=reserved, to="creating", detail="again")
    assert not repo.update_submission("x", "s", from_states=frozenset({"creating"}), to="unknown")
    assert not repo.update_submission("r", "nope", from_states=frozenset({"creating"}), to="unknown")
    assert not repo.update_submission("r", "s", from_states=frozenset(), to="unknown")
    creating = frozenset({"creating"})
    assert repo.update_submission("r", "s", from_states=creating, to="submitted", batch_id="b1")
    (record,) = repo.submissions("r")
    assert (record.state, record.input_file_id, record.batch_id, record.detail) == (
        "submitted", "file-1", "b1", "sending"
    )
    assert record.updated_at >= record.created_at
    finished = frozenset({"finished"})
    for to, states in [("finished", reserved), ("abandoned", reserved), ("submitted", finished)]:
        with pytest.raises(ValueError, match="must be among"):
            repo.update_submission("r", "s", from_states=states, to=to)  # type: ignore[arg-type]
    assert repo.submissions("r")[0] == record and repo.held_tokens(SCOPE) == 10


def test_snapshot_names_the_oldest_submission_whose_create_is_unresolved(repo: RunRepository) -> None:
    for n, sid in enumerate(["s1", "s2", "s3"]):
        repo.reserve_submission("r", _sub(sid, [f"r-{n}"]), capacity_limit=None)
    assert repo.snapshot("r").unresolved_submission is None  # 'reserved' sent nothing yet
    repo.update_submission("r", "s3", from_states=frozenset({"reserved"}), to="creating")
    repo.update_submission("r", "s2", from_states=frozenset({"reserved"}), to="creating")
    repo.update_submission("r", "s2", from_states=frozenset({"creating"}), to="unknown")
    snap = repo.snapshot("r")
    assert (snap.unresolved_submission, snap.open_submissions, snap.batched) == ("s2", 3, 3)
    repo.update_submission("r", "s2", from_states=frozenset({"unknown"}), to="submitted", batch_id="b")
    assert repo.snapshot("r").unresolved_submission == "s3"
    repo.abandon_submission("r", "s3", to="abandoned", detail="create never sent")
    assert repo.snapshot("r").unresolved_submission is None
    assert [s.submission_id for s in repo.submissions("r")] == ["s1", "s2", "s3"]
    assert [s.submission_id for s in repo.submissions("r", states=LIVE_SUBMISSION_STATES)] == ["s1", "s2"]
    assert [s.submission_id for s in repo.submissions("r", states=frozenset({"abandoned"}))] == ["s3"]
    assert repo.submissions("r", states=frozenset()) == []
    with pytest.raises(ValueError, match="must be among"):
        repo.submissions("r", states=frozenset({"done"}))


# --- abandon ----------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["reserved", "creating", "unknown", "submitted"])
def test_abandon_returns_the_items_and_releases_the_capacity_once(
    repo: RunRepository, state: str
) -> None:
    repo.reserve_submission("r", _sub("s", ["r-4", "r-1"], tokens=30), capacity_limit=None)
    order = ["reserved", "creating", "unknown", "submitted"]
    path = order[1 : order.index(state) + 1]
    current = "reserved"
    for nxt in path:
        assert repo.update_submission("r", "s", from_states=frozenset({current}), to=nxt)  # type: ignore[arg-type]
        current = nxt
    assert repo.abandon_submission("r", "s", to="cancelled", detail="user cancelled") == 2
    (record,) = repo.submissions("r")
    assert (record.state, record.detail) == ("cancelled", "user cancelled")
    assert repo.held_tokens(SCOPE) == 0 and repo.submission_items("r", "s") == []
    assert _pending_ids(repo, "r") == _items("r", 6)
    assert [p.attempts for p in repo.pending("r", after_ingest_seq=0, limit=10)] == [0] * 6
    snap = repo.snapshot("r")
    assert (snap.batched, snap.open_submissions) == (0, 0)
    assert repo.abandon_submission("r", "s", to="abandoned", detail="again") == 0
    assert repo.submissions("r") == [record]
    with pytest.raises(ValueError, match="'abandoned' or 'cancelled'"):
        repo.abandon_submission("r", "s", to="finished", detail=None)  # type: ignore[arg-type]
    assert repo.reserve_submission("r", _sub("s2", ["r-1"]), capacity_limit=None)  # items usable again


# --- finish -----------------------------------------------------------------------------


def test_finish_records_results_retries_the_rest_and_is_exactly_once(repo: RunRepository) -> None:
    _ingest(repo, "q", _items("q", 2))
    repo.record("r", [_result("r-0")])  # sequence 1, from live-style recording
    repo.reserve_submission("r", _sub("other", ["r-5"]), capacity_limit=None)
    repo.reserve_submission("r", _sub("s", ["r-1", "r-2", "r-3", "r-4"], tokens=70), capacity_limit=None)
    assert repo.finish_submission("r", "s", [_result("r-1")], []) == repo.snapshot("r")  # only once submitted
    assert repo.submissions("r", states=frozenset({"reserved"}))[1].submission_id == "s"
    _to_submitted(repo, "r", "s")
    snap = repo.finish_submission(
        "r", "s",
        [_result("r-3", success=False), _result("r-5"), _result("q-0"), _result("ghost"), _result("r-1"),
         _result("r-3")],
        ["r-2", "r-5", "q-1"],
        detail="completed: 2 results",
    )
    # r-3 then r-1 got the next sequences in the order given; the foreign results were skipped.
    assert [(r.sequence, r.item_id) for r in repo.results("r", after_sequence=0, limit=None)] == [
        (1, "r-0"), (2, "r-3"), (3, "r-1")
    ]
    assert (snap.done, snap.succeeded, snap.failed, snap.last_sequence) == (3, 2, 1, 3)
    assert (snap.input_tokens, snap.output_tokens, snap.total_tokens) == (9, 6, 15)
    assert (snap.batched, snap.open_submissions) == (1, 1)  # 'other' still holds r-5
    pending = repo.pending("r", after_ingest_seq=0, limit=10)
    assert [(p.item_id, p.attempts, p.prompt) for p in pending] == [
        ("r-2", 1, "prompt of r-2"), ("r-4", 1, "prompt of r-4")  # listed for retry, and left without one
    ]
    assert [i.item_id for i in repo.submission_items("r", "other")] == ["r-5"]
    assert _pending_ids(repo, "q") == ["q-0", "q-1"] and repo.snapshot("q").done == 0
    record = repo.submissions("r", states=frozenset({"finished"}))[0]
    assert (record.submission_id, record.detail, record.batch_id) == ("s", "completed: 2 results", "batch_s")
    assert repo.held_tokens(SCOPE) == 10
    # A repeat (a crash between the commit and the caller noticing) changes nothing.
    again = repo.finish_submission("r", "s", [_result("r-2"), _result("r-4")], ["r-2"], detail="repeat")
    assert again == repo.snapshot("r") and again.last_sequence == 3
    assert [p.attempts for p in repo.pending("r", after_ingest_seq=0, limit=10)] == [1, 1]
    assert repo.submissions("r", states=frozenset({"finished"}))[0].detail == "completed: 2 results"
    # A second round: attempts count every batch an item came back from without a result.
    repo.reserve_submission("r", _sub("s2", ["r-4", "r-2"]), capacity_limit=None)
    _to_submitted(repo, "r", "s2")
    repo.finish_submission("r", "s2", [_result("r-4")], [])
    assert [(p.item_id, p.attempts) for p in repo.pending("r", after_ingest_seq=0, limit=10)] == [("r-2", 2)]
    assert repo.snapshot("r").last_sequence == 4


def test_a_run_with_open_submissions_is_never_complete(repo: RunRepository) -> None:
    repo.record("r", [_result(i) for i in _items("r", 6)[:4]])
    repo.reserve_submission("r", _sub("s", ["r-4", "r-5"]), capacity_limit=None)
    assert repo.complete("r")[0] is False
    _to_submitted(repo, "r", "s")
    repo.finish_submission("r", "s", [_result("r-4"), _result("r-5")], [])
    completed, snap = repo.complete("r")
    assert completed and snap.status == "completed" and (snap.done, snap.last_sequence) == (6, 6)


# --- migration of a version-1 file --------------------------------------------------------

# The version-1 statements, copied literally (what files written before provider-batch mode hold).
_V1_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS runs (
        run_id TEXT PRIMARY KEY, mode TEXT NOT NULL, identity TEXT NOT NULL,
        identity_fingerprint TEXT NOT NULL, config TEXT NOT NULL, status TEXT NOT NULL, termination TEXT,
        source_position INTEGER NOT NULL DEFAULT 0, source_cursor INTEGER, source_fingerprint TEXT,
        source_last_item TEXT, source_exhausted INTEGER NOT NULL DEFAULT 0,
        items INTEGER NOT NULL DEFAULT 0, done INTEGER NOT NULL DEFAULT 0,
        succeeded INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0,
        input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,
        total_tokens INTEGER NOT NULL DEFAULT 0, last_sequence INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL, updated_at TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS run_items (
        run_id TEXT NOT NULL, item_id TEXT NOT NULL, ingest_seq INTEGER NOT NULL, fingerprint TEXT NOT NULL,
        prompt TEXT, context TEXT, state TEXT NOT NULL, result_sequence INTEGER,
        PRIMARY KEY (run_id, item_id)
    ) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS run_items_by_state ON run_items (run_id, state, ingest_seq)",
    """CREATE TABLE IF NOT EXISTS run_results (
        run_id TEXT NOT NULL, sequence INTEGER NOT NULL, item_id TEXT NOT NULL, success INTEGER NOT NULL,
        error_category TEXT, result TEXT NOT NULL, PRIMARY KEY (run_id, sequence)
    ) WITHOUT ROWID""",
    """INSERT OR IGNORE INTO meta (key, value) VALUES ('runs', '{"runs_schema_version": 1}')""",
)


def _write_v1_file(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("BEGIN IMMEDIATE")
        SqliteFile(path, busy_timeout=5.0).initialise(conn, IDENTITY)  # the artifact header both share
        for statement in _V1_SCHEMA:
            conn.execute(statement)
        conn.execute(
            "INSERT INTO runs (run_id, mode, identity, identity_fingerprint, config, status, source_position,"
            " source_exhausted, items, done, succeeded, input_tokens, output_tokens, total_tokens,"
            " last_sequence, created_at, updated_at)"
            " VALUES ('old', 'provider-batch', ?, ?, '{}', 'running', 4, 1, 4, 1, 1, 3, 2, 5, 1, 't0', 't0')",
            (canonical_json(IDENTITY.to_dict()), identity_fingerprint(IDENTITY)),
        )
        conn.executemany(
            "INSERT INTO run_items (run_id, item_id, ingest_seq, fingerprint, prompt, context, state,"
            " result_sequence) VALUES ('old', ?, ?, 'fp', ?, NULL, ?, ?)",
            [("old-0", 1, None, "done", 1), ("old-1", 2, "p1", "pending", None),
             ("old-2", 3, "p2", "pending", None), ("old-3", 4, "p3", "pending", None)],
        )
        conn.execute("INSERT INTO run_results VALUES ('old', 1, 'old-0', 1, NULL, '{}')")
        conn.execute("COMMIT")
    finally:
        conn.close()


def _stored_version(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(json.loads(conn.execute("SELECT value FROM meta WHERE key = 'runs'").fetchone()[0])[
            "runs_schema_version"
        ])
    finally:
        conn.close()


def test_a_version_1_file_is_readable_read_only_and_migrated_in_place_by_a_writer(tmp_path: Path) -> None:
    db = tmp_path / "v1.sqlite"
    _write_v1_file(db)
    reader = SqliteRunRepository(db, read_only=True)
    reader.open()
    try:
        snap = reader.snapshot("old")
        assert (snap.items, snap.done, snap.batched, snap.open_submissions, snap.unresolved_submission) == (
            4, 1, 0, 0, None
        )
        assert [(p.item_id, p.attempts) for p in reader.pending("old", after_ingest_seq=0, limit=9)] == [
            ("old-1", 0), ("old-2", 0), ("old-3", 0)
        ]
        assert reader.submissions("old") == [] and reader.submission_items("old", "s") == []
        assert reader.held_tokens(SCOPE) == 0
    finally:
        reader.close()
    assert _stored_version(db) == 1  # a reader never migrates

    repo = SqliteRunRepository(db)
    repo.open()
    try:
        assert _stored_version(db) == RUNS_SCHEMA_VERSION
        snap = repo.snapshot("old")
        assert (snap.items, snap.done, snap.last_sequence, snap.total_tokens, snap.batched) == (4, 1, 1, 5, 0)
        assert [p.attempts for p in repo.pending("old", after_ingest_seq=0, limit=9)] == [0, 0, 0]
        assert repo.reserve_submission("old", _sub("s", ["old-1", "old-3"], tokens=7), capacity_limit=10)
        assert repo.snapshot("old").batched == 2
        _to_submitted(repo, "old", "s")
        snap = repo.finish_submission("old", "s", [_result("old-3")], [])
        assert [r.sequence for r in repo.results("old", after_sequence=0, limit=None)] == [1, 2]
        assert [(p.item_id, p.attempts) for p in repo.pending("old", after_ingest_seq=0, limit=9)] == [
            ("old-1", 1), ("old-2", 0)
        ]
        assert (snap.done, repo.held_tokens(SCOPE)) == (2, 0)
    finally:
        repo.close()
    again = SqliteRunRepository(db)  # reopening a migrated file is a no-op
    again.open()
    try:
        assert again.snapshot("old").done == 2 and _stored_version(db) == RUNS_SCHEMA_VERSION
    finally:
        again.close()


def test_a_file_from_a_newer_runs_schema_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "new.sqlite"
    SqliteRunRepository(db).open()
    conn = sqlite3.connect(db, isolation_level=None)
    newer = RUNS_SCHEMA_VERSION + 1
    conn.execute(f"""UPDATE meta SET value = '{{"runs_schema_version": {newer}}}' WHERE key = 'runs'""")
    conn.close()
    for read_only in (False, True):
        with pytest.raises(ArtifactStoreError, match=f"runs schema version {newer} is newer"):
            SqliteRunRepository(db, read_only=read_only).open()


# --- capacity against a model ---------------------------------------------------------------

RUNS = ("a", "b")
LIMITS = {"s1": 100, "s2": 60}


@dataclass
class _ModelSubmission:
    run_id: str
    scope: str
    tokens: int
    items: list[str]
    state: str = "reserved"


@dataclass
class _Model:
    submissions: dict[str, _ModelSubmission] = field(default_factory=dict)
    pending: dict[str, list[str]] = field(default_factory=dict)  # run -> items, ingestion order
    attempts: dict[str, int] = field(default_factory=dict)
    done: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RUNS, 0))

    def held(self, scope: str) -> int:
        return sum(s.tokens for s in self.submissions.values()
                   if s.scope == scope and s.state in LIVE_SUBMISSION_STATES)

    def give_back(self, sub: _ModelSubmission, *, retry: bool) -> None:
        for item_id in sub.items:
            self.attempts[item_id] += int(retry)
        order = {i: n for n, i in enumerate(_items(sub.run_id, 12))}
        self.pending[sub.run_id] = sorted(self.pending[sub.run_id] + sub.items, key=order.__getitem__)


class CapacityMachine(RuleBasedStateMachine):
    """Reserve / advance / finish / abandon across two runs and two scopes, checked against a model."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp()
        self.repo = SqliteRunRepository(Path(self.directory) / "capacity.sqlite")
        self.repo.open()
        self.model = _Model()
        for run_id in RUNS:
            _ingest(self.repo, run_id, _items(run_id, 12))
            self.model.pending[run_id] = _items(run_id, 12)
        self.model.attempts = {i: 0 for run_id in RUNS for i in _items(run_id, 12)}
        self.count = 0

    def teardown(self) -> None:
        self.repo.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    @rule(run_id=st.sampled_from(RUNS), scope=st.sampled_from(sorted(LIMITS)), n=st.integers(1, 4),
          tokens=st.integers(0, 70))
    def reserve(self, run_id: str, scope: str, n: int, tokens: int) -> None:
        items = self.model.pending[run_id][:n]
        if not items:
            return
        self.count += 1
        sid = f"sub-{self.count}"
        admitted = self.model.held(scope) + tokens <= LIMITS[scope]
        assert self.repo.reserve_submission(run_id, _sub(sid, items, tokens, scope),
                                            capacity_limit=LIMITS[scope]) is admitted
        if admitted:
            self.model.submissions[sid] = _ModelSubmission(run_id, scope, tokens, items)
            self.model.pending[run_id] = self.model.pending[run_id][len(items):]

    @rule(data=st.data(), to=st.sampled_from(sorted(LIVE_SUBMISSION_STATES)),
          from_states=st.frozensets(st.sampled_from(sorted(LIVE_SUBMISSION_STATES)), min_size=1))
    def update(self, data: st.DataObject, to: str, from_states: frozenset[str]) -> None:
        if not self.model.submissions:
            return
        sid = data.draw(st.sampled_from(sorted(self.model.submissions)))
        sub = self.model.submissions[sid]
        changed = sub.state in from_states
        assert self.repo.update_submission(sub.run_id, sid, from_states=from_states, to=to) is changed  # type: ignore[arg-type]
        if changed:
            sub.state = to

    @rule(data=st.data())
    def submit(self, data: st.DataObject) -> None:
        unsent = sorted(sid for sid, s in self.model.submissions.items()
                        if s.state in ("reserved", "creating", "unknown"))
        if not unsent:
            return
        sid = data.draw(st.sampled_from(unsent))
        sub = self.model.submissions[sid]
        assert self.repo.update_submission(
            sub.run_id, sid, from_states=frozenset({sub.state}), to="submitted", batch_id=f"batch_{sid}"
        )
        sub.state = "submitted"

    @rule(data=st.data(), to=st.sampled_from(["abandoned", "cancelled"]))
    def abandon(self, data: st.DataObject, to: str) -> None:
        if not self.model.submissions:
            return
        sid = data.draw(st.sampled_from(sorted(self.model.submissions)))
        sub = self.model.submissions[sid]
        live = sub.state in LIVE_SUBMISSION_STATES
        assert self.repo.abandon_submission(sub.run_id, sid, to=to, detail=None) == (  # type: ignore[arg-type]
            len(sub.items) if live else 0
        )
        if live:
            sub.state = to
            self.model.give_back(sub, retry=False)

    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        if not self.model.submissions:
            return
        sid = data.draw(st.sampled_from(sorted(self.model.submissions)))
        sub = self.model.submissions[sid]
        answered = data.draw(st.lists(st.sampled_from(sub.items), unique=True))
        self.repo.finish_submission(sub.run_id, sid, [_result(i) for i in answered], [])
        if sub.state == "submitted":
            sub.state = "finished"
            self.model.done[sub.run_id] += len(answered)
            self.model.give_back(_ModelSubmission(sub.run_id, sub.scope, 0,
                                                  [i for i in sub.items if i not in answered]), retry=True)

    @invariant()
    def capacity_matches_the_model_and_never_exceeds_the_limit(self) -> None:
        for scope, limit in LIMITS.items():
            held = self.repo.held_tokens(scope)
            assert held == self.model.held(scope)
            assert held <= limit

    @invariant()
    def runs_match_the_model(self) -> None:
        for run_id in RUNS:
            live = [(sid, s) for sid, s in self.model.submissions.items()
                    if s.run_id == run_id and s.state in LIVE_SUBMISSION_STATES]
            unresolved = [sid for sid, s in live if s.state in ("creating", "unknown")]
            snap: RunSnapshot = self.repo.snapshot(run_id)
            assert snap.batched == sum(len(s.items) for _, s in live)
            assert snap.open_submissions == len(live)
            assert snap.unresolved_submission == (
                min(unresolved, key=lambda sid: int(sid.split("-")[1])) if unresolved else None
            )
            assert snap.done == snap.last_sequence == self.model.done[run_id]
            pending = self.repo.pending(run_id, after_ingest_seq=0, limit=100)
            assert [(p.item_id, p.attempts) for p in pending] == [
                (i, self.model.attempts[i]) for i in self.model.pending[run_id]
            ]


CapacityMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_capacity_matches_a_model = CapacityMachine.TestCase


# --- capacity races between repository objects ------------------------------------------------

RACERS = 8
TOKENS = 10
LIMIT = 35  # admits exactly 3 of the racers


def _prepare_racers(db: str | Path) -> None:
    setup = repository_at(db)
    setup.open()
    try:
        for n in range(RACERS):
            _ingest(setup, f"run{n}", [f"run{n}-item"])
    finally:
        setup.close()


class _HeldWatcher:
    """Reads held_tokens from its own repository object, in a thread, until stopped."""

    def __init__(self, db: str | Path) -> None:
        self.repo = repository_at(db)
        self.stop = threading.Event()
        self.reading = threading.Event()
        self.seen: list[int] = []
        self.thread = threading.Thread(target=self._watch)

    def _watch(self) -> None:
        self.repo.open()
        try:
            while True:  # one reading at least, and one after the racers are done
                stopping = self.stop.is_set()
                self.seen.append(self.repo.held_tokens(SCOPE))
                self.reading.set()
                if stopping:
                    return
        finally:
            self.reading.set()
            self.repo.close()

    def __enter__(self) -> _HeldWatcher:
        # Reading before the racers start: on a loaded machine the watcher's own open could
        # otherwise take until the race was over, and it would have seen nothing (CI, once).
        self.thread.start()
        self.reading.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def test_reservations_racing_in_threads_never_exceed_the_limit(store: str) -> None:
    db = store
    _prepare_racers(db)
    for round_ in range(4):
        barrier = threading.Barrier(RACERS)
        outcomes: dict[int, bool] = {}
        errors: list[BaseException] = []

        def racer(n: int, barrier: threading.Barrier = barrier, outcomes: dict[int, bool] = outcomes,
                  errors: list[BaseException] = errors, round_: int = round_) -> None:
            repo = repository_at(db)
            repo.open()
            try:
                barrier.wait()
                outcomes[n] = repo.reserve_submission(
                    f"run{n}", _sub(f"r{round_}-{n}", [f"run{n}-item"], TOKENS), capacity_limit=LIMIT
                )
            except BaseException as exc:  # reported below
                errors.append(exc)
                raise
            finally:
                repo.close()

        with _HeldWatcher(db) as watcher:
            threads = [threading.Thread(target=racer, args=(n,)) for n in range(RACERS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        assert errors == []
        assert sorted(outcomes.values()) == [False] * (RACERS - 3) + [True] * 3
        assert watcher.seen and max(watcher.seen) <= LIMIT
        check = repository_at(db)
        check.open()
        try:
            assert check.held_tokens(SCOPE) == 3 * TOKENS
            for n in (n for n, admitted in outcomes.items() if admitted):  # free the room for the next round
                assert check.abandon_submission(f"run{n}", f"r{round_}-{n}", to="abandoned", detail=None) == 1
            assert check.held_tokens(SCOPE) == 0
        finally:
            check.close()


_CHILD = """
import sys
from trio_batch_llm._runs._schema import NewSubmission
from trio_batch_llm._runs.repository._sqlite import SqliteRunRepository
db, run_id, scope, tokens, limit = sys.argv[1:]
repo = SqliteRunRepository(db)
repo.open()
print("ready", flush=True)
sys.stdin.readline()
ok = repo.reserve_submission(
    run_id, NewSubmission("p-" + run_id, scope, (run_id + "-item",), int(tokens)), capacity_limit=int(limit)
)
print("admitted" if ok else "refused", flush=True)
repo.close()
"""


def test_reservations_racing_in_processes_never_exceed_the_limit(tmp_path: Path) -> None:
    db = tmp_path / "race.sqlite"
    _prepare_racers(db)
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(db), f"run{n}", SCOPE, str(TOKENS), str(LIMIT)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        for n in range(6)
    ]
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
        with _HeldWatcher(db) as watcher:
            for child in children:  # every child is waiting on its stdin: release them together
                assert child.stdin is not None
                child.stdin.write("go\n")
                child.stdin.flush()
            outputs = [child.communicate(timeout=30)[0].strip() for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert [child.returncode for child in children] == [0] * 6
    assert sorted(outputs) == ["admitted"] * 3 + ["refused"] * 3
    assert watcher.seen and max(watcher.seen) <= LIMIT
    check = SqliteRunRepository(db, read_only=True)
    check.open()
    try:
        assert check.held_tokens(SCOPE) == 3 * TOKENS
    finally:
        check.close()
