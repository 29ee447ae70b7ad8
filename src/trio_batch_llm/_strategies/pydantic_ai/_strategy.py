"""``PydanticAIStrategy``: a PydanticAI agent as a strategy, one ``agent.run(...)`` per attempt.

pydantic-ai is imported when a strategy is constructed, never by ``import trio_batch_llm``.
What the agent does inside one run (its tools, its own output retries) is one attempt to us;
retries of whole runs, deadlines, quotas and the cache are the engine's. The agent's errors
are not wrapped (CONTRACT C7.2): :meth:`PydanticAIStrategy.classify_error` files them
(``_errors``). Cancellation of the attempt's scope cancels the run and passes through.

Backends: pydantic-ai's agent loop runs on asyncio only. ``Agent.iter`` starts its
capability wrapper with ``asyncio.create_task`` (pydantic-ai issue #7112, open as of 2.78),
so under Trio a run fails with "no running event loop" before any model request. The
strategy says so instead, at input (:meth:`request_problem`: ``process_prompts`` raises
``ValueError`` before any work) and, should a call get that far, with a
``ProviderError`` that stops the batch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, cast, final

import sniffio

from ..._values._categories import ErrorCategory
from ..._values._errors import ConfigurationError, ProviderError
from ..._values._models import is_pydantic_model_class
from ..._values._prompts import LLMRequest, check_params
from ..._values._results import RetryState, TokenUsage
from .._base import LLMCallStrategy
from .._sdk_strategy import import_extra
from ._convert import REFUSED_PARAMS, history_problem, run_input, settings_of, token_usage
from ._errors import classify_agent_error, stops_batch_of

__all__ = ["PydanticAIStrategy"]

TRIO_REFUSAL: Final = (
    "PydanticAIStrategy cannot run under Trio: pydantic-ai's agent loop is asyncio-only (Agent.iter "
    "starts a task with asyncio.create_task; pydantic-ai issue #7112). Run this batch under asyncio "
    "(asyncio.run(...), or anyio.run(..., backend='asyncio'), or the CLI's --backend asyncio)"
)
_DYNAMIC: Final = "<dynamic>"


@final
class PydanticAIStrategy(LLMCallStrategy[Any]):
    """Runs ``agent.run(prompt, ...)`` for each attempt of an item (extra ``[pydantic-ai]``).

    ``model`` overrides the agent's model (a ``pydantic_ai.models.Model`` or a name such as
    ``"openai:gpt-4o-mini"``); one of the two must be set. ``deps``, ``usage_limits`` and
    ``model_settings`` go to every run; ``output_type`` overrides the agent's. ``params`` are
    default request parameters under each item's: ``temperature``, ``top_p``,
    ``max_output_tokens``, ``seed``, ``stop`` and ``extra_body`` become ``model_settings``
    (over ``model_settings=``), ``system`` becomes the run's extra ``instructions``; the
    others (``response_format``, ``tools``, ...) are the agent's to decide and are refused.

    Prompts: text, or chat messages of text (system, user, assistant; the last one a user
    message), which become ``message_history``. The output is the run's ``output``: a str,
    or the agent's structured ``output_type`` (a pydantic model is the
    :attr:`response_model`, so checkpoints and the response cache give the model back).

    Cache: the key is the model, the agent's static system prompts and instructions, the
    output schema, the model settings, the tool names and the request. An agent with
    dynamic system prompts or instructions (functions of ``deps``) is not cached unless
    ``cacheable=True``; pass ``cacheable=False`` for an agent whose answers depend on more
    than that (``deps``, what its tools read).

    Quotas: strategies calling the same provider model at the same address share one quota
    scope (so two strategies over one agent do). Give the model's client ``max_retries=0``
    where it has one: retries belong to the engine.
    """

    def __init__(
        self,
        agent: object,
        *,
        model: object = None,
        deps: object = None,
        output_type: object = None,
        usage_limits: object = None,
        model_settings: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
        cacheable: bool | None = None,
    ) -> None:
        import_extra("pydantic_ai", "PydanticAIStrategy needs pydantic-ai: "
                                    "pip install 'trio-batch-llm[pydantic-ai]'")
        from pydantic_ai.agent import AbstractAgent
        from pydantic_ai.models import Model
        from pydantic_ai.usage import UsageLimits

        if not isinstance(agent, AbstractAgent):
            raise ConfigurationError("agent", type(agent).__name__, "must be a pydantic_ai Agent")
        if model is not None and not isinstance(model, (str, Model)):
            raise ConfigurationError("model", type(model).__name__,
                                     "must be a pydantic_ai Model or a model name such as 'openai:gpt-4o'")
        if model is None and getattr(agent, "model", None) is None:
            raise ConfigurationError("model", None, "the agent has no model: pass model=")
        if usage_limits is not None and not isinstance(usage_limits, UsageLimits):
            raise ConfigurationError("usage_limits", type(usage_limits).__name__,
                                     "must be a pydantic_ai.usage.UsageLimits")
        if model_settings is not None and not isinstance(model_settings, Mapping):
            raise ConfigurationError("model_settings", type(model_settings).__name__, "must be a mapping")
        if cacheable is not None and not isinstance(cacheable, bool):
            raise ConfigurationError("cacheable", cacheable,
                                     "must be True, False or None (decided by the agent)")
        try:
            checked = check_params(params, "PydanticAIStrategy")
        except (TypeError, ValueError) as exc:
            raise ConfigurationError("params", params, str(exc)) from None
        for key in sorted(checked.keys() & REFUSED_PARAMS.keys()):
            raise ConfigurationError("params", params, f"{key!r}: {REFUSED_PARAMS[key]}")
        self.agent = agent
        self._model = model
        self._deps = deps
        self._output_type = output_type
        self._usage_limits = usage_limits
        self._model_settings = dict(model_settings or {})
        self._cacheable = cacheable
        self.params = checked
        parts = _agent_parts(agent)  # the agent's own prompts, for checkpoint identities and token estimates
        if parts is not None:
            static = [*parts["system_prompts"], *(t for t in parts["instructions"] if t != _DYNAMIC)]
            self.system_prompt = "\n\n".join(static) or None
        shape = output_type if output_type is not None else getattr(agent, "output_type", str)
        self._shape = shape
        self._schema = _schema_of(shape)  # once: every item's cache key reads it
        if is_pydantic_model_class(shape):
            self.response_model = cast(type, shape)  # a pydantic model class, just checked

    # -- what the strategy is ------------------------------------------------------------------

    @property
    def model(self) -> object | None:
        """The model the runs use: ``model=``, else the agent's."""
        return self._model if self._model is not None else getattr(self.agent, "model", None)

    @property
    def model_name(self) -> str | None:
        return _model_parts(self.model)[1]

    @property
    def provider_name(self) -> str | None:
        """The model's provider as pydantic-ai names it (``"openai"``, ``"anthropic"``, ``"test"``)."""
        return _model_parts(self.model)[0]

    @property
    def response_schema(self) -> dict[str, Any] | None:
        """The JSON schema of a structured ``output_type``; ``None`` for text or a shape without one."""
        return self._schema

    def quota_scope(self) -> object:
        """One scope per provider model and address: strategies over one agent (or one model) share it."""
        return ("pydantic-ai", *_model_parts(self.model))

    def decode_output(self, stored: object) -> object:
        """A stored output back to the ``output_type`` (a pydantic model, a dataclass, a list of them)."""
        if stored is None or self._shape is str or self._shape is None:
            return stored
        if self.response_model is not None:
            return super().decode_output(stored)
        try:
            from pydantic import TypeAdapter

            return TypeAdapter(cast("type[object]", self._shape)).validate_python(stored)
        except Exception:  # noqa: BLE001 - not a type pydantic can rebuild (an output function): as stored
            return stored

    # -- requests --------------------------------------------------------------------------------

    def request_problem(self, request: LLMRequest) -> str | None:
        """Refuses at input what an agent run cannot take, and every item under Trio (see the module)."""
        if _running_trio():
            return TRIO_REFUSAL
        for key in sorted(request.params.keys() & REFUSED_PARAMS.keys()):
            return f"params[{key!r}]: {REFUSED_PARAMS[key]}"
        return history_problem(request)

    def model_settings_for(self, request: LLMRequest) -> dict[str, Any]:
        """The ``model_settings`` of ``request``'s run: ``model_settings=``, then params (the
        strategy's, then the item's) over it."""
        return {**self._model_settings, **settings_of(self.params), **settings_of(request.params)}

    def cache_key_material(self, request: LLMRequest) -> dict[str, Any] | None:
        """What decides a run's answer (see the class docstring); ``None`` when it cannot be known."""
        provider, model, base_url = _model_parts(self.model)
        parts = _agent_parts(self.agent)
        if model is None or self._cacheable is False or (parts is None and not self._cacheable):
            return None
        if parts is not None and parts["dynamic"] and not self._cacheable:
            return None
        return {
            "provider": "pydantic-ai", "model_provider": provider, "model": model, "base_url": base_url,
            "agent": _jsonable(parts), "output_schema": self.response_schema,
            "output_type": _name(self._shape),
            "model_settings": _jsonable(self.model_settings_for(request)),
            "usage_limits": _jsonable(self._usage_limits),
            "system": request.params.get("system", self.params.get("system")),
            "prompt": request.prompt if isinstance(request.prompt, str) else list(request.prompt),
        }

    # -- calls --------------------------------------------------------------------------------------

    async def prepare(self) -> None:
        if _running_trio():
            raise _trio_refusal()
        await super().prepare()

    async def execute_request(
        self, request: LLMRequest, attempt: int, timeout: float | None, state: RetryState | None = None
    ) -> tuple[Any, TokenUsage | None, Any]:
        if _running_trio():
            raise _trio_refusal()
        user_prompt, history = run_input(request)
        options: dict[str, Any] = {}
        if history:
            options["message_history"] = history
        if self._model is not None:
            options["model"] = self._model
        if self._deps is not None:
            options["deps"] = self._deps
        if self._output_type is not None:
            options["output_type"] = self._output_type
        if self._usage_limits is not None:
            options["usage_limits"] = self._usage_limits
        settings = self.model_settings_for(request)
        if settings:
            options["model_settings"] = settings
        system = request.params.get("system", self.params.get("system"))
        if system:
            options["instructions"] = system
        try:
            result = await self.agent.run(user_prompt, **options)
        except Exception as exc:  # re-raised as itself (CONTRACT C7.2), marked when it ends the batch
            stops = stops_batch_of(exc)
            if stops is not None:
                exc.stops_batch = stops  # type: ignore[attr-defined]
            raise
        usage = _run_usage(result)
        metadata: dict[str, Any] = {"requests": int(getattr(usage, "requests", 0) or 0),
                                    "tool_calls": int(getattr(usage, "tool_calls", 0) or 0)}
        run_id = getattr(result, "run_id", None)
        if isinstance(run_id, str):
            metadata["run_id"] = run_id
        return result.output, token_usage(usage), metadata

    def classify_error(self, exception: Exception) -> tuple[ErrorCategory, float | None] | None:
        """pydantic-ai's errors by the table in ``_errors``; ``None`` leaves the rest to the default rules."""
        return classify_agent_error(exception)

    def __repr__(self) -> str:
        provider, model, _ = _model_parts(self.model)
        name = getattr(self.agent, "name", None)
        return f"PydanticAIStrategy(agent={name!r}, model={f'{provider}:{model}' if provider else model!r})"


