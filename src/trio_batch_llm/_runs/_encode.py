"""What the repository stores of a terminal result, for the live and the provider-batch drivers alike.

Both drivers record results through one encoding, so a run's results read back
the same way whichever mode made them, and by the artifact stores' rule for
outputs (``_artifacts/_codec.py``): a checkpoint and a durable run keep the same
outputs, and refuse the same ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from .._artifacts._codec import OutputCodec, unstorable_failure
from .._artifacts._protocol import encode_result
from .._values._errors import ArtifactEncodeError
from .._values._results import WorkItemResult
from ._schema import NewResult

__all__ = ["encode_new_result"]

# The artifact stores' rule for outputs (open_run takes no codec, so a refusal names none).
_OUTPUTS: Final = OutputCodec(codec_option=False)


def encode_new_result(
    result: WorkItemResult[Any], location: str, *, replay: Callable[[Any], Any] | None = None
) -> NewResult:
    """What the repository stores of a terminal result.

    The output is kept by the artifact stores' rule (``_codec.py``): plain JSON,
    or a pydantic model that ``replay`` (the strategy's ``decode_output``, which
    :meth:`Run.read_results` applies) gives back as itself. Any other output (a
    tuple, a dataclass, a model without ``response_model=``, ``NaN``) would be
    read back changed: the item becomes a ``PARSE`` failure, stored instead,
    and the run goes on.
    """
    try:
        output = _OUTPUTS.encode(result.output, replay=replay)
        text = encode_result(result, lambda payload: payload, output=output).decode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        error = ArtifactEncodeError(
            f"{location}: the result of item {result.item_id!r} cannot be stored: {exc}"
        )
        error.__cause__ = exc
        result = unstorable_failure(result, error)
        text = encode_result(result, lambda payload: payload).decode("utf-8")
    usage = result.token_usage
    inp, out = usage.get("input_tokens", 0), usage.get("output_tokens", 0)
    return NewResult(
        item_id=result.item_id,
        success=result.success,
        error_category=result.error_category.value if result.error_category else None,
        result_json=text,
        input_tokens=inp,
        output_tokens=out,
        total_tokens=usage.get("total_tokens", inp + out),
    )
