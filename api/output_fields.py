"""Request fields that shape what a generated token carries or may be: OpenAI's ``logprobs`` /
``top_logprobs`` (chat) and ``logprobs`` (legacy completions), ``response_format`` (``json_object`` or
``json_schema``: grammar-constrained decoding, :mod:`kvlink_rag.decoding.grammar`) and vLLM's ``guided_json`` (the same
path as a ``json_schema``), added to a plan's sampling by :func:`service.structured.add_outputs`."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from api.request_body import RequestBody
from service.errors import ServiceError

TopLogprobs = Annotated[int, Field(ge=0, le=20, description="Most likely alternatives per token (0..20), "
                                   "with logprobs true. Log-probabilities are the raw model's log-softmax "
                                   "(vLLM's default), before temperature, top_p or a grammar mask.")]
CompletionLogprobs = Annotated[int, Field(ge=0, le=5, description="Legacy completions: return each token's "
                                          "log-probability and this many most likely alternatives (0..5); raw "
                                          "model log-softmax (vLLM's default).")]


class StructuredFields(RequestBody):
    """``response_format`` and vLLM's ``guided_json``; :meth:`response_spec` gives the one asked for."""

    response_format: dict[str, Any] | None = Field(None, description="{'type': 'text'}, {'type': 'json_object'} "
                                                   "or {'type': 'json_schema', 'json_schema': {'name', 'schema', "
                                                   "'strict'}}: the answer is constrained to JSON (valid for the "
                                                   "schema) by grammar-constrained decoding.")
    guided_json: dict[str, Any] | str | None = Field(None, description="vLLM's: a JSON schema (object or its "
                                                     "JSON text) the answer follows, as response_format json_schema.")

    def response_spec(self) -> dict | None:
        """The ``response_format`` asked for (``guided_json`` as a ``json_schema`` one), None for plain text.

        Raises:
            ServiceError: 400 ``invalid_response_format`` when both are given.
        """
        fmt = self.response_format
        if fmt is not None and fmt.get("type") == "text" and len(fmt) == 1:
            fmt = None
        if self.guided_json is not None:
            if fmt is not None:
                raise ServiceError(400, "invalid_response_format", "give response_format or guided_json, not both")
            return {"type": "json_schema", "json_schema": {"schema": self.guided_json}}
        return fmt


class ChatOutputFields(StructuredFields):
    """Chat's ``logprobs`` (bool) and ``top_logprobs`` (0..20), plus :class:`StructuredFields`."""

    logprobs: bool | None = Field(None, description="Return each generated token's log-probability "
                                  "(choices[].logprobs.content).")
    top_logprobs: TopLogprobs | None = None

    @model_validator(mode="after")
    def _top_needs_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def logprobs_asked(self) -> int | None:
        """Alternatives per token when log-probabilities are asked for, else None."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionOutputFields(StructuredFields):
    """Legacy completions' ``logprobs`` (int 0..5), plus :class:`StructuredFields`."""

    logprobs: CompletionLogprobs | None = None

    def logprobs_asked(self) -> int | None:
        return self.logprobs
