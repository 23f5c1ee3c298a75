"""attention_mass: the probabilities each key receives, summed over heads and counted rows, equal an explicit float64
softmax - over every key, and over the keys from ``first_key`` on, where the rows' log-sum-exp comes from the fused
kernel (grouped-query heads, a mask, skipped rows, each query's own key left out)."""

from __future__ import annotations

import pytest
import torch

from kvlink_rag.runtime.attention_probs import attention_mass


def _case(past: int, n: int, heads: int = 6, kv: int = 2, d: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(heads, n, d, generator=g)
    pieces = [(torch.randn(kv, past, d, generator=g), torch.randn(kv, past, d, generator=g)),
              (torch.randn(kv, n, d, generator=g), torch.randn(kv, n, d, generator=g))]
    mask = torch.zeros(n, past + n)
    mask[:, past:] = torch.triu(torch.full((n, n), torch.finfo(torch.float32).min), 1)  # own keys causal
    mask[:, 3] = torch.finfo(torch.float32).min  # a hidden slot in the past
    return q, pieces, mask


def _reference(q, pieces, mask, scale, skip, exclude_self):
    k = torch.cat([k for k, _ in pieces], dim=1).double()
    heads, n, _ = q.shape
    kr = k.repeat_interleave(heads // k.shape[0], 0)
    p = torch.softmax(q.double() @ kr.transpose(1, 2) * scale + mask.double(), dim=-1)[:, skip:]  # [heads, rows, keys]
    if exclude_self:
        keys = k.shape[1]
        for r in range(n - skip):
            p[:, r, keys - n + skip + r] = 0
    return p.sum(dim=(0, 1))


@pytest.mark.parametrize("past,n", [(40, 24), (300, 260), (10, 24)], ids=["short", "row-blocks", "past-shorter"])
@pytest.mark.parametrize("skip", [0, 5])
@pytest.mark.parametrize("exclude_self", [False, True])
def test_the_mass_from_first_key_is_the_explicit_softmax_of_those_keys(past, n, skip, exclude_self):
    q, pieces, mask = _case(past, n)
    scale = 16 ** -0.5
    want = _reference(q, pieces, mask, scale, skip, exclude_self)
    every = attention_mass(q, pieces, mask, scale, skip, exclude_self)
    assert (every.double() - want).abs().max() < 1e-4
    got = attention_mass(q, pieces, mask, scale, skip, exclude_self, first_key=past)
    assert (got[past:].double() - want[past:]).abs().max() < 1e-4
    if n <= past:  # the fused kernel's path: keys before first_key are not formed
        assert not got[:past].any()


@pytest.mark.parametrize("past,n", [(6, 24), (30, 300)], ids=["short", "row-blocks"])
@pytest.mark.parametrize("skip", [0, 5, 140])
@pytest.mark.parametrize("exclude_self", [False, True])
def test_attend_and_mass_gives_attends_output_and_the_explicit_mass_from_one_softmax(past, n, skip, exclude_self):
    """Importance at precompute: the output equals the plain kernel's within float32 rounding and the mass the
    float64 softmax's, over blocks of query rows, a hidden slot in the past, grouped-query heads, skipped rows."""
    from kvlink_rag.runtime.attention_probs import attend_and_mass
    from kvlink_rag.runtime.ragged import attend

    skip = min(skip, n - 1)
    q, pieces, mask = _case(past, n)
    scale = 16 ** -0.5
    out, mass = attend_and_mass(q, pieces, mask, scale, skip, exclude_self, first_key=past)
    assert (out - attend(q, pieces, mask, scale)).abs().max() < 1e-5
    want = _reference(q, pieces, mask, scale, skip, exclude_self)
    assert (mass.double() - want).abs().max() < 1e-4 and mass.sum() > 0


def test_attend_and_mass_leaves_a_chunk_after_a_long_past_and_other_rows_to_the_kernels():
    from kvlink_rag.runtime.attention_probs import attend_and_mass

    q, pieces, mask = _case(6, 24)  # a document after a short anchor prefix
    assert attend_and_mass(q, pieces, mask, 0.25, first_key=6) is not None
    assert attend_and_mass(q, pieces, mask, 0.25) is not None
    q2, pieces2, mask2 = _case(40, 24)  # the chunk's own keys at most half: the fused kernel's log-sum-exp path
    assert attend_and_mass(q2, pieces2, mask2, 0.25, first_key=40) is None
    assert attend_and_mass(q, pieces, None, 0.25) is None  # no mask
    assert attend_and_mass(q.bfloat16(), pieces, mask, 0.25) is None
