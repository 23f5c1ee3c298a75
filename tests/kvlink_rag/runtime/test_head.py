"""RescoredHead: int8 scores for the vocabulary, each row's best candidates exactly the exact head's."""

import pytest
import torch

from kvlink_rag.runtime.head import RescoredHead
from kvlink_rag.runtime.linear import DenseLinear


def _head(vocab=512, hidden=64, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return DenseLinear((torch.randn(vocab, hidden, generator=g) * 0.05).to(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_each_rows_best_logits_are_the_exact_heads(dtype):
    exact = _head(dtype=dtype)
    head = RescoredHead(exact, k=16)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(1))
    want, got = exact(x), head(x)
    top = want.topk(8, dim=-1).indices
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert torch.allclose(got.gather(-1, top), want.gather(-1, top), atol=1e-6, rtol=0)
    tail = (got - want).abs().max()
    assert 0 < tail < 0.05 * want.abs().max()  # the rest keeps int8's logits: close, not exact


def test_a_head_with_a_bias_is_refused():
    w = torch.randn(8, 4)
    with pytest.raises(ValueError, match="bias"):
        RescoredHead(DenseLinear(w, torch.zeros(8)))
