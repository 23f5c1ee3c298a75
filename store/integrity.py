"""Checksums of the small stored entries: document texts and index records (KV caches have their own, see
:mod:`store.records.codec`).

A sealed LMDB value is ``b"#" + xxh3_64 hex (16) + b"\\n" + payload``. Values written before checksums
existed start with ``{`` (bare JSON) and are still read, unverified. A Redis record hash carries the
checksum of its other fields in the field :data:`SUM_FIELD`.
"""

from __future__ import annotations

import json

import xxhash

from store.records.errors import CorruptRecordError

SUM_FIELD = "_sum"
_MARK = b"#"
_DIGITS = 16


class CorruptEntry(CorruptRecordError):
    """A stored text or index record failed its checksum or could not be parsed; re-ingest the document.

    Attributes:
        what: the entry (e.g. ``"stored text of document 'd1'"``).
        reason: short cause (e.g. ``"checksum mismatch"``).
    """

    def __init__(self, what: str, reason: str):
        super().__init__(f"{what} is corrupt ({reason}); re-ingest the document")
        self.what, self.reason = what, reason


def seal(payload: bytes) -> bytes:
    """``payload`` prefixed with its checksum (see the module docstring)."""
    return _MARK + xxhash.xxh3_64_hexdigest(payload).encode() + b"\n" + payload


def unseal(raw: bytes, what: str) -> bytes:
    """The payload of a :func:`seal` ed value (or of a legacy bare-JSON value).

    Args:
        raw: the stored bytes.
        what: names the entry in the error message (e.g. ``"text of acme/doc-1"``).
    Raises:
        CorruptEntry: the checksum does not match, or the value has neither layout.
    """
    raw = bytes(raw)
    if raw.startswith(b"{"):
        return raw  # written before checksums; verified by parsing only
    head, payload = raw[: 2 + _DIGITS], raw[2 + _DIGITS :]
    if len(head) != 2 + _DIGITS or head[:1] != _MARK or head[-1:] != b"\n":
        raise CorruptEntry(what, "unknown layout")
    if xxhash.xxh3_64_hexdigest(payload).encode() != head[1:-1]:
        raise CorruptEntry(what, "checksum mismatch")
    return payload


def load_json(raw: bytes, what: str) -> dict:
    """``json.loads`` of :func:`unseal` ``(raw)``; a dict.

    Raises:
        CorruptEntry: checksum mismatch, or not a JSON object.
    """
    payload = unseal(raw, what)
    try:
        value = json.loads(payload)
    except (UnicodeDecodeError, ValueError) as e:
        raise CorruptEntry(what, f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise CorruptEntry(what, "not a JSON object")
    return value


def fields_sum(fields: dict[str, str], volatile: tuple[str, ...] = ("hits",)) -> str:
    """Checksum of a Redis hash's string fields, independent of their order; :data:`SUM_FIELD` and the
    ``volatile`` fields (counters incremented in place, such as ``hits``) are left out."""
    items = sorted((k, v) for k, v in fields.items() if k != SUM_FIELD and k not in volatile)
    return xxhash.xxh3_64_hexdigest(json.dumps(items, ensure_ascii=False).encode())
