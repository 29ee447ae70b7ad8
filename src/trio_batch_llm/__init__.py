"""trio-batch-llm: run thousands of LLM calls concurrently and correctly, on Trio or asyncio."""

from ._artifacts import ArtifactStore as ArtifactStore
from ._artifacts import JsonlArtifactStore as JsonlArtifactStore
from ._artifacts import SqliteArtifactStore as SqliteArtifactStore
from ._artifacts._identity import infer_artifact_identity as infer_artifact_identity
from ._artifacts._protocol import StoredRecord as StoredRecord
from ._artifacts._protocol import StoreStatistics as StoreStatistics
from ._compat._classifiers import AnthropicErrorClassifier as AnthropicErrorClassifier
from ._compat._classifiers import DefaultErrorClassifier as DefaultErrorClassifier
from ._compat._classifiers import ErrorClassifier as ErrorClassifier
from ._compat._classifiers import ErrorInfo as ErrorInfo
from ._compat._classifiers import GeminiErrorClassifier as GeminiErrorClassifier
from ._compat._classifiers import OpenAIErrorClassifier as OpenAIErrorClassifier
from ._compat._classifiers import OpenRouterErrorClassifier as OpenRouterErrorClassifier
from ._compat._middleware import BaseMiddleware as BaseMiddleware
from ._compat._observer import BaseObserver as BaseObserver
from ._compat._timing import TimeoutCategory as TimeoutCategory
from ._core._cleanup import CLEANUP_FAILED as CLEANUP_FAILED
from ._core._cleanup import CLEANUP_TIMED_OUT as CLEANUP_TIMED_OUT
from ._core._cleanup import with_cleanup as with_cleanup
from ._core._ledger import CLEANUP_SLOW_WARNING_SECONDS as CLEANUP_SLOW_WARNING_SECONDS
from ._core._ledger import PROGRESS_TASK_CANCELLATION_TIMEOUT as PROGRESS_TASK_CANCELLATION_TIMEOUT
from ._core._ledger import WORKER_CANCELLATION_TIMEOUT as WORKER_CANCELLATION_TIMEOUT
from ._core._ledger import LedgerState as LedgerState
from ._core._ledger import LedgerStatistics as LedgerStatistics
from ._engine._channel import ResultChannelStatistics as ResultChannelStatistics
from ._engine._classifier_objects import SupportsClassify as SupportsClassify
from ._engine._entrypoints import ProcessorOptions as ProcessorOptions
from ._engine._entrypoints import ResultStream as ResultStream
from ._engine._entrypoints import call as call
from ._engine._entrypoints import call_result as call_result
from ._engine._entrypoints import process_prompts as process_prompts
from ._engine._entrypoints import process_stream as process_stream
from ._engine._pool import LLMCallPool as LLMCallPool
from ._engine._pool import PoolStatistics as PoolStatistics
from ._engine._processor import ParallelBatchProcessor as ParallelBatchProcessor
from ._engine._unowned import StreamBlock as StreamBlock
from ._host._executor import ExecutorHost as ExecutorHost
from ._host._executor import HostStatistics as HostStatistics
from ._observe._event_names import ProcessingEvent as ProcessingEvent
from ._observe._events import AttemptFailed as AttemptFailed
from ._observe._events import AttemptStarted as AttemptStarted
from ._observe._events import AttemptSucceeded as AttemptSucceeded
from ._observe._events import BatchFinished as BatchFinished
from ._observe._events import BatchStarted as BatchStarted
from ._observe._events import ItemCompleted as ItemCompleted
from ._observe._events import ItemFailed as ItemFailed
from ._observe._events import ItemReplayed as ItemReplayed
from ._observe._events import ItemStarted as ItemStarted
from ._observe._events import LifecycleEvent as LifecycleEvent
from ._observe._events import Observer as Observer
from ._observe._hooks import Middleware as Middleware
from ._observe._metrics import DEFAULT_LATENCY_BUCKETS as DEFAULT_LATENCY_BUCKETS
from ._observe._metrics import MetricsObserver as MetricsObserver
from ._observe._otel import OpenTelemetryObserver as OpenTelemetryObserver
from ._observe._prometheus import PrometheusCollector as PrometheusCollector
from ._observe._snapshot import Progress as Progress
from ._observe._snapshot import ProgressSnapshot as ProgressSnapshot
from ._runs import PostgresRunRepository as PostgresRunRepository
from ._runs import ProviderBatchConfig as ProviderBatchConfig
from ._runs import Run as Run
from ._runs import RunRepository as RunRepository
from ._runs import RunResult as RunResult
from ._runs import RunSnapshot as RunSnapshot
from ._runs import RunTermination as RunTermination
from ._runs import SourceCheckpoint as SourceCheckpoint
from ._runs import SqliteRunRepository as SqliteRunRepository
from ._runs import iter_run_results as iter_run_results
from ._runs import list_runs as list_runs
from ._runs import open_run as open_run
from ._runs import read_run_snapshot as read_run_snapshot
from ._runs._reader import read_lease_report as read_lease_report
from ._runs._schema import NewItem as NewItem
from ._runs._schema import NewResult as NewResult
from ._runs._schema import NewSubmission as NewSubmission
from ._runs._schema import PendingItem as PendingItem
from ._runs._schema import RunSpec as RunSpec
from ._runs._schema import StoredResult as StoredResult
from ._runs._schema import SubmissionRecord as SubmissionRecord
from ._runs.repository._leases import DriverRecord as DriverRecord
from ._runs.repository._leases import LeaseReport as LeaseReport
from ._strategies._base import LLMCallStrategy as LLMCallStrategy
from ._strategies._batch import BatchConnection as BatchConnection
from ._strategies._batch import BatchEndpoint as BatchEndpoint
from ._strategies._batch import BatchInfo as BatchInfo
from ._strategies._batch import BatchItemOutcome as BatchItemOutcome
from ._strategies._batch import BatchRequest as BatchRequest
from ._strategies._batch import SendMark as SendMark
from ._strategies._callable import CallableStrategy as CallableStrategy
from ._strategies._callable import CallOutcome as CallOutcome
from ._strategies._factory import llm as llm
from ._strategies._fake import FakeStrategy as FakeStrategy
from ._strategies._keys import Secret as Secret
from ._strategies.anthropic._strategy import AnthropicStrategy as AnthropicStrategy
from ._strategies.gemini._cache import GeminiContextCache as GeminiContextCache
from ._strategies.gemini._strategy import GeminiStrategy as GeminiStrategy
from ._strategies.openai._compatible import OpenAICompatibleStrategy as OpenAICompatibleStrategy
from ._strategies.openai._sdk import OpenAIStrategy as OpenAIStrategy
from ._strategies.pydantic_ai._strategy import PydanticAIStrategy as PydanticAIStrategy
from ._values._artifact_identity import ArtifactIdentity as ArtifactIdentity
from ._values._batch_result import BatchResult as BatchResult
from ._values._breaker_config import CircuitBreakerConfig as CircuitBreakerConfig
from ._values._categories import ErrorCategory as ErrorCategory
from ._values._config import AbortMode as AbortMode
from ._values._config import FromConfig as FromConfig
from ._values._config import GuardrailConfig as GuardrailConfig
from ._values._config import ProcessorConfig as ProcessorConfig
from ._values._config import RateLimitConfig as RateLimitConfig
from ._values._config import ResumePolicy as ResumePolicy
from ._values._config import RetryConfig as RetryConfig
from ._values._cost import DEFAULT_MODEL_RATES as DEFAULT_MODEL_RATES
from ._values._cost import DEFAULT_MODEL_RATES_AS_OF as DEFAULT_MODEL_RATES_AS_OF
from ._values._cost import ModelRates as ModelRates
from ._values._cost import Rates as Rates
from ._values._details import ResponseDetails as ResponseDetails
from ._values._details import ToolCall as ToolCall
from ._values._errors import AdmissionClosedError as AdmissionClosedError
from ._values._errors import ArtifactEncodeError as ArtifactEncodeError
from ._values._errors import ArtifactMismatchError as ArtifactMismatchError
from ._values._errors import ArtifactStoreError as ArtifactStoreError
from ._values._errors import AsyncBatchLLMError as AsyncBatchLLMError
from ._values._errors import AttemptTimedOut as AttemptTimedOut
from ._values._errors import BatchInterruptedError as BatchInterruptedError
from ._values._errors import BatchLLMError as BatchLLMError
from ._values._errors import CleanupInterruptedError as CleanupInterruptedError
from ._values._errors import ConfigurationError as ConfigurationError
from ._values._errors import DatabaseUnavailableError as DatabaseUnavailableError
from ._values._errors import ItemDeadlineExceeded as ItemDeadlineExceeded
from ._values._errors import ProviderError as ProviderError
from ._values._errors import QueueFullError as QueueFullError
from ._values._errors import QuotaBackendError as QuotaBackendError
from ._values._errors import RunSourceError as RunSourceError
from ._values._errors import RunStateError as RunStateError
from ._values._errors import StreamFinalizationError as StreamFinalizationError
from ._values._prompts import LLMRequest as LLMRequest
from ._values._quota_backend import RedisQuotaBackend as RedisQuotaBackend
from ._values._quota_reports import QuotaScopeStatistics as QuotaScopeStatistics
from ._values._ramp import StartupRampConfig as StartupRampConfig
from ._values._requests import LLMWorkItem as LLMWorkItem
from ._values._response_cache import MemoryResponseCache as MemoryResponseCache
from ._values._response_cache import PostgresResponseCache as PostgresResponseCache
from ._values._response_cache import RedisResponseCache as RedisResponseCache
from ._values._response_cache import ResponseCache as ResponseCache
from ._values._response_cache import SqliteResponseCache as SqliteResponseCache
from ._values._results import BatchTermination as BatchTermination
from ._values._results import LLMCallError as LLMCallError
from ._values._results import RetryState as RetryState
from ._values._results import TokenUsage as TokenUsage
from ._values._results import WorkItemResult as WorkItemResult
from ._values._stats import CounterSnapshot as CounterSnapshot
from ._values._stats import ProcessorStatistics as ProcessorStatistics
from ._values._stop_reasons import StopReason as StopReason
from ._values._structured import StructuredOutputError as StructuredOutputError
from ._values._timing import AttemptTiming as AttemptTiming
from ._values._timing import ItemTiming as ItemTiming
from ._values._token_estimates import TokenEstimate as TokenEstimate
from ._version import __version__ as __version__

