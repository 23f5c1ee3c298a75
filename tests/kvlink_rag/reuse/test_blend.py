"""CacheBlend prefill against the linker (ratio 0), full prefill (ratio 1) and a transformers reference of the
token selection (tiny random models, float32)."""

from __future__ import annotations

import pytest
import torch

from factories import random_ids, tiny_model
from kvlink_rag.decoding.generate import SamplingParams, decode, full_prefill
from kvlink_rag.linking.document_prefill import encode_document, encode_prefix
from kvlink_rag.linking.kvcache import cache_tensors
from kvlink_rag.linking.linker import link
from kvlink_rag.reuse.blend import blend, check_recompute_ratio, kv_deviation, recompute_count
from kvlink_rag.types import LayeredDocuments
from reference import Piece, kv_by_position, reference_forward

TOL = 1e-4
DOC_LENS = (13, 29, 7)
PREFIX_LEN, QUESTION_LEN, K = 11, 6, 3
FAMILIES = [("llama", 64), ("qwen3", 64), ("llama-yarn", 64)]


def _inputs(lm, anchored: bool = False, k: int = 0):
    prefix_ids = random_ids(PREFIX_LEN, 1)
    prefix = encode_prefix(lm, prefix_ids)
    doc_ids = [random_ids(n, 10 + i) for i, n in enumerate(DOC_LENS)]
    docs = [encode_document(lm, ids, kv_dtype="float32", prefix=prefix if anchored else None) for ids in doc_ids]
    torch.manual_seed(5)
    links = torch.randn(k, lm.config.hidden_size) * 0.02 if k else None
    return prefix_ids, prefix, doc_ids, docs, links, random_ids(QUESTION_LEN, 99)


def _assert_same(ctx, ref):
    assert (ctx.last_logits - ref.last_logits).abs().max().item() < TOL
    k, v = cache_tensors(ctx.cache)
    rk, rv = cache_tensors(ref.cache)
    rk, rv = kv_by_position(rk, rv, ref.storage_positions, ctx.storage_positions)
    assert (k - rk).abs().max().item() < TOL and (v - rv).abs().max().item() < TOL


@pytest.mark.parametrize("family,head_dim", FAMILIES)
@pytest.mark.parametrize("k", [0, K], ids=["naive", "linked"])
def test_ratio_zero_is_the_linker(family, head_dim, k):
    lm = tiny_model(family, head_dim, num_hidden_layers=3)
    _, prefix, doc_ids, docs, links, q = _inputs(lm, anchored=True, k=k)
    ctx = blend(lm, prefix, docs, doc_ids, links, q, recompute_ratio=0.0)
    ref = link(lm, prefix, docs, links, q, anchored=True)
    assert torch.equal(ctx.storage_positions, ref.storage_positions)
    assert ctx.segments == ref.segments
    _assert_same(ctx, ref)


@pytest.mark.parametrize("family,head_dim", FAMILIES)
def test_ratio_one_is_full_prefill(family, head_dim):
    lm = tiny_model(family, head_dim, num_hidden_layers=3)
    prefix_ids, prefix, doc_ids, docs, _, q = _inputs(lm)
    ctx = blend(lm, prefix, docs, doc_ids, None, q, recompute_ratio=1.0, new_tokens=1)
    ref = full_prefill(lm, torch.cat([prefix_ids, *doc_ids, q]))
    _assert_same(ctx, ref)
    params = SamplingParams(max_new_tokens=5)
    assert list(decode(lm, ctx, params)) == list(decode(lm, ref, params))


def test_ratio_one_with_link_tokens_is_the_causal_forward():
    lm = tiny_model("llama", 64, num_hidden_layers=3)
    prefix_ids, prefix, doc_ids, docs, links, q = _inputs(lm, k=K)
    ctx = blend(lm, prefix, docs, doc_ids, links, q, recompute_ratio=1.0)
    pieces, pos = [Piece("prefix", torch.arange(PREFIX_LEN), ids=prefix_ids)], PREFIX_LEN
    for ids in doc_ids:  # kind 'question': causal over everything before, as a full prefill
        pieces.append(Piece("question", torch.arange(pos, pos + len(ids)), ids=ids))
        pieces.append(Piece("link", torch.arange(pos + len(ids), pos + len(ids) + K), embeds=links))
        pos += len(ids) + K
    pieces.append(Piece("question", torch.arange(pos, pos + QUESTION_LEN), ids=q))
    logits, rk, rv, rpos = reference_forward(lm, pieces)
    assert (ctx.last_logits - logits[-1]).abs().max().item() < TOL
    k, v = cache_tensors(ctx.cache)
    rk, rv = kv_by_position(rk, rv, rpos, ctx.storage_positions)
    assert (k - rk).abs().max().item() < TOL and (v - rv).abs().max().item() < TOL


