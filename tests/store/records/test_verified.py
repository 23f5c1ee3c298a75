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


def _staged(store: LmdbBlobStore, key: str, dtype: torch.dtype = torch.float32) -> list[bytes]:
    """Every layer of ``key`` staged as the query path stages it (inside a read session): the keys' and values'
    bytes of each layer, or None for a layer that must be decoded."""
    L, H, T, D = store.meta(key)["shape"]
    _, fills = store.iter_stored_layers(key)
    staged = []
    for f in fills:
        k_parts, v_parts = [], []
        with store.layer_session():
            ok = f.stage(dtype, (H, T, D), 0, k_parts, v_parts)
            staged.append(bytes(k_parts[0].raw) + bytes(v_parts[0].raw) if ok else None)
    return staged


def test_a_staged_layer_read_again_is_neither_hashed_nor_parsed(tmp_path, hashed, monkeypatch):
    from store.records import stored_order

    parsed = []
    monkeypatch.setattr(stored_order, "header_of", lambda buf: parsed.append(1) or layer_decode.header_of(buf))
    store = LmdbBlobStore(tmp_path / "s")
    kv = random_kv(layers=3, tokens=5)
    store.put("doc", kv)
    first = _staged(store, "doc")
    assert len(hashed) == 3 and len(parsed) == 3
    want = [torch.cat([kv.keys[i].contiguous().view(torch.uint8).flatten(),
                       kv.values[i].contiguous().view(torch.uint8).flatten()]).numpy().tobytes() for i in range(3)]
    assert first == want
    assert _staged(store, "doc") == want and len(hashed) == 3 and len(parsed) == 3  # the places' plans served
    assert _staged(store, "doc", torch.bfloat16) == [None] * 3  # another dtype: decoded, not staged
    store.put("doc", random_kv(layers=3, tokens=5, seed=9))  # other bytes: hashed and parsed anew
    assert _staged(store, "doc") != want and len(hashed) == 6 and len(parsed) == 6
