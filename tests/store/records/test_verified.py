"""Layers verified once per place in LMDB's memory map: a second read of the same bytes is not hashed again, a
record written again (other pages, other bytes) is, and a corrupted rewrite is still caught."""

from __future__ import annotations

import pytest
import torch

from factories import random_kv
from store.blobs.lmdb_records import BLOBS_DB
from store.blobs.lmdb import LmdbBlobStore
from store.records import codec, layer_decode
from store.records.errors import CorruptRecordError
from store.records.verified import VERIFIED, VerifiedLayers


@pytest.fixture
def hashed(monkeypatch):
    """The number of layer checksums computed by the decoder."""
    calls = []

    def counting(buf, version):
        calls.append(1)
        return codec.checksum(buf, version)

    monkeypatch.setattr(layer_decode, "checksum", counting)
    VERIFIED.clear()
    return calls


def _stream(store: LmdbBlobStore, key: str) -> torch.Tensor:
    _, L, H, T, D = (None, *store.meta(key)["shape"])
    k, v = torch.empty(H, T, D), torch.empty(H, T, D)
    _, fills = store.iter_stored_layers(key)
    for f in fills:
        f(k, v)
    return k


def test_a_second_read_of_the_same_bytes_is_not_hashed(tmp_path, hashed):
    store = LmdbBlobStore(tmp_path / "s")
    kv = random_kv(layers=3, tokens=5)
    store.put("doc", kv)
    first = _stream(store, "doc")
    assert len(hashed) == 3
    again = _stream(store, "doc")
    assert len(hashed) == 3 and torch.equal(first, again)


def test_a_rewritten_record_is_hashed_again_and_corruption_still_caught(tmp_path, hashed):
    store = LmdbBlobStore(tmp_path / "s")
    store.put("doc", random_kv(layers=2, tokens=4))
    _stream(store, "doc")
    store.put("doc", random_kv(layers=2, tokens=4, seed=7))  # new bytes, new checksums: hashed on the next read
    _stream(store, "doc")
    assert len(hashed) == 4
    with store.env.env.begin(write=True, db=store.env.db(BLOBS_DB)) as txn:  # the meta still expects the old bytes
        raw = bytearray(txn.get(b"doc/L1"))
        raw[-1] ^= 0x01
        txn.put(b"doc/L1", bytes(raw))
    with pytest.raises(CorruptRecordError):
        _stream(store, "doc")


def test_the_set_is_bounded():
    seen = VerifiedLayers(limit=2)
    for i in range(3):
        seen.add(("k", i, "c", 0, 1))
    assert ("k", 2, "c", 0, 1) in seen and ("k", 0, "c", 0, 1) not in seen and None not in seen
