"""End to end on the real default model: a partly retained linked cache against transformers' forward over the
kept tokens at their positions (isolated encoding, importance scored at precompute)."""

from __future__ import annotations

import pytest
import torch

from factories import NQ_PATH, real_engine
from evaluation.nq import build_documents, load_nq
from kvlink_rag.linking.kvcache import cache_tensors
from kvlink_rag.linking.linker import link
from kvlink_rag.types import LayeredDocuments
from reference import Piece, kv_by_position, reference_forward

pytestmark = pytest.mark.e2e


def test_real_model_partial_retention_matches_reference_over_kept_tokens(tmp_path):
    if not NQ_PATH.exists():
        pytest.skip(f"{NQ_PATH} not present")
    examples = load_nq(NQ_PATH, limit=10)
    docs, _ = build_documents(examples, 3, 3, "middle")
    eng = real_engine(tmp_path, kv_dtype="float32", encoding="isolated", link_k=3, shipped_links=False)
    kvs = [eng.encode(d) for d in docs]
    assert all(kv.importance is not None for kv in kvs)
    q_ids = eng.template.question_ids(eng.lm.tokenizer, examples[3].question)
    embeds = eng.link_tokens.embeds
    layered = LayeredDocuments.from_documents(kvs, retention=0.4)
    with torch.inference_mode():
        ctx = link(eng.lm, eng.prefix, layered, embeds, q_ids, anchored=False)
    pieces, pos = [Piece("prefix", torch.arange(eng.prefix.num_tokens), ids=eng.prefix.token_ids)], eng.prefix.num_tokens
    for kv, kept in zip(kvs, layered.positions):
        visible = torch.zeros(kv.num_tokens, dtype=torch.bool)
        visible[kept] = True
        pieces.append(Piece("document", torch.arange(pos, pos + kv.num_tokens), ids=kv.token_ids, visible=visible))
        pos += kv.num_tokens
        pieces.append(Piece("link", torch.arange(pos, pos + 3), embeds=embeds))
        pos += 3
    pieces.append(Piece("question", torch.arange(pos, pos + len(q_ids)), ids=q_ids))
    with torch.inference_mode():
        ref_logits, ref_k, ref_v, ref_pos = reference_forward(eng.lm, pieces)
    k, v = cache_tensors(ctx.cache)
    rk, rv = kv_by_position(ref_k, ref_v, ref_pos, ctx.storage_positions)
    logit_diff = (ctx.last_logits - ref_logits[-1]).abs().max().item()
    print(f"real model, r=0.4: max |logit diff| {logit_diff:.2e}, |k diff| {(k - rk).abs().max():.2e}, "
          f"|v diff| {(v - rv).abs().max():.2e}")
    assert logit_diff < 1e-4
    assert (k - rk).abs().max().item() < 1e-4 and (v - rv).abs().max().item() < 1e-4
