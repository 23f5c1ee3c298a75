"""Text and JSON values every later step can encode: UTF-8 (the tokenizer, the stores, every HTTP client)
and strict JSON (the response encoder refuses NaN and infinities, and values nested too deep).

A Python ``str`` may hold lone surrogates (U+D800-U+DFFF, e.g. from the JSON escape ``"\\ud800"``, which
Python's ``json`` decodes without complaint); no UTF-8 encoder, tokenizer or JSON response accepts them.
:func:`find_unencodable` names the first such value in a nested structure (the API refuses it at the door),
:func:`sanitised` replaces them (what a listing shows of a record stored before the door refused them, and
what ``store check --repair`` writes back). :func:`normalize_text` is the one normal form of a text: what is
tokenised and what a cache key's content hash covers (the prompt framing and the store's keys both use it).
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Any

REPLACEMENT = "\ufffd"
MAX_DEPTH = 32  # lists and dicts nested deeper than this are refused (pydantic's serializer and json recurse)
_SURROGATE = re.compile("[\ud800-\udfff]")


def normalize_text(text: str) -> str:
    """NFC-normalise, turn CRLF/CR into LF, strip the ends.

    Only changes that keep the meaning: the normalised text is exactly what is tokenised and what the
    content hash covers, so equal hashes mean equal token ids.
    """
    return unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n").strip()


def text_problem(text: str) -> str | None:
    """None when ``text`` encodes as UTF-8; else what is wrong (the first lone surrogate and where)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"lone surrogate U+{ord(text[e.start]):04X} at character {e.start} (not valid Unicode text)"
    return None


def find_unencodable(value: Any, path: str = "value", depth: int = 0) -> tuple[str, str] | None:
    """``(where, problem)`` of the first string (dict keys too) that is not UTF-8, float that is not finite,
    or list or dict nested deeper than :data:`MAX_DEPTH` in ``value`` (dicts, lists, tuples and scalars;
    other objects, pydantic models among them, are not looked into), or None.

    Args:
        path: the name of ``value`` in ``where`` (``metadata`` gives ``metadata.k``, ``metadata.k.0``: pydantic's
            location style).
        depth: how deep ``value`` itself sits (0: the outermost value).
    """
    if isinstance(value, str):
        problem = text_problem(value)
        return (path, problem) if problem else None
    if isinstance(value, float) and not math.isfinite(value):
        return path, f"{value} is not a JSON number (NaN and infinities are not allowed)"
    if isinstance(value, (dict, list, tuple)) and depth >= MAX_DEPTH:
        return path, f"nested deeper than {MAX_DEPTH} levels (JSON encoders refuse deeper values)"
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and (problem := text_problem(k)):
                return path, f"key {ascii(k)}: {problem}"
            found = find_unencodable(v, f"{path}.{k}", depth + 1)
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = find_unencodable(v, f"{path}.{i}", depth + 1)
            if found:
                return found
    return None


def sanitised(value: Any, depth: int = 0) -> Any:
    """A copy of ``value`` that :func:`find_unencodable` accepts: lone surrogates become U+FFFD, NaN and
    infinities None, and so do lists and dicts nested :data:`MAX_DEPTH` deep (nested dicts, lists and
    tuples too; other values as they are)."""
    if isinstance(value, str):
        return _SURROGATE.sub(REPLACEMENT, value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (dict, list, tuple)) and depth >= MAX_DEPTH:
        return None
    if isinstance(value, dict):
        return {sanitised(k): sanitised(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [sanitised(v, depth + 1) for v in value]
    return value
