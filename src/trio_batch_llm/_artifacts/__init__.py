"""Checkpoint stores (JSONL, SQLite), their protocol, fingerprints and resume decisions."""

from ._codec import OutputCodec as OutputCodec
from ._codec import unstorable_failure as unstorable_failure
from ._fingerprint import fingerprint as fingerprint
from ._fingerprint import identity_fingerprint as identity_fingerprint
from ._fingerprint import item_fingerprint as item_fingerprint
from ._fingerprint import request_fingerprint as request_fingerprint
from ._jsonl import JsonlArtifactStore as JsonlArtifactStore
from ._protocol import ArtifactStore as ArtifactStore
from ._protocol import StoredRecord as StoredRecord
from ._protocol import StoreStatistics as StoreStatistics
from ._resume import RerunReason as RerunReason
from ._resume import ResumeDecision as ResumeDecision
from ._resume import ResumePlan as ResumePlan
from ._resume import decide_resume as decide_resume
from ._resume import ensure_store_usable as ensure_store_usable
from ._resume import prepare_resume as prepare_resume
from ._sqlite import SqliteArtifactStore as SqliteArtifactStore
from ._store_base import append_result as append_result

__all__ = [
    "ArtifactStore",
    "JsonlArtifactStore",
    "OutputCodec",
    "RerunReason",
    "ResumeDecision",
    "ResumePlan",
    "SqliteArtifactStore",
    "StoreStatistics",
    "StoredRecord",
    "append_result",
    "decide_resume",
    "ensure_store_usable",
    "fingerprint",
    "identity_fingerprint",
    "item_fingerprint",
    "prepare_resume",
    "request_fingerprint",
    "unstorable_failure",
]
