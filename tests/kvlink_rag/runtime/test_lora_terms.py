"""The runner's LoRA terms: prefill GEMMs in the dtype of the format's prefill linears."""

from __future__ import annotations

import pytest
import torch

from kvlink_rag.runtime.lora import FusedLowRank, LowRank, prefill_gemm_dtype


def term(gemm_dtype, seed: int = 3) -> FusedLowRank:
    g = torch.Generator().manual_seed(seed)
    a1, b1, a2, b2 = (torch.randn(*s, generator=g).bfloat16().float() for s in ((16, 576), (192, 16), (16, 576),
                                                                                  (576, 16)))
    return FusedLowRank([LowRank(0, 192, a1, b1, 2.0), LowRank(192, 768, a2, b2, 0.5)], gemm_dtype)


@pytest.mark.parametrize("fmt,want", [("q4q8-bf16", torch.bfloat16), ("int4-bf16", torch.bfloat16),
                                      ("bfloat16", torch.bfloat16), ("q4q8-f32", None), ("int4-f32", None),
                                      ("native", None), ("int8", None)])
def test_the_terms_multiply_in_the_dtype_of_the_formats_prefill_linears(fmt, want):
    assert prefill_gemm_dtype(fmt) == want


@pytest.mark.parametrize("y_dtype", [torch.float32, torch.bfloat16])
def test_bfloat16_gemms_add_the_float32_terms_to_bfloat16_rounding(y_dtype):
    x = torch.randn(70, 576, generator=torch.Generator().manual_seed(5)).bfloat16().to(y_dtype)
    y0 = torch.randn(70, 800, generator=torch.Generator().manual_seed(6)).to(y_dtype)
    ref, got = y0.clone(), y0.clone()
    term(None)._gemm(ref, x)
    t16 = term(torch.bfloat16)
    t16._gemm(got, x)
    assert t16.gemm_a.dtype == t16.gemm_b_t.dtype == torch.bfloat16
    assert got.dtype == y_dtype and torch.equal(got[:, 768:], y0[:, 768:])
    delta_ref, delta = (ref - y0).float()[:, :768], (got - y0).float()[:, :768]  # the terms' columns only
    assert delta_ref.abs().mean() > 1.0  # the terms are not negligible here
    rel = (delta - delta_ref).norm() / delta_ref.norm()
    assert rel < 1e-2  # bfloat16 rounding of x A^T and of the product, not a different sum


def test_float32_terms_are_unchanged_by_default():
    x, y = torch.randn(9, 576), torch.zeros(9, 800)
    t = term(None)
    t._gemm(y, x)
    a, b_t = t.stacks()
    assert t.gemm_a.dtype == torch.float32
    torch.testing.assert_close(y[:, :768], x @ a.t() @ b_t, rtol=1e-5, atol=1e-4)


def test_merged_weights_add_b_a_to_the_projections_rows_and_keep_the_bias():
    from kvlink_rag.runtime.merged_lora import merged_weights

    g = torch.Generator().manual_seed(7)
    q, k = torch.nn.Linear(576, 192, bias=True), torch.nn.Linear(576, 64, bias=False)
    t = term(None)
    a, b_t = t.stacks()
    w, bias = merged_weights([q, k], 0, 256, a[:, :576], b_t[:, :256])
    base = torch.cat([q.weight, k.weight]).detach()
    torch.testing.assert_close(w, base + b_t[:, :256].t() @ a, rtol=0, atol=0)
    assert torch.equal(bias, torch.cat([q.bias.detach(), torch.zeros(64)]))
    x = torch.randn(5, 576, generator=g)
    torch.testing.assert_close(x @ w.t(), x @ base.t() + x @ a.t() @ b_t[:, :256], rtol=1e-4, atol=1e-3)


def test_project_sends_prefill_rows_through_the_merged_weights_and_leaves_decode_rows_their_format():
    from kvlink_rag.runtime.linear import DenseLinear, SplitLinear, TokenSplit
    from kvlink_rag.runtime.merged_lora import project

    w, w2 = torch.randn(8, 4), torch.randn(8, 4)
    small, large, merged = DenseLinear(w * 0.5, None), DenseLinear(w, None), DenseLinear(w2, None)
    x = torch.randn(5, 4)
    mixed = TokenSplit(torch.tensor([0]), torch.tensor([1, 2, 3, 4]))
    y, rest = project(SplitLinear(small, large), merged, x, mixed)
    assert rest and torch.equal(y[0], (x[:1] @ (w * 0.5).t())[0]) and torch.equal(y[1:], x[1:] @ w2.t())
    y, rest = project(SplitLinear(small, large), merged, x, TokenSplit(torch.arange(5), None))
    assert rest and torch.equal(y, x @ (w * 0.5).t())  # decode rows only: their format, their terms next
    y, rest = project(SplitLinear(small, large), merged, x, TokenSplit(None, torch.arange(5)))
    assert not rest and torch.equal(y, x @ w2.t())
    y, rest = project(large, merged, x, mixed)  # one format: every row merged
    assert not rest and torch.equal(y, x @ w2.t())


def test_a_merged_adapter_is_rebuilt_when_its_tensors_change_in_place():
    q = torch.nn.Linear(576, 768, bias=False)
    t = term(torch.bfloat16)
    t.modules = [q]
    first = t.merged()
    assert t.merged() is first  # cached while the adapter is unchanged
    with torch.no_grad():
        t.terms[0].a.add_(1.0)  # an optimiser step
    assert t.merged() is not first
    assert term(None).merged() is None  # float32 terms never merge
