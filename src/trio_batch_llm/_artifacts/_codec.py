"""What a store keeps of an output, so that a replay gives back the original.

A replay must return the output the item produced, not a look-alike. JSON can
carry only a few Python types faithfully, so without help a store keeps an
output only when it is *plain JSON*, checked exactly (subclasses and look-alikes
do not count, because they would come back as their base type):

* ``str``, ``int``, ``bool``, ``None``, and ``float`` when finite;
* ``list`` of plain JSON; ``dict`` with ``str`` keys and plain-JSON values.

Anything else (a tuple, a set, a dict with int keys, a datetime, an enum, a
dataclass, a pydantic model, ``NaN``) is refused for that item before it is
published: :meth:`OutputCodec.encode` raises, the store raises
:class:`ArtifactEncodeError`, and the engine publishes (and stores) a ``PARSE``
failure that names the type, so a resume runs the item again.

A user who stores such outputs passes both halves of a codec to the store:
``output_encoder(output) -> plain JSON`` and ``output_decoder(json) -> output``.
The encoder's result is checked by the same rule; the decoder runs when the
store loads (before any work starts), so a decoder that fails is reported at
open. ``None`` (no output) is stored as ``null`` and never passed to either.

Structured output: a pydantic model instance (what a strategy's
``response_model=`` makes) is kept as ``model_dump(mode="json")`` without any
encoder given; on a resume the item's strategy turns it back into the model
(``LLMCallStrategy.decode_output``, applied by the resume plan), so the store
needs no decoder either. An explicit ``output_encoder`` still wins.

That holds only if the strategy does give the model back. So when the engine
appends, it passes the item's ``decode_output`` (``replay=``), and the stored
value is put through it once: an output it would not give back as the same
type (a model from a strategy without ``response_model=``, which would come
back as a ``dict``; a subclass of the response model, which would come back as
the base class) is refused like a tuple, naming both ways out. Plain text skips
this (every strategy's decoder gives text back as it is).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final, final

from .._values._categories import ErrorCategory
from .._values._errors import ConfigurationError
from .._values._models import is_pydantic_model_class, plain_json_of_model
from .._values._results import WorkItemResult

__all__ = ["JSONValue", "OutputCodec", "replay_problem", "unstorable_failure"]

JSONValue = None | bool | int | float | str | list[Any] | dict[str, Any]
"""A plain JSON value (the containers hold plain JSON values)."""

_SCALARS: Final = frozenset({str, int, bool, type(None)})
_HINT: Final = "pass output_encoder= and output_decoder= to the store to keep it"
"""The codec, one of the ways out named by every refusal."""
_NO_CODEC_HINT: Final = ("return plain JSON, or a pydantic model with its class as the strategy's "
                         "response_model=")
"""The way out where no codec can be given (a durable run's results)."""


def _type_name(kind: type) -> str:
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def plain_json_problem(value: object) -> str | None:
    """Why ``value`` would not come back from JSON as itself, or ``None`` if it would.

    Iterative, so a deeply nested output cannot exhaust the stack.
    """
    stack: list[tuple[object, str]] = [(value, "output")]
    while stack:
        current, where = stack.pop()
        kind = type(current)
        if kind in _SCALARS:
            continue
        if isinstance(current, float) and kind is float:
            if not math.isfinite(current):
                return f"{where} is {current!r}, a float that is not finite (JSON has no NaN or Infinity)"
        elif isinstance(current, list) and kind is list:
            stack.extend((item, f"{where}[{i}]") for i, item in enumerate(current))
        elif isinstance(current, dict) and kind is dict:
            for key, item in current.items():
                if type(key) is not str:
                    return (f"{where} has the key {key!r} ({_type_name(type(key))}); JSON object keys "
                            "are strings, so it would come back as a different dict")
                stack.append((item, f"{where}[{key!r}]"))
        else:
            return (f"{where} is of type {_type_name(kind)}, which JSON cannot carry faithfully "
                    "(it would come back changed)")
    return None


def replay_problem(
    output: object, stored: JSONValue, replay: Callable[[Any], Any], *, codec_option: bool = True
) -> str | None:
    """Why a resume, passing ``stored`` through ``replay``, would not give back an output of
    ``output``'s type, or ``None`` if it would. The codec is named as a way out only with
    ``codec_option`` (where the user can give one)."""
    try:
        back = replay(stored)
    except Exception as exc:  # noqa: BLE001 - the strategy's decoder: failing, it cannot replay the item
        got = f"fails to rebuild it ({exc!r})"
    else:
        if type(back) is type(output):
            return None
        got = f"gives back a {_type_name(type(back))}"
    kind = type(output)
    if is_pydantic_model_class(kind):
        what = f"output is a pydantic model ({_type_name(kind)}) and the item's strategy {got} from the " \
               "stored model_dump"
        fix = f"give the strategy response_model={kind.__qualname__}"
    else:
        what = f"output is of type {_type_name(kind)} and the item's strategy (its decode_output) {got}"
        fix = "make the strategy's decode_output give it back"
    return f"{what}, so a resume would return it changed; {fix}" + (f", or {_HINT}" if codec_option else "")


@final
class OutputCodec:
    """The stores' rule for outputs; see the module docstring."""

    __slots__ = ("_codec_option", "_decoder", "_encoder")

    def __init__(
        self,
        encoder: Callable[[Any], JSONValue] | None = None,
        decoder: Callable[[JSONValue], Any] | None = None,
        *,
        codec_option: bool = True,
    ) -> None:
        """``codec_option=False`` where the user cannot give a codec (``open_run``): refusals
        then name only the ways out that exist there (plain JSON, ``response_model=``)."""
        for name, fn in (("output_encoder", encoder), ("output_decoder", decoder)):
            if fn is not None and not callable(fn):
                raise ConfigurationError(name, fn, "must be a callable")
        if (encoder is None) != (decoder is None):
            given, missing = ("output_encoder", "output_decoder") if decoder is None else (
                "output_decoder", "output_encoder")
            raise ConfigurationError(
                given, encoder if decoder is None else decoder,
                f"needs {missing} as well: a replay must turn the stored JSON back into the output",
            )
        self._encoder = encoder
        self._decoder = decoder
        self._codec_option = codec_option

    def encode(self, output: Any, *, replay: Callable[[Any], Any] | None = None) -> JSONValue:
        """The plain JSON to store for ``output``; ValueError saying why it cannot be kept.

        ``replay`` is what a resume passes the stored value through (the item's
        strategy's ``decode_output``); without an encoder, an output it would not
        give back as the same type is refused. ``None`` (no strategy known: a
        direct ``append``) skips that check. Runs on the event loop, in
        ``append()``: the encoder should be quick.
        """
        if output is None:
            return None
        if self._encoder is None:
            if type(output) is str:  # the common case, without the walk
                return output
            is_model, dumped = plain_json_of_model(output)
            stored = dumped if is_model else output
            problem = plain_json_problem(stored)
            if problem is not None:
                raise ValueError(f"{problem}; {_HINT if self._codec_option else _NO_CODEC_HINT}")
            if replay is not None:
                problem = replay_problem(output, stored, replay, codec_option=self._codec_option)
                if problem is not None:
                    raise ValueError(problem)
            return stored  # type: ignore[no-any-return]
        try:
            encoded = self._encoder(output)
        except Exception as exc:  # the user's encoder: any failure is this item's alone
            raise ValueError(f"output_encoder raised {exc!r}") from exc
        if encoded is None:
            raise ValueError("output_encoder returned None, which a replay cannot tell from no output")
        problem = plain_json_problem(encoded)
        if problem is not None:
            raise ValueError(f"output_encoder returned a value that is not plain JSON: {problem}")
        return encoded

    def decode(self, stored: JSONValue) -> Any:
        """The output for a stored value (the decoder's exceptions propagate)."""
        if stored is None or self._decoder is None:
            return stored
        return self._decoder(stored)

    @property
    def decodes(self) -> bool:
        return self._decoder is not None


def unstorable_failure(result: WorkItemResult[Any], error: BaseException) -> WorkItemResult[Any]:
    """The failed result that replaces one whose output cannot be stored.

    ``PARSE``: the output did not take the form the run keeps, like a failed
    post-processor; a resume runs the item again. What the call cost, its
    timing, context and metadata are kept.
    """
    return WorkItemResult(
        item_id=result.item_id,
        success=False,
        output=None,
        error=str(error),
        exception=error,
        error_category=ErrorCategory.PARSE,
        attempts=result.attempts,
        token_usage=dict(result.token_usage),
        timing=result.timing,
        context=result.context,
        metadata=dict(result.metadata),
    )