def _schema_of(shape: Any) -> dict[str, Any] | None:
    """The JSON schema of an output type; ``None`` for text or an output spec that is not a type."""
    if shape is str or shape is None:
        return None
    try:
        from pydantic import TypeAdapter

        schema: dict[str, Any] = TypeAdapter(shape).json_schema()
    except Exception:  # noqa: BLE001 - an output spec that is not a type (ToolOutput, a function)
        return None
    return schema


def _running_trio() -> bool:
    try:
        return sniffio.current_async_library() == "trio"
    except sniffio.AsyncLibraryNotFoundError:  # outside an event loop (a file checked ahead): not known yet
        return False


def _trio_refusal() -> ProviderError:
    return ProviderError(TRIO_REFUSAL, category=ErrorCategory.INVALID_REQUEST, stops_batch=TRIO_REFUSAL)


def _run_usage(result: Any) -> Any:
    """The run's ``RunUsage``: a property in pydantic-ai 2.x, a method before (called only then)."""
    usage = result.usage
    return usage() if callable(usage) and not hasattr(usage, "input_tokens") else usage


def _model_parts(model: Any) -> tuple[str | None, str | None, str | None]:
    """``(provider, model name, base URL)`` of a pydantic-ai model or a ``"provider:name"`` string."""
    if model is None:
        return None, None, None
    if isinstance(model, str):
        provider, sep, rest = model.partition(":")
        return (provider, rest, None) if sep else (None, model, None)
    name = getattr(model, "model_name", None)
    system = getattr(model, "system", None)
    base_url = getattr(model, "base_url", None)
    return (system if isinstance(system, str) else None, name if isinstance(name, str) else None,
            base_url if isinstance(base_url, str) else None)


