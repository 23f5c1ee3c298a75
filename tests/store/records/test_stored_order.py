"""A stored layer handed over as its rows (:meth:`LayerFill.stage`, the load path's batched write): the rows are the
record's bytes in stored order, only inside a read session, only for a record of the fill's dtype, and every
check of a fill still holds (checksum, replaced record, a shape that does not fit)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from factories import corrupt_layer
from store.blobs.lmdb import LmdbBlobStore
from store.records.errors import CorruptRecordError
from store.records.verified import VERIFIED


@pytest.fixture
def blobs(lmdb_env, clock):
    store = LmdbBlobStore(lmdb_env, clock=clock)
    yield store
    store.close()


def _put(blobs, make_kv, key="d", scored=True, dtype=torch.bfloat16, int8=False, seed=0, tokens=37):
    kv = make_kv(tokens=tokens, dtype=dtype, seed=seed)
    if scored:
        kv = dataclasses.replace(kv, importance=torch.rand(tokens, generator=torch.Generator().manual_seed(seed)))
    blobs.put(key, kv, int8=int8)
    return blobs.get(key)


def _rows(part, shape, dtype, token_major):
    """The ``[H, n, D]`` tensor a staged part holds."""
    H, n, D = shape
    x = torch.from_numpy(np.array(part.raw)).view(dtype)
    return x.view(n, H, D).transpose(0, 1) if token_major else x.view(H, n, D)


@pytest.mark.parametrize("scored", [False, True])
def test_staged_rows_are_the_layer_in_stored_order(blobs, make_kv, scored):
    ref = _put(blobs, make_kv, scored=scored)
    order, fills = blobs.iter_stored_layers("d")
    pos = torch.arange(ref.num_tokens) if order is None else order
    L, H, T, D = ref.keys.shape
    for i, fill in enumerate(fills):
        k_parts, v_parts = [], []
        with blobs.layer_session():
            assert fill.stage(torch.bfloat16, (H, T, D), 11, k_parts, v_parts)
            (k,), (v,) = k_parts, v_parts
            assert (k.start, k.token_major, v.token_major) == (11, scored, scored)
            assert torch.equal(_rows(k, (H, T, D), torch.bfloat16, scored), ref.keys[i][:, pos])
            assert torch.equal(_rows(v, (H, T, D), torch.bfloat16, scored), ref.values[i][:, pos])
    assert i == L - 1


def test_nothing_is_staged_outside_a_session_or_for_another_dtype(blobs, make_kv):
    _put(blobs, make_kv, key="bf16")
    _put(blobs, make_kv, key="f32", dtype=torch.float32)
    _put(blobs, make_kv, key="int8", dtype=torch.float32, int8=True)
    VERIFIED.clear()
    shape = (2, 37, 8)
    for key, dtype, session in (("bf16", torch.bfloat16, False), ("f32", torch.bfloat16, True),
                                ("int8", torch.float32, True)):
        _, fills = blobs.iter_stored_layers(key)
        k_parts, v_parts = [], []
        with blobs.layer_session() if session else _none():
            assert not next(fills).stage(dtype, shape, 0, k_parts, v_parts)
        assert k_parts == v_parts == []
    assert len(VERIFIED._seen) == 0  # nothing unchecked is remembered as verified


class _none:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_a_corrupt_layer_raises_from_stage_and_the_record_is_deleted_after_the_session(blobs, make_kv, lmdb_env):
    _put(blobs, make_kv)
    corrupt_layer(lmdb_env, "d", 0)
    VERIFIED.clear()
    _, fills = blobs.iter_stored_layers("d")
    with pytest.raises(CorruptRecordError):
        with blobs.layer_session():
            next(fills).stage(torch.bfloat16, (2, 37, 8), 0, [], [])
    assert not blobs.contains("d") and blobs.checksum_failures == 1


def test_a_replaced_record_or_a_shape_that_does_not_fit_raises(blobs, make_kv):
    _put(blobs, make_kv)
    _, fills = blobs.iter_stored_layers("d")
    with blobs.layer_session(), pytest.raises(CorruptRecordError, match="does not fit"):
        next(fills).stage(torch.bfloat16, (2, 36, 8), 0, [], [])
    _put(blobs, make_kv, seed=1)
    with blobs.layer_session(), pytest.raises(KeyError):
        next(fills).stage(torch.bfloat16, (2, 37, 8), 0, [], [])
