"""Attention over a detached cache plus new tokens: exact in float64/float32, its kernels as torch computes them."""

from __future__ import annotations

import pytest
import torch

from training.cached_attention import (RaggedLayout, Workspace, cached_attention, masked_softmax_,
                                      softmax_backward_)

MIN = torch.finfo(torch.float32).min


def _case(dtype, b=2, kv=2, g=2, q=3, n=5, d=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q_ = torch.randn(b, kv * g, q, d, generator=gen, dtype=torch.float64).to(dtype).requires_grad_(True)
    kn = torch.randn(b, kv, q, d, generator=gen, dtype=torch.float64).to(dtype).requires_grad_(True)
    vn = torch.randn(b, kv, q, d, generator=gen, dtype=torch.float64).to(dtype).requires_grad_(True)
    kc = torch.randn(b, kv, n, d, generator=gen, dtype=torch.float64).to(dtype)
    vc = torch.randn(b, kv, n, d, generator=gen, dtype=torch.float64).to(dtype)
    mask = torch.zeros(b, q, n + q)
    mask[:, :, n:] = torch.triu(torch.full((q, q), MIN), 1)
    mask[0, 1, 2] = MIN  # a masked cached key in one example's row
    return q_, kn, vn, kc, vc, mask


def _run(q, kn, vn, kc, vc, mask, workspace=None, key=None, cached=None):
    """``[B, heads, Q, d]`` queries through the packed API; ``cached``: per example cache lengths (default all)."""
    b, h, nq, d = q.shape
    kv, n = kn.shape[1], kc.shape[2]
    cached = cached or (n,) * b
    masks = tuple(torch.cat([mask[i, :, :c], mask[i, :, n:]], 1).contiguous() for i, c in enumerate(cached))
    layout = RaggedLayout((nq,) * b, tuple(cached), masks)
    k_all = torch.zeros(layout.kv_size(kv, d), dtype=kc.dtype)
    v_all = torch.zeros_like(k_all)
    for i, (dk, dv) in enumerate(zip(layout.kv_views(k_all, kv, d), layout.kv_views(v_all, kv, d))):
        dk[:, : cached[i]], dv[:, : cached[i]] = kc[i, :, : cached[i]], vc[i, :, : cached[i]]
    out = cached_attention(q.transpose(1, 2).reshape(b * nq, h, d), kn.transpose(1, 2).reshape(b * nq, -1, d),
                           vn.transpose(1, 2).reshape(b * nq, -1, d), k_all, v_all, layout, 0.5, workspace, key)
    return out.view(b, nq, h, d).transpose(1, 2)


def test_gradients_are_those_of_the_function_in_float64():
    q, kn, vn, kc, vc, mask = _case(torch.float64)
    assert torch.autograd.gradcheck(lambda a, b, c: _run(a, b, c, kc, vc, mask), (q, kn, vn))


def test_equals_sdpa_over_cache_and_new_tokens_in_float32():
    q, kn, vn, kc, vc, mask = _case(torch.float32)
    g = q.shape[1] // kn.shape[1]
    k = torch.cat([kc, kn], 2).repeat_interleave(g, 1)
    v = torch.cat([vc, vn], 2).repeat_interleave(g, 1)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], scale=0.5)
    w = torch.randn(want.shape)
    want_grads = torch.autograd.grad((want * w).sum(), (q, kn, vn))
    got = _run(q, kn, vn, kc, vc, mask, Workspace(), 0)
    grads = torch.autograd.grad((got * w).sum(), (q, kn, vn))
    assert torch.allclose(got, want, atol=1e-6)
    for a, b in zip(grads, want_grads):
        assert torch.allclose(a, b, atol=1e-5)


def test_examples_with_shorter_caches_read_only_their_own_keys():
    q, kn, vn, kc, vc, mask = _case(torch.float32)
    got = _run(q, kn, vn, kc, vc, mask, cached=(5, 3))
    short = _run(q[1:], kn[1:], vn[1:], kc[1:, :, :3], vc[1:, :, :3], torch.cat([mask[1:, :, :3], mask[1:, :, 5:]], 2))
    assert torch.allclose(got[1], short[0], atol=1e-6)
    assert torch.allclose(got[0], _run(q[:1], kn[:1], vn[:1], kc[:1], vc[:1], mask[:1])[0], atol=1e-6)


def test_a_graph_whose_buffers_a_later_forward_overwrote_fails_in_backward():
    ws = Workspace()
    q, kn, vn, kc, vc, mask = _case(torch.float32)
    first = _run(q, kn, vn, kc, vc, mask, ws, 0)
    _run(q, kn, vn, kc, vc, mask, ws, 0)  # the same buffer: the first graph's probabilities are gone
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        first.sum().backward()


def _bf16_scores(seed=0):
    gen = torch.Generator().manual_seed(seed)
    s = (torch.randn(2, 3, 5, 133, generator=gen) * 4).bfloat16()  # 133 keys: a partial vector at the end
    mask = torch.zeros(2, 5, 133)
    mask[:, :, 40:60] = MIN
    mask[1, 2, 100:] = -3.0
    return s, mask


def test_the_bfloat16_softmax_is_torchs_rounded_once():
    s, mask = _bf16_scores()
    want = torch.softmax(s.float() + mask[:, None], -1)
    got = masked_softmax_(s.clone(), mask, 3).float()
    assert torch.equal(got[..., 40:60], torch.zeros_like(got[..., 40:60]))  # masked keys: exactly 0
    ulp = want.abs() * 2 ** -8 + 1e-30  # one bfloat16 rounding of the float32 result
    assert bool(((got - want).abs() <= ulp).all())


def test_the_bfloat16_softmax_backward_is_torchs_rounded_once():
    s, mask = _bf16_scores()
    p = torch.softmax(s.float() + mask[:, None], -1).bfloat16()
    g = torch.randn(p.shape, generator=torch.Generator().manual_seed(1)).bfloat16()
    pf, gf = p.float(), g.float()
    want = pf * (gf - (gf * pf).sum(-1, keepdim=True))
    got = softmax_backward_(g.clone(), p).float()
    assert bool(((got - want).abs() <= want.abs() * 2 ** -8 + 1e-6).all())


def test_the_workspace_reuses_a_buffer_and_grows_it_only_when_asked_for_more():
    ws = Workspace()
    a = ws.get("k", (2, 3), torch.bfloat16, "cpu")
    b = ws.get("k", (3, 2), torch.bfloat16, torch.device("cpu"))
    assert b.data_ptr() == a.data_ptr()  # the same pages from step to step
    c = ws.get("k", (4, 4), torch.bfloat16, "cpu")
    assert c.shape == (4, 4) and ws.get("k", (2, 2), torch.bfloat16, "cpu").data_ptr() == c.data_ptr()
    assert ws.get("k", (2, 2), torch.float32, "cpu").dtype == torch.float32  # another dtype: a new buffer
