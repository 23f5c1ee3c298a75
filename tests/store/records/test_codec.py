"""Meta records: parsed once per distinct bytes, bad ones refused every time."""

import json

import pytest

from store.records.codec import parse_meta
from store.records.errors import CorruptRecordError


def _meta(**extra) -> bytes:
    return json.dumps({"shape": [2, 1, 3, 4], "checksum": {"layers": ["a", "b"]}, **extra}).encode()


def test_the_same_bytes_parse_to_the_same_meta_from_bytes_or_a_memoryview():
    raw = _meta(fingerprint="f")
    assert parse_meta(raw) == {"shape": [2, 1, 3, 4], "checksum": {"layers": ["a", "b"]}, "fingerprint": "f"}
    assert parse_meta(memoryview(raw)) is parse_meta(raw)  # one parse for every reader of these bytes


def test_a_bad_meta_is_refused_every_time():
    for raw in (b"{not json", _meta(shape=[3, 1, 3, 4]), _meta(token_order=[0, 1])):
        for _ in range(2):
            with pytest.raises(CorruptRecordError):
                parse_meta(raw)
