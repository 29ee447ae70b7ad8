"""Admission: pure quota cores, the combined scope state, async admission, the registry.

Other packages import from here only; ``_limits`` and ``_core`` are this package's own.

    _limits    pure RPM / TPM / cooldown cores, each a function of (state, now)
    _core      one scope's combined machine: a frozen Grant per admission, FIFO waiters
    _scope     QuotaScope (the clock and one Event per waiter) and Admission, the engine's handle
    _registry  QuotaRegistry: one scope per quota key of a host
"""

from ._core import QuotaScopeStatistics as QuotaScopeStatistics
from ._registry import QuotaRegistry as QuotaRegistry
from ._registry import QuotaRegistryStatistics as QuotaRegistryStatistics
from ._scope import Admission as Admission
from ._scope import QuotaScope as QuotaScope

__all__ = ["Admission", "QuotaRegistry", "QuotaRegistryStatistics", "QuotaScope", "QuotaScopeStatistics"]
