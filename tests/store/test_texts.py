"""Stored texts: checksummed, with title and metadata; a flipped byte is reported, never served."""

from __future__ import annotations

import json

import pytest

from store.integrity import CorruptEntry
from store.texts import TextStore


def _flip(texts: TextStore, tenant: str, doc_id: str, old: bytes, new: bytes) -> None:
    key = f"{tenant}\0{doc_id}".encode()

    def write(txn):
        raw = bytes(txn.get(key, db=texts._db))
        assert old in raw
        txn.put(key, raw.replace(old, new), db=texts._db)

    texts.env.write(write)


def test_a_flipped_byte_raises_a_clear_error_and_is_counted(lmdb_env):
    texts = TextStore(lmdb_env)
    texts.put("t", "code", 3, "The door code is KIWI42.", "Codes", {"src": "memo"})
    texts.put("t", "other", 1, "Another text.")
    assert texts.get("t", "code") == {"version": 3, "text": "The door code is KIWI42.", "title": "Codes",
                                      "metadata": {"src": "memo"}}
    _flip(texts, "t", "code", b"KIWI42", b"KIWI92")
    with pytest.raises(CorruptEntry, match=r"stored text of document 'code' is corrupt \(checksum mismatch\); "
                                           "re-ingest the document"):
        texts.get("t", "code")
    assert texts.corrupt_reads == 1 and texts.get("t", "other")["text"] == "Another text."
    rows = list(texts.items())
    assert [(t, d) for t, d, _ in rows] == [("t", "code"), ("t", "other")]
    assert isinstance(rows[0][2], CorruptEntry) and rows[1][2]["version"] == 1
    texts.put("t", "code", 4, "The door code is KIWI42.")  # re-ingesting repairs it
    assert texts.get("t", "code")["text"] == "The door code is KIWI42."


def test_texts_written_before_checksums_are_still_read_and_items_pages(lmdb_env):
    texts = TextStore(lmdb_env)
    assert texts.empty()
    legacy = json.dumps({"version": 2, "text": "old", "title": "T"}).encode()
    lmdb_env.write(lambda txn: txn.put(b"t\0legacy", legacy, db=texts._db))
    assert texts.get("t", "legacy") == {"version": 2, "text": "old", "title": "T", "metadata": {}}
    for i in range(600):  # more than one page of items()
        texts.put("u", f"d{i:04d}", 1, f"text {i}")
    assert len(list(texts.items())) == 601 and not texts.empty()
