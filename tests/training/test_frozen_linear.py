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
    w_aug = torch.cat([w, torch.zeros(5, 2, dtype=torch.float64)], 1)  # room for B's columns
    # a fresh augmented weight per call: each forward writes its B columns (a graph's own, checked by version)
    assert torch.autograd.gradcheck(lambda x_, a_, b_: frozen_lora_linear(x_, w_aug.clone(), bias, (a_, b_)),
                                    (x, a, b))
    y = frozen_lora_linear(x, w_aug, bias, (a, b))
    assert torch.allclose(y, x @ w.t() + bias + (x @ a.t()) @ b.t())
    assert torch.allclose(frozen_lora_linear(x, w_aug, None, None), x @ w.t())  # without a term: W only
    x.grad = None
    frozen_lora_linear(x, w_aug, None, None).sum().backward()
    assert torch.allclose(x.grad, torch.ones(2, 3, 5, dtype=torch.float64) @ w)


def test_a_graph_whose_weight_a_later_forward_rewrote_fails_in_backward():
    x, a, b = torch.randn(3, 4), torch.randn(2, 4, requires_grad=True), torch.randn(5, 2, requires_grad=True)
    w_aug = torch.zeros(5, 6)
    first = frozen_lora_linear(x, w_aug, None, (a, b))
    frozen_lora_linear(x, w_aug, None, (a, b * 2))
    try:
        first.sum().backward()
    except RuntimeError as e:
        assert "modified by an inplace operation" in str(e)
    else:
        raise AssertionError("a stale graph must not silently use another forward's B")


def test_the_frozen_gemm_runs_in_the_weights_dtype_and_returns_float32():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, generator=gen)
    w = torch.randn(3, 8, generator=gen)
    y = frozen_lora_linear(x, w.bfloat16(), None, None)
    assert y.dtype == torch.float32
    assert torch.equal(y, torch.nn.functional.linear(x.bfloat16(), w.bfloat16()).float())
