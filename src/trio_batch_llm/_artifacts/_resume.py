"""Resume decisions: replay a stored result, or run the item again.

The engine calls :func:`prepare_resume` once (it opens the store and loads
what may be replayed) and then ``plan.replay(item)`` per item. Underneath,
:func:`decide_resume` is a pure function of the stored record, the policy and
the current fingerprint. A stored result is replayed only when all of these hold:

* the policy is not ``NONE`` (and under ``NONE`` a non-empty store is refused
  before any work starts: :func:`ensure_store_usable`);
* the record was written under the identity the store was opened with;
* the item's current fingerprint (prompt + context) equals the stored one;
* the policy covers the stored outcome:

  ===================  ===========================================================
  ``REUSE_SUCCESSES``  successes only
  ``REUSE_ALL``        successes, and *terminal provider failures*: categories
                       that are neither retryable nor an engine verdict, minus
                       the account/configuration ones (see below)
  ===================  ===========================================================

Always rerun, whatever the policy:

* engine verdicts (``DEADLINE``, ``ABORTED``, ``BUDGET``, ``NOT_EXECUTED``):
  they say nothing about the item itself;
* configuration failures (``AUTHENTICATION``, ``INSUFFICIENT_BALANCE``): the
  operator fixes the key or the balance and resumes to get real answers;
* retryable failures that ran out of retries (``RATE_LIMIT``, ``TIMEOUT``,
  ``TRANSIENT``, ``SERVER``, ``PARSE``, ``UNKNOWN``): a later run may well
  succeed, so rerunning is the safe choice;
* failures without a category.

So under ``REUSE_ALL`` the replayed failures are ``INVALID_REQUEST``,
``CONTEXT_LENGTH`` and ``CONTENT_POLICY``: the same input would fail the same way.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, final

from .._values._categories import ErrorCategory
from .._values._config import ResumePolicy
from .._values._errors import ArtifactStoreError, ConfigurationError
from .._values._requests import LLMWorkItem, Prompt
from .._values._results import WorkItemResult
from ._fingerprint import request_fingerprint
from ._protocol import ArtifactStore, StoredRecord

__all__ = [
    "CONFIGURATION_FAILURES",
    "ResumeDecision",
    "RerunReason",
    "decide_resume",
    "ResumePlan",
    "ensure_store_usable",
    "prepare_resume",
    "replayable_failure",
]

CONFIGURATION_FAILURES: Final = frozenset(
    {ErrorCategory.AUTHENTICATION, ErrorCategory.INSUFFICIENT_BALANCE}
)


class RerunReason(enum.Enum):
    """Why an item is run (again) instead of replayed."""

    NOT_STORED = "not_stored"
    POLICY_NONE = "policy_none"
    IDENTITY_CHANGED = "identity_changed"
    INPUT_CHANGED = "input_changed"
    FAILURE_NOT_REUSED = "failure_not_reused"


@final
@dataclass(frozen=True, slots=True)
class ResumeDecision:
    """Replay ``replay`` (a result marked ``replayed=True``), or rerun for ``rerun_reason``."""

    replay: WorkItemResult[Any] | None
    rerun_reason: RerunReason | None

    @property
    def replays(self) -> bool:
        return self.replay is not None


_NOT_STORED: Final = ResumeDecision(None, RerunReason.NOT_STORED)


def replayable_failure(category: ErrorCategory | str | None) -> bool:
    """Whether ``REUSE_ALL`` replays a failure of ``category`` (see the module docstring)."""
    if category is None:
        return False
    try:
        category = ErrorCategory(category)
    except ValueError:
        return False  # written by a newer version with a category we do not know
    return not (
        category.retryable or category.engine_verdict or category in CONFIGURATION_FAILURES
    )


def _policy_covers(stored: StoredRecord, policy: ResumePolicy) -> bool:
    if stored.success:
        return True
    return policy is ResumePolicy.REUSE_ALL and replayable_failure(stored.result.get("error_category"))


def decide_resume(
    stored: StoredRecord | None,
    *,
    policy: ResumePolicy,
    fingerprint: str,
    context: Any = None,
) -> ResumeDecision:
    """Replay ``stored`` for the current item, or say why it must run.

    ``fingerprint`` is the current item's :func:`fingerprint` of prompt and
    context. A replayed result carries the current ``context`` (the stored one
    is only an audit copy) and keeps the stored output, usage and timing.
    """
    if stored is None:
        return ResumeDecision(None, RerunReason.NOT_STORED)
    if policy is ResumePolicy.NONE:
        return ResumeDecision(None, RerunReason.POLICY_NONE)
    if not stored.identity_matches:
        return ResumeDecision(None, RerunReason.IDENTITY_CHANGED)
    if stored.fingerprint != fingerprint:
        return ResumeDecision(None, RerunReason.INPUT_CHANGED)
    if not _policy_covers(stored, policy):
        return ResumeDecision(None, RerunReason.FAILURE_NOT_REUSED)
    result = stored.to_result(replayed=True)
    result.context = context
    return ResumeDecision(result, None)


def ensure_store_usable(policy: ResumePolicy, *, path: Path | str, stored_count: int) -> None:
    """Under ``ResumePolicy.NONE``, refuse a store that already holds results."""
    if policy is ResumePolicy.NONE and stored_count > 0:
        raise ArtifactStoreError(
            f"{path} already holds {stored_count} stored result(s) and resume=ResumePolicy.NONE; "
            "pass resume=ResumePolicy.REUSE_SUCCESSES (or REUSE_ALL) to continue that run, "
            "or use a new path"
        )


@final
class ResumePlan:
    """The stored records of one run, consumed item by item as the engine meets them.

    Each record is looked at once: :meth:`decide` (and :meth:`replay`) drop it
    from memory, since the item either replays it or writes a newer record.
    """

    def __init__(self, records: dict[str, StoredRecord], policy: ResumePolicy, *,
                 check_strategy: Callable[[Any], object] | None = None) -> None:
        self._records = records
        self._policy = policy
        self._check_strategy = check_strategy
        self._checked: dict[int, object] = {}  # id -> strategy (kept alive, so the id stays its own)
        self.replayed = 0
        self.rerun: dict[RerunReason, int] = {}

    @property
    def policy(self) -> ResumePolicy:
        return self._policy

    def __len__(self) -> int:
        """Records not yet looked at."""
        return len(self._records)

    def decide(self, item_id: str, prompt: Prompt, context: Any = None,
               params: Mapping[str, Any] | None = None) -> ResumeDecision:
        stored = self._records.pop(item_id, None)
        if stored is None:
            # Hot path of every fresh run: nothing to compare, so no fingerprint to compute.
            decision = _NOT_STORED
        else:
            decision = decide_resume(
                stored, policy=self._policy, fingerprint=request_fingerprint(prompt, params, context),
                context=context,
            )
        if decision.rerun_reason is None:
            self.replayed += 1
        else:
            self.rerun[decision.rerun_reason] = self.rerun.get(decision.rerun_reason, 0) + 1
        return decision

    def replay(self, item: LLMWorkItem[Any]) -> WorkItemResult[Any] | None:
        """The replayed result for ``item``, or ``None`` when it must run.

        With ``check_strategy`` (a store whose identity was inferred from a strategy), each
        item's strategy is checked first, once per strategy object: an item whose strategy has
        another identity (another model) is refused before it runs, since the records it would
        write would carry the other strategy's identity.
        """
        check = self._check_strategy
        if check is not None and id(item.strategy) not in self._checked:
            try:
                check(item.strategy)
            except ConfigurationError as exc:
                raise ConfigurationError("item_id", item.item_id, str(exc)) from exc
            self._checked[id(item.strategy)] = item.strategy
        replay = self.decide(item.item_id, item.prompt, item.context, item.params).replay
        decode = getattr(item.strategy, "decode_output", None)  # any object may stand in as a strategy
        if replay is not None and replay.output is not None and decode is not None:
            # A store keeps plain JSON; the item's strategy turns it back (a response model's instance).
            try:
                replay.output = decode(replay.output)
            except Exception:  # noqa: BLE001 - the response model changed: the stored output is stale
                self.replayed -= 1
                self.rerun[RerunReason.INPUT_CHANGED] = self.rerun.get(RerunReason.INPUT_CHANGED, 0) + 1
                return None
        return replay


async def prepare_resume(store: ArtifactStore, policy: ResumePolicy) -> ResumePlan:
    """Open ``store`` and load what a run with ``policy`` may replay.

    Under ``NONE`` nothing is loaded and a store that already holds results is
    refused (:func:`ensure_store_usable`).
    """
    policy = ResumePolicy(policy)
    await store.open()
    strategy_check = getattr(store, "strategy_check", None)  # a built-in store's
    check = strategy_check() if callable(strategy_check) else None
    if policy is ResumePolicy.NONE:
        ensure_store_usable(policy, path=store.path, stored_count=await store.count_records())
        return ResumePlan({}, policy, check_strategy=check)
    return ResumePlan(await store.load(), policy, check_strategy=check)
