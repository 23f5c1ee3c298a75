"""The error a stored record raises when it fails its checksum or cannot be parsed (shared by the codec's
layouts; re-exported as ``store.records.codec.CorruptRecordError``)."""

from __future__ import annotations


class CorruptRecordError(LookupError):
    """A stored record failed its checksum or could not be parsed."""