__all__ = [
    "AbortMode",
    "AdmissionClosedError",
    "AnthropicErrorClassifier",
    "AnthropicStrategy",
    "ArtifactEncodeError",
    "ArtifactIdentity",
    "ArtifactMismatchError",
    "ArtifactStore",
    "ArtifactStoreError",
    "AsyncBatchLLMError",
    "AttemptFailed",
    "AttemptStarted",
    "AttemptSucceeded",
    "AttemptTimedOut",
    "AttemptTiming",
    "BaseMiddleware",
    "BaseObserver",
    "BatchConnection",
    "BatchEndpoint",
    "BatchFinished",
    "BatchInfo",
    "BatchInterruptedError",
    "BatchItemOutcome",
    "BatchLLMError",
    "BatchRequest",
    "BatchResult",
    "BatchStarted",
    "BatchTermination",
    "CLEANUP_FAILED",
    "CLEANUP_SLOW_WARNING_SECONDS",
    "CLEANUP_TIMED_OUT",
    "CallOutcome",
    "CallableStrategy",
    "CircuitBreakerConfig",
    "CleanupInterruptedError",
    "ConfigurationError",
    "CounterSnapshot",
    "DEFAULT_LATENCY_BUCKETS",
    "DEFAULT_MODEL_RATES",
    "DEFAULT_MODEL_RATES_AS_OF",
    "DatabaseUnavailableError",
    "DefaultErrorClassifier",
    "DriverRecord",
    "ErrorCategory",
    "ErrorClassifier",
    "ErrorInfo",
    "ExecutorHost",
    "FakeStrategy",
    "FromConfig",
    "GeminiContextCache",
    "GeminiErrorClassifier",
    "GeminiStrategy",
    "GuardrailConfig",
    "HostStatistics",
    "ItemCompleted",
    "ItemDeadlineExceeded",
    "ItemFailed",
    "ItemReplayed",
    "ItemStarted",
    "ItemTiming",
    "JsonlArtifactStore",
    "LLMCallError",
    "LLMCallPool",
    "LLMCallStrategy",
    "LLMRequest",
    "LLMWorkItem",
    "LeaseReport",
    "LedgerState",
    "LedgerStatistics",
    "LifecycleEvent",
    "MemoryResponseCache",
    "MetricsObserver",
    "Middleware",
    "ModelRates",
    "NewItem",
    "NewResult",
    "NewSubmission",
    "Observer",
    "OpenAICompatibleStrategy",
    "OpenAIErrorClassifier",
    "OpenAIStrategy",
    "OpenRouterErrorClassifier",
    "OpenTelemetryObserver",
    "PROGRESS_TASK_CANCELLATION_TIMEOUT",
    "ParallelBatchProcessor",
    "PendingItem",
    "PoolStatistics",
    "PostgresResponseCache",
    "PostgresRunRepository",
    "ProcessingEvent",
    "ProcessorConfig",
    "ProcessorOptions",
    "ProcessorStatistics",
    "Progress",
    "ProgressSnapshot",
    "PrometheusCollector",
    "ProviderBatchConfig",
    "ProviderError",
    "PydanticAIStrategy",
    "QueueFullError",
    "QuotaBackendError",
    "QuotaScopeStatistics",
    "RateLimitConfig",
    "Rates",
    "RedisQuotaBackend",
    "RedisResponseCache",
    "ResponseCache",
    "ResponseDetails",
    "ResultChannelStatistics",
    "ResultStream",
    "ResumePolicy",
    "RetryConfig",
    "RetryState",
    "Run",
    "RunRepository",
    "RunResult",
    "RunSnapshot",
    "RunSourceError",
    "RunSpec",
    "RunStateError",
    "RunTermination",
    "Secret",
    "SendMark",
    "SourceCheckpoint",
    "SqliteArtifactStore",
    "SqliteResponseCache",
    "SqliteRunRepository",
    "StartupRampConfig",
    "StopReason",
    "StoreStatistics",
    "StoredRecord",
    "StoredResult",
    "StreamBlock",
    "StreamFinalizationError",
    "StructuredOutputError",
    "SubmissionRecord",
    "SupportsClassify",
    "TimeoutCategory",
    "TokenEstimate",
    "TokenUsage",
    "ToolCall",
    "WORKER_CANCELLATION_TIMEOUT",
    "WorkItemResult",
    "__version__",
    "call",
    "call_result",
    "infer_artifact_identity",
    "iter_run_results",
    "list_runs",
    "llm",
    "open_run",
    "process_prompts",
    "process_stream",
    "read_lease_report",
    "read_run_snapshot",
    "with_cleanup",
]

from ._public import fixup_module_metadata as _fixup_module_metadata

_fixup_module_metadata(__name__, globals())
del _fixup_module_metadata
