"""Layers decoded in their stored token order straight into a caller's buffer (the query path's load): every
record format, a slice of a joined buffer as the output, and the checks (checksum, replaced record)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from factories import corrupt_layer
from store.blobs.lmdb import LmdbBlobStore
from store.records.errors import CorruptRecordError


@pytest.fixture
def blobs(lmdb_env, clock):
    store = LmdbBlobStore(lmdb_env, clock=clock)
    yield store
    store.close()


def _doc(make_kv, scored: bool, dtype: torch.dtype, seed: int = 0, tokens: int = 37):
    kv = make_kv(tokens=tokens, dtype=dtype, seed=seed)
    if not scored:
        return kv
    return dataclasses.replace(kv, importance=torch.rand(tokens, generator=torch.Generator().manual_seed(seed + 9)))


@pytest.mark.parametrize("scored", [False, True])
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stored_layers_fill_a_slice_in_stored_order(blobs, make_kv, scored, int8, dtype):
    blobs.put("d", _doc(make_kv, scored, dtype), int8=int8)
    ref = blobs.get("d")  # position order, dequantised as the store serves it
    order, fills = blobs.iter_stored_layers("d")
    assert (order is not None) == scored
    if scored:
        assert order.tolist() == blobs.meta("d")["token_order"]
    pos = torch.arange(ref.num_tokens) if order is None else order
    L, H, T, D = ref.keys.shape
    for i, fill in enumerate(fills):
        k = torch.full((H, T + 5, D), 7.0, dtype=ref.dtype)  # a joined buffer: this document at [:, 3:3+T]
        v = torch.full_like(k, 7.0)
        fill(k[:, 3:3 + T], v[:, 3:3 + T])
        assert torch.equal(k[:, 3:3 + T], ref.keys[i][:, pos]) and torch.equal(v[:, 3:3 + T], ref.values[i][:, pos])
        assert (k[:, :3] == 7).all() and (k[:, 3 + T:] == 7).all()  # nothing written outside the slice
    assert i == L - 1


def test_stored_layers_convert_to_the_outputs_dtype(blobs, make_kv):
    blobs.put("d", _doc(make_kv, True, torch.bfloat16))
    ref = blobs.get("d")
    order, fills = blobs.iter_stored_layers("d")
    k = torch.empty(ref.keys.shape[1], ref.num_tokens, ref.keys.shape[3])  # float32 outputs of a bfloat16 record
    v = torch.empty_like(k)
    next(fills)(k, v)
    assert torch.equal(k, ref.keys[0][:, order].float()) and torch.equal(v, ref.values[0][:, order].float())


def test_a_corrupt_layer_raises_from_its_fill_and_deletes_the_record(blobs, make_kv, lmdb_env):
    blobs.put("d", _doc(make_kv, True, torch.float32))
    corrupt_layer(lmdb_env, "d", 1)
    _, fills = blobs.iter_stored_layers("d")
    k = torch.empty(2, 37, 8)
    next(fills)(k, torch.empty_like(k))  # layer 0 is intact
    with pytest.raises(CorruptRecordError):
        next(fills)(k, torch.empty_like(k))
    assert not blobs.contains("d") and blobs.checksum_failures == 1


def test_a_record_replaced_while_read_raises_key_error(blobs, make_kv):
    blobs.put("d", _doc(make_kv, True, torch.float32))
    _, fills = blobs.iter_stored_layers("d")
    blobs.put("d", _doc(make_kv, True, torch.float32, seed=1))
    k = torch.empty(2, 37, 8)
    with pytest.raises(KeyError):
        next(fills)(k, torch.empty_like(k))


def test_an_absent_record_raises_key_error_up_front(blobs):
    with pytest.raises(KeyError):
        blobs.iter_stored_layers("missing")


def test_the_output_must_fit_the_record(blobs, make_kv):
    blobs.put("d", _doc(make_kv, True, torch.float32))
    _, fills = blobs.iter_stored_layers("d")
    k = torch.empty(2, 36, 8)
    with pytest.raises(CorruptRecordError, match="does not fit"):
        next(fills)(k, torch.empty_like(k))
