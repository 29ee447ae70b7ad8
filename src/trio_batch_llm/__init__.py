"""trio-batch-llm: run thousands of LLM calls concurrently and correctly, on Trio or asyncio."""

from ._cleanup import CLEANUP_FAILED as CLEANUP_FAILED
from ._cleanup import CLEANUP_TIMED_OUT as CLEANUP_TIMED_OUT
from ._cleanup import with_cleanup as with_cleanup
from ._config import AbortMode as AbortMode
from ._config import ArtifactIdentity as ArtifactIdentity
from ._config import GuardrailConfig as GuardrailConfig
from ._config import ProcessorConfig as ProcessorConfig
from ._config import RateLimitConfig as RateLimitConfig
from ._config import ResumePolicy as ResumePolicy
from ._config import RetryConfig as RetryConfig
from ._errors import AdmissionClosedError as AdmissionClosedError
from ._errors import ArtifactMismatchError as ArtifactMismatchError
from ._errors import ArtifactStoreError as ArtifactStoreError
from ._errors import AsyncBatchLLMError as AsyncBatchLLMError
from ._errors import BatchInterruptedError as BatchInterruptedError
from ._errors import BatchLLMError as BatchLLMError
from ._errors import CleanupInterruptedError as CleanupInterruptedError
from ._errors import ConfigurationError as ConfigurationError
from ._errors import ErrorCategory as ErrorCategory
from ._errors import ItemDeadlineExceeded as ItemDeadlineExceeded
from ._errors import LLMCallError as LLMCallError
from ._errors import ProviderError as ProviderError
from ._errors import QueueFullError as QueueFullError
from ._errors import StreamFinalizationError as StreamFinalizationError
from ._results import BatchResult as BatchResult
from ._results import BatchTermination as BatchTermination
from ._results import ItemTiming as ItemTiming
from ._results import LLMWorkItem as LLMWorkItem
from ._results import RetryState as RetryState
from ._results import TokenUsage as TokenUsage
from ._results import WorkItemResult as WorkItemResult
from ._strategies._base import LLMCallStrategy as LLMCallStrategy
from ._strategies._callable import CallableStrategy as CallableStrategy
from ._strategies._callable import CallOutcome as CallOutcome
from ._strategies._fake import FakeStrategy as FakeStrategy
from ._version import __version__ as __version__

__all__ = [
    "AbortMode",
    "AdmissionClosedError",
    "ArtifactIdentity",
    "ArtifactMismatchError",
    "ArtifactStoreError",
    "AsyncBatchLLMError",
    "BatchInterruptedError",
    "BatchLLMError",
    "BatchResult",
    "BatchTermination",
    "CLEANUP_FAILED",
    "CLEANUP_TIMED_OUT",
    "CallOutcome",
    "CallableStrategy",
    "CleanupInterruptedError",
    "ConfigurationError",
    "ErrorCategory",
    "FakeStrategy",
    "GuardrailConfig",
    "ItemDeadlineExceeded",
    "ItemTiming",
    "LLMCallError",
    "LLMCallStrategy",
    "LLMWorkItem",
    "ProcessorConfig",
    "ProviderError",
    "QueueFullError",
    "RateLimitConfig",
    "ResumePolicy",
    "RetryConfig",
    "RetryState",
    "StreamFinalizationError",
    "TokenUsage",
    "WorkItemResult",
    "__version__",
    "with_cleanup",
]