def _agent_parts(agent: Any) -> dict[str, Any] | None:
    """The parts of ``agent`` that decide its answers and are known before a run, read from its
    attributes (pydantic-ai has no public accessor for them); ``None`` when they cannot be read,
    so the answers are not cached on a guess. ``dynamic``: some are functions of the run."""
    prompts = getattr(agent, "_system_prompts", None)
    instructions = getattr(agent, "_instructions", None)
    toolset = getattr(agent, "_function_toolset", None)
    tools = getattr(toolset, "tools", None)
    if not isinstance(prompts, tuple | list) or not isinstance(instructions, list) or \
            not isinstance(tools, Mapping):
        return None
    texts = []
    dynamic = bool(getattr(agent, "_system_prompt_functions", None)) or callable(
        getattr(agent, "model_settings", None))
    for entry in instructions:
        value = getattr(entry, "instruction", entry)
        if callable(value):
            dynamic = True
            texts.append(_DYNAMIC)
        else:
            texts.append(str(value))
    return {
        "system_prompts": [str(p) for p in prompts], "instructions": texts, "tools": sorted(tools),
        "toolsets": sorted(type(t).__name__ for t in getattr(agent, "_user_toolsets", ()) or ()),
        "model_settings": _jsonable(getattr(agent, "model_settings", None)),
        "dynamic": dynamic,
    }


def _name(shape: Any) -> str:
    return getattr(shape, "__qualname__", None) or repr(shape)


def _jsonable(value: Any) -> Any:
    """``value`` as plain JSON data (``repr`` for what JSON cannot hold), for a stable key."""
    if value is None:
        return None
    return json.loads(json.dumps(value, sort_keys=True, default=_fallback))


def _fallback(value: Any) -> Any:
    fields = getattr(value, "__dataclass_fields__", None)
    if fields is not None:
        return {name: getattr(value, name) for name in fields}
    return repr(value)
