"""End to end on the real default model: CacheBlend at ratio 1 is full prefill, at ratio 0 naive reuse, and
its selection brings the next-token distribution closer to full prefill than naive reuse (float32)."""

from __future__ import annotations

import pytest
import torch

from factories import NQ_PATH, real_engine
from evaluation.nq import build_documents, load_nq

pytestmark = pytest.mark.e2e


def _kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    """KL(q || p) of two ``[vocab]`` logit vectors (nats)."""
    return float(torch.nn.functional.kl_div(p_logits.log_softmax(-1), q_logits.log_softmax(-1), log_target=True,
                                            reduction="sum"))


def test_real_model_blend_ends_at_naive_and_full_prefill(tmp_path):
    if not NQ_PATH.exists():
        pytest.skip(f"{NQ_PATH} not present")
    examples = load_nq(NQ_PATH, limit=10)
    docs, _ = build_documents(examples, 1, 4, "middle")
    eng = real_engine(tmp_path, kv_dtype="float32", link_k=0)
    q = examples[1].question
    with torch.inference_mode():
        full = eng.full_context(q, docs)
        naive, _ = eng.link_context(q, docs)
        ctx = {r: eng.link_context(q, docs, recompute_ratio=r)[0] for r in (0.0, 0.15, 1.0)}
    assert torch.equal(ctx[0.0].last_logits, naive.last_logits)
    assert (ctx[1.0].last_logits - full.last_logits).abs().max().item() < 1e-3
    assert _kl(ctx[0.15].last_logits, full.last_logits) < _kl(naive.last_logits, full.last_logits)
