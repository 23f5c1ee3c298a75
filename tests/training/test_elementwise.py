"""The training forward's elementwise kernels (silu * up, RMSNorm) against torch's ops, values and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from training.elementwise import elementwise_kernels, rms_norm, silu_mul
from training.frozen_linear import frozen_lora_linear

EXT = elementwise_kernels(torch.bfloat16, torch.device("cpu"))
needs_kernels = pytest.mark.skipif(EXT is None, reason="the elementwise kernels need a CPU with AVX512-BF16")


def _gate_up(rows=7, inter=40, seed=0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    gu = torch.randn(rows, 2 * inter, generator=gen) * 4
    gu[0, :6] = torch.tensor([0.0, -100.0, 100.0, -88.5, 90.0, -1e-3])  # saturated sigmoids and zero
    return gu.bfloat16()


@needs_kernels
def test_silu_mul_equals_torchs_on_the_bfloat16_gemm_output_and_its_gradient_rounded_once():
    inter = 40  # not a multiple of 16: a row's tail
    gu = _gate_up(inter=inter).requires_grad_(True)
    ref = gu.detach().float().requires_grad_(True)
    got, want = silu_mul(gu, inter, EXT), silu_mul(ref, inter)
    assert got.dtype == torch.float32 and not torch.isnan(got).any()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    g = torch.randn(got.shape, generator=torch.Generator().manual_seed(1))
    got.backward(g)
    want.backward(g)
    assert gu.grad.dtype == torch.bfloat16
    bound = ref.grad.abs() * 2 ** -8 + 1e-5  # one bfloat16 rounding of the float32 gradient (+ ulps of the sigmoid)
    assert bool(((gu.grad.float() - ref.grad).abs() <= bound).all())


@needs_kernels
def test_rms_norm_equals_torchs_with_the_gradient_of_x_and_none_for_the_frozen_weight():
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(9, 72, generator=gen) * 3).requires_grad_(True)  # 72: a row's tail after four vectors
    w = torch.randn(72, generator=gen)
    ref = x.detach().clone().requires_grad_(True)
    got, want = rms_norm(x, w, 1e-5, EXT), F.rms_norm(ref, (72,), w, 1e-5)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    g = torch.randn(got.shape, generator=gen)
    got.backward(g)
    want.backward(g)
    assert torch.allclose(x.grad, ref.grad, rtol=1e-4, atol=1e-6)
    assert w.grad is None


def test_without_kernels_the_functions_are_torchs_ops_in_float64():
    gen = torch.Generator().manual_seed(3)
    gu = torch.randn(3, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: silu_mul(t, 4), (gu,))
    assert torch.equal(silu_mul(gu, 4), F.silu(gu[:, :4]) * gu[:, 4:])
    x = torch.randn(3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, generator=gen, dtype=torch.float64)
    assert torch.equal(rms_norm(x, w, 1e-6), F.rms_norm(x, (5,), w, 1e-6))


def test_a_kept_gemm_output_is_the_converted_ones_bits_and_takes_a_bfloat16_gradient():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(5, 8, generator=gen, requires_grad=True)
    a = (torch.randn(2, 8, generator=gen) * 0.1).requires_grad_(True)
    b = (torch.randn(6, 2, generator=gen) * 0.1).requires_grad_(True)
    w = torch.cat([torch.randn(6, 8, generator=gen), torch.zeros(6, 2)], 1).bfloat16()
    kept = frozen_lora_linear(x, w.clone(), None, (a, b), keep=True)
    converted = frozen_lora_linear(x, w.clone(), None, (a, b))
    assert kept.dtype == torch.bfloat16 and converted.dtype == torch.float32
    assert torch.equal(kept.float(), converted)
    g = torch.randn(5, 6, generator=gen).bfloat16()
    grads = []
    for out in (kept, converted):
        x.grad = a.grad = b.grad = None
        out.backward(g if out is kept else g.float())
        grads.append((x.grad.clone(), a.grad.clone(), b.grad.clone()))
    for got, want in zip(*grads):
        assert got.dtype == torch.float32 and torch.equal(got, want)  # the gradients in the masters' dtype


def test_a_kept_output_without_a_low_rank_term_returns_the_gradient_of_x_in_its_dtype():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, 8, generator=gen, requires_grad=True)
    w = torch.randn(4, 8, generator=gen).bfloat16()
    kept = frozen_lora_linear(x, w, None, None, keep=True)
    assert kept.dtype == torch.bfloat16 and torch.equal(kept.float(), frozen_lora_linear(x, w, None, None))
    g = torch.randn(3, 4, generator=gen).bfloat16()
    kept.backward(g)
    assert x.grad.dtype == torch.float32 and torch.equal(x.grad, (g @ w).float())
