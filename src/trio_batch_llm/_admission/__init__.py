"""Admission: pure quota and pacing cores, the combined scope state, async admission, the registry.

Other packages import from here only; the modules below are this package's own.

    _limits     pure RPM / TPM / cooldown cores, each a function of (state, now)
    _headers    rate-limit headers -> a RateLimitObservation (pure)
    _pacing     header pacing: the provider's reported budgets as ceilings, spread (pure)
    _discovery  a request rate learnt from 429s alone: AIMD (pure)
    _records    the Grant of an admitted call, a waiter's Ticket, statistics
    _core       one scope's combined machine: a frozen Grant per admission, FIFO waiters
    _scope      QuotaScope (the clock and one Event per waiter) and Admission, the engine's handle
    _registry   QuotaRegistry: one scope per quota key of a host
"""

from .._values._quota_reports import QuotaScopeStatistics as QuotaScopeStatistics
from ._headers import RATE_LIMIT_METADATA_KEY as RATE_LIMIT_METADATA_KEY
from ._headers import RateLimitObservation as RateLimitObservation
from ._headers import parse_rate_limit_headers as parse_rate_limit_headers
from ._headers import rate_limit_headers as rate_limit_headers
from ._registry import QuotaRegistry as QuotaRegistry
from ._registry import QuotaRegistryStatistics as QuotaRegistryStatistics
from ._scope import Admission as Admission
from ._scope import QuotaScope as QuotaScope

__all__ = [
    "RATE_LIMIT_METADATA_KEY",
    "Admission",
    "QuotaRegistry",
    "QuotaRegistryStatistics",
    "QuotaScope",
    "QuotaScopeStatistics",
    "RateLimitObservation",
    "parse_rate_limit_headers",
    "rate_limit_headers",
]
