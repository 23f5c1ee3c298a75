"""The training attention: sdpa's output and the gradients of queries and new keys/values, none formed for the
cached part."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from training.fast_attention import train_attention


def _case(seed=0, b=2, heads=6, kv_heads=2, q=5, cached=9, d=8):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(b, heads, q, d, generator=g, requires_grad=True)
    kc, vc = torch.randn(b, kv_heads, cached, d, generator=g), torch.randn(b, kv_heads, cached, d, generator=g)
    kn = torch.randn(b, kv_heads, q, d, generator=g, requires_grad=True)
    vn = torch.randn(b, kv_heads, q, d, generator=g, requires_grad=True)
    allowed = torch.rand(b, 1, q, cached + q, generator=g) > 0.3
    allowed[..., 0] = True
    mask = torch.zeros(allowed.shape).masked_fill_(~allowed, torch.finfo(torch.float32).min)
    return query, kc, vc, kn, vn, mask


def test_matches_sdpa_and_its_gradients():
    query, kc, vc, kn, vn, mask = _case()
    key, value = torch.cat([kc, kn], 2), torch.cat([vc, vn], 2)
    out, _ = train_attention(None, query, key, value, mask)
    grads = torch.autograd.grad(out.square().sum(), [query, kn, vn])
    ref = F.scaled_dot_product_attention(query, key.repeat_interleave(3, 1), value.repeat_interleave(3, 1),
                                         attn_mask=mask).transpose(1, 2)
    ref_grads = torch.autograd.grad(ref.square().sum(), [query, kn, vn])
    assert out.shape == (2, 5, 6, 8)
    assert torch.allclose(out, ref, atol=1e-5)
    for a, b in zip(grads, ref_grads):
        assert torch.allclose(a, b, atol=1e-4)


def test_bfloat16_matmuls_stay_close_and_return_the_query_dtype():
    query, kc, vc, kn, vn, mask = _case(seed=3)
    key, value = torch.cat([kc, kn], 2), torch.cat([vc, vn], 2)
    out, _ = train_attention(None, query, key, value, mask)
    fast, _ = train_attention(None, query, key, value, mask, matmul_dtype=torch.bfloat16)
    assert fast.dtype == torch.float32
    assert (fast - out).abs().max() < 0.05
