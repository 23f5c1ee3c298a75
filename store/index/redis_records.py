"""How the Redis index lays out a record: key names and the record's hash (used by :mod:`store.index.redis`
and, for the texts beside it, :mod:`store.redis_texts`).

Keys, under a configurable ``prefix`` (default ``"kvlink:"``); ``q()`` percent-encodes an id so that
``:`` inside ids cannot collide:

- ``{p}doc:{q(tenant)}:{q(doc_id)}``            hash of the record's fields (metadata as JSON) and their
  checksum (:func:`store.integrity.fields_sum`; a corrupt hash reads as a failed :class:`CorruptDocumentRecord`)
- ``{p}docs:{q(tenant)}``                       sorted set of doc_ids, all score 0 (lexical order)
- ``{p}band:{q(tenant)}:{band}:{value:04x}``    set of doc_ids
- ``{p}hash:{q(tenant)}:{content_hash}``        set of doc_ids
- ``{p}ckey:{cache_key}``                       set of ``"{q(tenant)}:{q(doc_id)}"``
- ``{p}tenants``                                set of tenants
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from store.index.document_index import DocumentRecord
from store.integrity import SUM_FIELD, fields_sum

DEFAULT_PREFIX = "kvlink:"
_INT_FIELDS = ("simhash", "num_tokens", "nbytes", "version", "hits")
_FLOAT_FIELDS = ("created", "updated")


def q(part: str) -> str:
    """Percent-encode an id for use inside a key (no ``:`` survives)."""
    return quote(part, safe="")


def glob_escape(text: str) -> str:
    """``text`` with the glob characters of ``SCAN MATCH`` escaped."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def encode_record(rec: DocumentRecord) -> dict[str, str]:
    """The hash of a record: every field as a string (metadata as JSON) and their checksum."""
    d = rec.to_dict()
    d["metadata"] = json.dumps(d["metadata"])
    out = {k: str(v) for k, v in d.items()}
    out[SUM_FIELD] = fields_sum(out)
    return out


def decode_record(h: dict[str, str]) -> DocumentRecord:
    """The record of a hash; raises ValueError when its checksum (if any) or a field is wrong."""
    if SUM_FIELD in h and fields_sum(h) != h[SUM_FIELD]:
        raise ValueError("checksum mismatch")
    d: dict[str, Any] = {k: v for k, v in h.items() if k != SUM_FIELD}
    for k in _INT_FIELDS:
        d[k] = int(d[k])
    for k in _FLOAT_FIELDS:
        d[k] = float(d[k])
    d["metadata"] = json.loads(d.get("metadata") or "{}")
    return DocumentRecord.from_dict(d)
