"""attend_with_lse: a masked float32 prefill's attention with each row's log-sum-exp from the same fused kernel -
the output the same bytes as attend's, the log-sum-exp that of the scaled, masked scores - and the importance mass
fed from it equal to the mass computing its own."""

from __future__ import annotations

import pytest
import torch

from kvlink_rag.runtime import ragged
from kvlink_rag.runtime.attention_probs import attention_mass
from kvlink_rag.runtime.ragged import attend, attend_with_lse

HEADS, KV, D = 6, 2, 16
MIN = torch.finfo(torch.float32).min


def _case(past: int, n: int, dtype: torch.dtype = torch.float32, seed: int = 0):
    """Queries ``[HEADS, n, D]``, a past of two pieces (strided views of an arena, as block views are) and the
    row's own keys, and a mask hiding a past slot with the own keys causal."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(HEADS, n, D, generator=g)
    arena = torch.randn(2, KV, past + 7, D, generator=g).to(dtype)
    a = past // 2
    pieces = [(arena[0, :, :a], arena[1, :, :a]), (arena[0, :, 7 + a:], arena[1, :, 7 + a:]),
              (torch.randn(KV, n, D, generator=g).to(dtype), torch.randn(KV, n, D, generator=g).to(dtype))]
    mask = torch.zeros(n, past + n)
    mask[:, past:] = torch.triu(torch.full((n, n), MIN), 1)
    mask[:, 1] = MIN
    return q, pieces, mask


def _lse(q, pieces, mask, scale):
    k = torch.cat([k for k, _ in pieces], dim=1).double().repeat_interleave(HEADS // KV, 0)
    return torch.logsumexp(q.double() @ k.transpose(1, 2) * scale + mask.double(), dim=-1)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
def test_the_output_is_attends_and_the_lse_that_of_the_scores(kv_dtype, monkeypatch):
    if kv_dtype == torch.bfloat16:  # widened to float32, as attend does on a CPU without native bfloat16 attention
        monkeypatch.setattr(ragged, "prefill_kernel", lambda: False)
        monkeypatch.setattr(ragged, "bf16_native", lambda: False)
    q, pieces, mask = _case(past=300, n=40, dtype=kv_dtype)
    out, lse = attend_with_lse(q, pieces, mask, 0.25)
    assert torch.equal(out, attend(q, pieces, mask, 0.25))
    assert lse.shape == (HEADS, 40) and lse.dtype == torch.float32
    assert (lse.double() - _lse(q, pieces, mask, 0.25)).abs().max() < 1e-4


def test_rows_another_kernel_runs_get_no_lse():
    q, pieces, mask = _case(past=30, n=8)
    assert attend_with_lse(q[:, :1], pieces, mask[:1], 0.25)[1] is None  # one query: the decode kernel
    assert attend_with_lse(q.to(torch.bfloat16), pieces, mask, 0.25)[1] is None  # another dtype
    own = [pieces[-1]]
    out, lse = attend_with_lse(q, own, None, 0.25, causal=True)  # a causal row opening its sequence
    assert lse is None and torch.equal(out, attend(q, own, None, 0.25, causal=True))


@pytest.mark.parametrize("past,n", [(300, 40), (12, 300)], ids=["chunk-after-past", "one-block"])
@pytest.mark.parametrize("skip", [0, 3])
@pytest.mark.parametrize("exclude_self", [False, True])
def test_the_mass_from_the_attentions_lse_equals_the_mass_computing_its_own(past, n, skip, exclude_self):
    """After a long past (the own keys' probabilities only, no second pass over every key) the explicit softmax's
    mass; a block whose own causal keys are most keys keeps the explicit softmax (faster there than exp(s - lse)
    at 400-3,000 tokens, docs/bench/importance-lse-2026-12-07), the LSE unused."""
    q, pieces, mask = _case(past=past, n=n)
    _, lse = attend_with_lse(q, pieces, mask, 0.25)
    want = attention_mass(q, pieces, mask, 0.25, skip, exclude_self, first_key=past)
    got = attention_mass(q, pieces, mask, 0.25, skip, exclude_self, first_key=past, lse=lse)
    assert (got[past:] - want[past:]).abs().max() < 1e-4 and got[past:].sum() > 1
    assert not got[:past].any() if n <= past else torch.equal(got, want)
