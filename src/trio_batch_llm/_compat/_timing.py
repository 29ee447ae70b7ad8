"""``TimeoutCategory``: which deadline ended an attempt, in async-batch-llm's words."""

from __future__ import annotations

import enum
from typing import final

__all__ = ["TimeoutCategory"]


@final
class TimeoutCategory(enum.StrEnum):
    """Kinds of timeout. Here they are told apart by the result's category: ``TIMEOUT`` is the
    attempt's own (``attempt_timeout``) or the provider's, ``DEADLINE`` the item's or the batch's."""

    FRAMEWORK_EXECUTION_TIMEOUT = "framework_execution_timeout"
    FRAMEWORK_TOTAL_ITEM_TIMEOUT = "framework_total_item_timeout"
    PROVIDER_OR_TRANSPORT_TIMEOUT = "provider_or_transport_timeout"
    ADMISSION_TIMEOUT = "admission_timeout"