def _reference_selection(lm, prefix_ids, doc_ids, docs, ratio):
    """Top-deviation document tokens from transformers' own full forward: layer-1 values of the joined
    context against the stored (isolated) values, squared L2 over heads and channels."""
    ids = torch.cat([prefix_ids, *doc_ids])
    out = lm.model(input_ids=ids[None], use_cache=True)
    _, fresh_v = cache_tensors(out.cache)
    fresh = fresh_v[1][:, PREFIX_LEN:]  # [kv_heads, doc_tokens, head_dim]
    reused = torch.cat([d.values[1] for d in docs], dim=1)
    dev = ((fresh - reused) ** 2).sum(dim=(0, 2))
    n = recompute_count(dev.numel(), ratio)
    return set(torch.topk(dev, n).indices.tolist()), dev


@pytest.mark.parametrize("ratio", [0.15, 0.3])
def test_recomputes_the_tokens_that_deviate_most(ratio):
    lm = tiny_model("llama", 64, num_hidden_layers=3)
    prefix_ids, prefix, doc_ids, docs, _, q = _inputs(lm)
    want, dev = _reference_selection(lm, prefix_ids, doc_ids, docs, ratio)
    ctx = blend(lm, prefix, docs, doc_ids, None, q, recompute_ratio=ratio)
    naive = link(lm, prefix, docs, None, q, anchored=False)
    k, v = cache_tensors(ctx.cache)
    nk, nv = cache_tensors(naive.cache)
    doc_slots = torch.arange(PREFIX_LEN, PREFIX_LEN + sum(DOC_LENS))
    # a recomputed token's value at layer >= 1 differs from the reused one; the others keep it exactly
    changed = (v[1:, :, doc_slots] - nv[1:, :, doc_slots]).abs().amax(dim=(0, 1, 3)) > 1e-6
    got = set(torch.nonzero(changed).flatten().tolist())
    assert len(got) == recompute_count(sum(DOC_LENS), ratio) > 0
    assert got == want, (sorted(got), sorted(want), dev)
    unchanged = doc_slots[~changed]
    assert torch.equal(k[:, :, unchanged], nk[:, :, unchanged]) and torch.equal(v[:, :, unchanged], nv[:, :, unchanged])


def test_partly_retained_documents_blend():
    lm = tiny_model("llama", 64, num_hidden_layers=3)
    _, prefix, doc_ids, docs, _, q = _inputs(lm)
    kept = LayeredDocuments.from_documents(docs, retention=0.5)
    ctx = blend(lm, prefix, kept, doc_ids, None, q, recompute_ratio=0.3)
    streamed = sum(kept.num_tokens)
    assert ctx.storage_positions.numel() == PREFIX_LEN + streamed + QUESTION_LEN
    assert torch.isfinite(ctx.last_logits).all()


def test_ratio_checks():
    assert check_recompute_ratio(0) == 0.0 and check_recompute_ratio("0.15") == 0.15
    for bad in (-0.1, 1.5, float("nan"), "x"):
        with pytest.raises(ValueError, match="recompute_ratio"):
            check_recompute_ratio(bad)
    assert recompute_count(100, 0.15) == 15 and recompute_count(7, 1.0) == 7 and recompute_count(7, 0.1) == 0
    assert kv_deviation(torch.zeros(2, 3, 4), torch.ones(2, 3, 4)).tolist() == [8.0, 8.0, 8.0]


def test_rejects_ids_that_do_not_match_the_caches():
    lm = tiny_model("llama", 64)
    _, prefix, doc_ids, docs, _, q = _inputs(lm)
    with pytest.raises(ValueError, match="doc_ids"):
        blend(lm, prefix, docs, doc_ids[:2] + [doc_ids[2][:3]], None, q, recompute_ratio=0.5)
    with pytest.raises(ValueError, match="recompute_ratio"):
        blend(lm, prefix, docs, doc_ids, None, q, recompute_ratio=2)


def test_engine_link_path_at_ratio_one_is_the_full_prefill_and_checks_the_ratio(tmp_path):
    from factories import tiny_text_engine
    from kvlink_rag.types import Document

    eng = tiny_text_engine(tmp_path, link_k=0)
    docs = [Document("The lighthouse keeper was Agnes."), Document("Paris is in France.", "Paris")]
    ctx, _ = eng.link_context("Who kept the light?", docs, recompute_ratio=1.0)
    ref = eng.full_context("Who kept the light?", docs)
    assert (ctx.last_logits - ref.last_logits).abs().max().item() < TOL
    with pytest.raises(ValueError, match="recompute_ratio"):
        eng.link_context("Who kept the light?", docs, recompute_ratio=-0.5)
