"""The structured-output stage the provider strategies share: ``response_model=`` checked and applied.

A strategy built with ``response_model=`` (a pydantic model class or a JSON schema)
keeps a :class:`~.._values._structured.ResponseModel` as ``_response``; this base turns it
into the engine's parse stage (the answer validated into the model, a fenced
answer unwrapped and marked), the decoder a resume replays stored outputs through, the
schema the provider is sent, and the store's codec. The OpenAI, Anthropic and Gemini
strategies read the answer in their own dialect; from the text on, the stage is one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from .._values._categories import ErrorCategory
from .._values._errors import ProviderError
from .._values._structured import FENCE_METADATA_KEY, ResponseModel
from ._base import LLMCallStrategy

__all__ = ["StructuredOutputStrategy"]


class StructuredOutputStrategy(LLMCallStrategy[str]):
    """A text strategy whose ``parse_output``, ``decode_output``, ``response_schema`` and
    ``output_codec`` come from its ``_response``."""

    _response: ResponseModel | None = None

    @property
    def response_schema(self) -> dict[str, Any] | None:
        """The JSON schema sent with every request (pydantic's, every object closed), or ``None``."""
        return self._response.schema if self._response is not None else None

    # The returns say ``str``, the output type these strategies declare (``LLMCallStrategy[str]``): with
    # ``response_model=`` the output is the model (or the schema's JSON), which the protocol's one type
    # for raw and parsed outputs cannot say; the text is what they return without one.

    def parse_output(self, raw: object, metadata: dict[str, Any]) -> str:
        """With ``response_model=``: the answer validated into the model (a dict for a schema).

        A refusal is final (CONTENT_POLICY); an answer that does not validate is a
        :class:`StructuredOutputError` (PARSE, retried without backoff). An answer wrapped
        in a markdown code fence is unwrapped and ``metadata["fence_recovered"]`` is set.
        """
        response = self._response
        if response is None:
            return cast(str, raw)  # the text execute_request returned
        refusal = metadata.get("refusal")  # set by the dialects that report one (OpenAI, Anthropic)
        if refusal:
            raise ProviderError(f"the model refused: {refusal}", category=ErrorCategory.CONTENT_POLICY)
        output, fenced = response.parse(raw)
        if fenced:
            metadata[FENCE_METADATA_KEY] = True
        return output  # type: ignore[no-any-return]  # the model (see above)

    def decode_output(self, stored: object) -> str:
        if self._response is None:
            return cast(str, stored)
        return self._response.decode(stored)  # type: ignore[no-any-return]  # the model (see above)

    def output_codec(self) -> tuple[Callable[[Any], Any], Callable[[Any], Any]] | None:
        """``(encoder, decoder)`` for a store keeping this strategy's outputs; ``None`` for text."""
        response = self._response
        return None if response is None else (response.encode, response.decode)
