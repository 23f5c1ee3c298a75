"""The base of every request body: strict types, and text and numbers every later step can encode.

Strict as OpenAI's API: ``"stream": "yes"`` or ``"top_k": "3"`` is a 422 naming the field (a JSON integer
still counts as a number). Every string in the JSON object, nested ones and dict keys too, must be valid
Unicode, every number finite and nothing nested deeper than :data:`kvlink_rag.encodable.MAX_DEPTH`
(:func:`kvlink_rag.encodable.find_unencodable`); the error's type is :data:`INVALID_UNICODE` and its
context names where (``api.errors`` puts that into the message).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

from service.text_rules import find_unencodable

INVALID_UNICODE = "invalid_unicode"  # the pydantic error type of a value no encoder accepts


class RequestBody(BaseModel):
    """Base of every request body: strict types, unknown fields refused (a subclass may allow them), and
    every string in the JSON object (values of known and extra fields, nested lists and dicts, their keys)
    UTF-8 encodable and every number finite (:func:`kvlink_rag.encodable.find_unencodable`), checked
    before the fields so the message says what is wrong and where."""

    model_config = ConfigDict(strict=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _encodable(cls, data: Any) -> Any:
        if isinstance(data, dict):  # the JSON object as parsed, before any field is validated
            for name, value in data.items():
                found = find_unencodable(value, str(name))
                if found:
                    raise PydanticCustomError(INVALID_UNICODE, "{where}: {problem}",
                                              {"where": found[0], "problem": found[1]})
        return data
