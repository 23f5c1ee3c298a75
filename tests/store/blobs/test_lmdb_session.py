"""Layer fills sharing one read transaction (``layer_session``): the same bytes as one transaction each, and a
layer found corrupt inside is deleted and reported once the transaction has closed."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from factories import random_kv
from store.blobs.lmdb import LmdbBlobStore
from store.blobs.lmdb_records import BLOBS_DB
from store.records.errors import CorruptRecordError
from store.records.verified import VERIFIED


def _fill_all(store: LmdbBlobStore, keys: list[str], session: bool) -> torch.Tensor:
    """Every layer of every key into one ``[L, H, sum T, D]`` keys buffer, a layer of all keys at a time."""
    metas = [store.meta(k) for k in keys]
    L, H, _, D = metas[0]["shape"]
    bounds = [0]
    for m in metas:
        bounds.append(bounds[-1] + m["shape"][2])
    k_out, v_out = torch.zeros(L, H, bounds[-1], D), torch.zeros(L, H, bounds[-1], D)
    fills = [iter(store.iter_stored_layers(k)[1]) for k in keys]
    for i in range(L):
        with store.layer_session() if session else nullcontext():
            for j, f in enumerate(fills):
                next(f)(k_out[i, :, bounds[j]:bounds[j + 1]], v_out[i, :, bounds[j]:bounds[j + 1]])
    return k_out


def test_a_shared_read_fills_the_same_bytes(tmp_path):
    store = LmdbBlobStore(tmp_path / "s")
    for i in range(3):
        store.put(f"d{i}", random_kv(layers=2, tokens=5 + i, seed=i))
    keys = ["d0", "d1", "d2"]
    assert torch.equal(_fill_all(store, keys, session=True), _fill_all(store, keys, session=False))


def test_a_corrupt_layer_in_a_session_is_deleted_once_it_closes(tmp_path):
    reported = []
    store = LmdbBlobStore(tmp_path / "s", on_corrupt=reported.append)
    store.put("good", random_kv(layers=2, tokens=4, seed=1))
    store.put("bad", random_kv(layers=2, tokens=4, seed=2))
    with store.env.env.begin(write=True, db=store.env.db(BLOBS_DB)) as txn:
        raw = bytearray(txn.get(b"bad/L0"))
        raw[-1] ^= 0x01
        txn.put(b"bad/L0", bytes(raw))
    VERIFIED.clear()
    with pytest.raises(CorruptRecordError):
        _fill_all(store, ["good", "bad"], session=True)
    assert reported == ["bad"] and not store.contains("bad") and store.contains("good")
