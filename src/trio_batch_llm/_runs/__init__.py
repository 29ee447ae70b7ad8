"""Durable runs (issue 12): named, resumable jobs whose state lives in the store.

Two modes: ``live`` (calls through the engine) and ``provider-batch`` (the
provider's Batch API, see :mod:`._batch_drive`). Their state lives behind the
``RunRepository`` protocol (``repository/``).
"""

from ._batch_config import ProviderBatchConfig as ProviderBatchConfig
from ._open import open_run as open_run
from ._reader import iter_run_results as iter_run_results
from ._reader import list_runs as list_runs
from ._reader import read_run_snapshot as read_run_snapshot
from ._run import Run as Run
from ._schema import RunResult as RunResult
from ._schema import RunSnapshot as RunSnapshot
from ._schema import RunSourceError as RunSourceError
from ._schema import RunStateError as RunStateError
from ._schema import RunTermination as RunTermination
from ._schema import SourceCheckpoint as SourceCheckpoint
from .repository._postgres import PostgresRunRepository as PostgresRunRepository
from .repository._protocol import RunRepository as RunRepository
from .repository._sqlite import SqliteRunRepository as SqliteRunRepository

__all__ = [
    "PostgresRunRepository",
    "ProviderBatchConfig",
    "Run",
    "RunRepository",
    "RunResult",
    "RunSnapshot",
    "RunSourceError",
    "RunStateError",
    "RunTermination",
    "SourceCheckpoint",
    "SqliteRunRepository",
    "iter_run_results",
    "list_runs",
    "open_run",
    "read_run_snapshot",
]
