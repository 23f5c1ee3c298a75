"""A frozen linear with a trainable low-rank term: the gradients of its formula."""

from __future__ import annotations

import torch

from training.frozen_linear import frozen_lora_linear


def test_gradients_of_input_and_low_rank_term_in_float64():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    w, bias = torch.randn(5, 6, generator=gen, dtype=torch.float64), torch.randn(5, generator=gen, dtype=torch.float64)
    a = torch.randn(2, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x_, a_, b_: frozen_lora_linear(x_, w, bias, (a_, b_)), (x, a, b))
    y = frozen_lora_linear(x, w, bias, (a, b))
    assert torch.allclose(y, x @ w.t() + bias + (x @ a.t()) @ b.t())
    assert torch.allclose(frozen_lora_linear(x, w, None, None), x @ w.t())


def test_the_frozen_gemm_runs_in_the_weights_dtype_and_returns_float32():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, generator=gen)
    w = torch.randn(3, 8, generator=gen)
    y = frozen_lora_linear(x, w.bfloat16(), None, None)
    assert y.dtype == torch.float32
    assert torch.equal(y, torch.nn.functional.linear(x.bfloat16(), w.bfloat16()).float())
