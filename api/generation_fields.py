"""Request fields that shape generation beyond sampling, shared by ``/v1/query``, chat and completions:
``stop`` (OpenAI), ``ignore_eos`` and ``min_tokens`` (vLLM's extras), and the rule for OpenAI fields the
service does not implement (refused with a message naming the field, never dropped silently)."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from pydantic import Field, WithJsonSchema, field_validator, model_validator

from api.request_body import RequestBody
from service.text_rules import MAX_STOP_CHARS, MAX_STOP_STRINGS, normalize_stop

log = logging.getLogger(__name__)

STOP_SCHEMA = {"anyOf": [{"type": "string", "maxLength": MAX_STOP_CHARS},
                         {"type": "array", "maxItems": MAX_STOP_STRINGS,
                          "items": {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS}},
                         {"type": "null"}]}
MinTokens = Annotated[int, Field(ge=0, le=1 << 20, description="vLLM's: end-of-turn tokens cannot end the answer "
                                 "before this many tokens (at most max_tokens).")]


class GenerationFields(RequestBody):
    """``stop``, ``ignore_eos``, ``min_tokens`` (on :class:`~api.request_body.RequestBody`: strict types,
    encodable text); :meth:`generation` gives them as sampling keywords."""

    stop: Annotated[str | list[str] | None, WithJsonSchema(STOP_SCHEMA)] = Field(None, description=f"Stop string(s) (at most {MAX_STOP_STRINGS}, "
                                         f"{MAX_STOP_CHARS} characters each): the answer ends before the first "
                                         "one, which is not included (finish_reason 'stop').")
    ignore_eos: bool = Field(False, description="vLLM's: do not stop at end-of-turn tokens (exactly max_tokens "
                             "tokens unless a stop string ends the answer).")
    min_tokens: MinTokens | None = None

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, v: Any) -> tuple[str, ...]:
        return normalize_stop(v)

    def generation(self) -> dict:
        """``{stop, ignore_eos, min_tokens}`` for ``QueryService.plan`` (None where not given)."""
        return {"stop": self.stop or None, "ignore_eos": self.ignore_eos or None, "min_tokens": self.min_tokens}


# OpenAI fields without an implementation, and the values that mean "not used" (those pass).
UNSUPPORTED = {
    "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []), "function_call": (None, "none"),
    "logit_bias": (None, {}), "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
    "audio": (None,), "modalities": (None, ["text"]), "prediction": (None,), "web_search_options": (None,),
    "best_of": (None, 1), "echo": (None, False), "suffix": (None, ""), "repetition_penalty": (None, 1, 1.0),
    "guided_regex": (None,), "guided_choice": (None,), "guided_grammar": (None,),
    "structured_outputs": (None,), "use_beam_search": (None, False), "n": (None, 1),
}
IGNORED = ("user", "metadata", "store", "service_tier", "parallel_tool_calls", "stream_options", "reasoning_effort",
           "verbosity", "prompt_cache_key", "safety_identifier")


def refuse_unsupported(data: Any, known: set[str]) -> Any:
    """``data`` (a request body) unchanged, once no field in :data:`UNSUPPORTED` has a value that means using
    it; other unknown fields are ignored with a warning (vLLM's rule), except the harmless :data:`IGNORED`.

    Raises:
        ValueError: naming the unsupported field (a 422 ``invalid_request``).
    """
    if not isinstance(data, dict):
        return data
    for name, unused in UNSUPPORTED.items():
        if name in data and name not in known and not _unused(data[name], unused):
            raise ValueError(f"{name} is not supported by this server (given {str(data[name])[:80]!r}); "
                             f"remove it or leave it at its default")
    extra = sorted(k for k in data if k not in known and k not in UNSUPPORTED and k not in IGNORED)
    if extra:
        log.warning("ignoring unknown request fields: %s", ", ".join(extra))
    return data


def _unused(value: Any, unused: tuple) -> bool:
    """Whether ``value`` is one of ``unused`` (same type too: ``True`` is not ``1``)."""
    return value is None or any(type(value) is type(u) and value == u for u in unused)


class OpenAIFields(GenerationFields):
    """:class:`GenerationFields` plus the unsupported-field rule (:func:`refuse_unsupported`)."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        known = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}
        return refuse_unsupported(data, known)
