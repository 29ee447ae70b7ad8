"""A :class:`Binding`: one strategy as the item path uses it, resolved once per owner.

What the path needs of a strategy (its quota scope, its token estimate, its classifiers, its
breaker, whether it parses, the short way to call it) looked up once, when an owner's
:class:`~._item.ItemRunner` first meets the strategy: nothing on the hot path calls back
into the host.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, final

from .._strategies._base import LLMCallStrategy
from .._values._config_warnings import warn_if_pool_too_small
from .._values._prompts import Prompt
from .._values._results import RetryState
from ._classify import Classification, ClassifierFunction, classify
from ._tokenizer import load_tokenizer, request_tokens, tokenizer_unloaded

if TYPE_CHECKING:
    from .._admission import QuotaScope
    from .._values._config import ProcessorConfig
    from ._breaker_gate import BreakerGate, Breakers

__all__ = ["Binding", "ExecuteText", "StrategyHost", "TokenEstimate", "UserClassifier", "resolve_binding"]

UserClassifier: TypeAlias = ClassifierFunction
TokenEstimate: TypeAlias = Callable[[Prompt, Mapping[str, object] | None], int]
"""A request's tokens from its prompt and params (the config's ``token_estimator`` as bound)."""
ExecuteText: TypeAlias = Callable[[str, int, float | None, RetryState | None], Awaitable[tuple[object, ...]]]
"""``LLMCallStrategy.execute``, bound."""


@final
class Binding:
    """One strategy as the item path uses it, resolved once per owner (``ItemRunner.bind``)."""

    __slots__ = ("breaker", "estimate", "estimator", "execute_text", "parses", "quota", "strategy",
                 "strategy_classifier", "user_classifier")

    def __init__(
        self,
        strategy: LLMCallStrategy[Any],
        quota: QuotaScope,
        *,
        estimate: TokenEstimate | None,
        user_classifier: UserClassifier | None,
        estimator: TokenEstimate | None = None,
    ) -> None:
        self.strategy = strategy
        """Prepared on the owner's host."""
        self.quota = quota
        self.estimate = estimate
        """The token estimator, when the config sets a TPM limit (``None``: reserve nothing)."""
        self.estimator = estimator
        """The config's token estimator, for a scope that learns a token budget (:meth:`tokens`)."""
        self.strategy_classifier = strategy.classify_error
        self.user_classifier = user_classifier
        self.parses = type(strategy).parse_output is not LLMCallStrategy.parse_output
        """Whether the strategy has a parse stage of its own (``parse_output`` overridden)."""
        self.breaker: BreakerGate | None = None
        """The circuit breaker of ``quota`` for this owner (``None``: off)."""
        takes_requests = (type(strategy).execute_request is not LLMCallStrategy.execute_request
                          or "execute_request" in getattr(strategy, "__dict__", ()))
        self.execute_text: ExecuteText | None = None if takes_requests else strategy.execute
        """``strategy.execute`` when ``execute_request`` is the default, which only passes the text
        on: the attempt calls it directly, one coroutine frame fewer per call in flight."""

    def tokens(self, prompt: Prompt, params: Mapping[str, object] | None = None) -> int:
        """The tokens a request of ``prompt`` with the item's ``params`` is admitted with (input
        estimate + output allowance): 0 unless a TPM limit is set or reported.

        A scope that learns limits asks for estimates once the provider reports a token budget.
        """
        if self.estimate is not None:
            return self.estimate(prompt, params)
        if self.estimator is not None and self.quota.needs_token_estimate:
            return self.estimator(prompt, params)
        return 0

    def classify(self, exc: Exception) -> Classification:
        by_user, by_strategy = self.user_classifier, self.strategy_classifier
        return classify(exc, strategy_classifier=by_strategy, user_classifier=by_user)


class StrategyHost(Protocol):
    """What resolving a Binding asks of its owner's host: the strategy prepared, and its quota scope."""

    async def ensure_prepared(self, strategy: LLMCallStrategy[Any]) -> None: ...

    def quota_scope(self, strategy: LLMCallStrategy[Any]) -> QuotaScope: ...


async def resolve_binding(
    strategy: LLMCallStrategy[Any], host: StrategyHost, config: ProcessorConfig,
    user_classifier: UserClassifier | None, breakers: Breakers,
) -> Binding:
    """The Binding of ``strategy`` for one owner: prepared on ``host`` (its tokenizer loaded when the
    config estimates tokens with it), its quota scope and that scope's breaker looked up."""
    await host.ensure_prepared(strategy)
    warn_if_pool_too_small(strategy, config.provider_concurrency)  # once per owner and strategy
    if tokenizer_unloaded(strategy, config.token_estimator):
        await load_tokenizer(strategy)
    tokens = request_tokens(strategy, config.token_estimator)
    binding = Binding(
        strategy,
        host.quota_scope(strategy),
        estimate=tokens if config.max_tokens_per_minute is not None else None,
        estimator=tokens,
        user_classifier=user_classifier,
    )
    binding.breaker = breakers.of(binding.quota)
    return binding
