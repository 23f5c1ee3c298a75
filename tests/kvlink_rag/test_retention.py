"""Token importance and retention: scores, keep order, and the partly retained linked cache against
transformers' own forward over the kept tokens at their positions (tiny random models, float32)."""

from __future__ import annotations

import pytest
import torch

from factories import random_ids, tiny_model
from kvlink_rag.linking.document_prefill import encode_document, encode_prefix
from kvlink_rag.linking.kvcache import cache_tensors
from kvlink_rag.linking.linker import link
from kvlink_rag.retention import (SINK_TOKENS, check_retention, kept_count, kept_positions, retention_order)
from kvlink_rag.types import LayeredDocuments
from reference import Piece, kv_by_position, reference_forward

TOL = 1e-4
DOC_LENS = (13, 29, 7)
PREFIX_LEN, QUESTION_LEN, K = 11, 6, 3


def _encode_all(lm, anchored: bool):
    prefix_ids = random_ids(PREFIX_LEN, 1)
    prefix = encode_prefix(lm, prefix_ids)
    docs_ids = [random_ids(n, 10 + i) for i, n in enumerate(DOC_LENS)]
    docs = [encode_document(lm, ids, kv_dtype="float32", prefix=prefix if anchored else None, importance=True)
            for ids in docs_ids]
    return prefix_ids, prefix, docs_ids, docs


def _reference_pieces(prefix_ids, docs_ids, kept, link_embeds, q_ids, anchored: bool) -> list[Piece]:
    pieces = [Piece("prefix", torch.arange(PREFIX_LEN), ids=prefix_ids)]
    pos = PREFIX_LEN
    for ids, keep in zip(docs_ids, kept):
        n = len(ids)
        if anchored:
            pieces.append(Piece("prefix-copy", torch.arange(pos - PREFIX_LEN, pos), ids=prefix_ids,
                                owner=len(pieces) + 1))
        visible = torch.zeros(n, dtype=torch.bool)
        visible[keep] = True
        pieces.append(Piece("document", torch.arange(pos, pos + n), ids=ids, visible=visible))
        pos += n
        pieces.append(Piece("link", torch.arange(pos, pos + K), embeds=link_embeds))
        pos += K
    pieces.append(Piece("question", torch.arange(pos, pos + QUESTION_LEN), ids=q_ids))
    return pieces


def test_importance_is_attention_received_from_later_tokens_and_kv_unchanged():
    lm = tiny_model("llama")
    ids = random_ids(17, 3)
    plain = encode_document(lm, ids, kv_dtype="float32")
    scored = encode_document(lm, ids, kv_dtype="float32", importance=True)
    assert plain.importance is None and scored.importance.shape == (17,)
    assert (plain.keys - scored.keys).abs().max() < 1e-5 and (plain.values - scored.values).abs().max() < 1e-5
    lm.model.config._attn_implementation = "eager"
    try:
        out = lm.model.model(input_ids=ids[None], output_attentions=True)
    finally:
        lm.model.config._attn_implementation = "sdpa"
    w = torch.stack([a[0].sum(0) for a in out.attentions]).sum(0)  # [q, k], heads and layers summed
    expected = w.sum(0) - w.diagonal()
    assert torch.allclose(scored.importance, expected, atol=1e-5)
    assert scored.importance[-1] == 0  # the last token has no later token
    assert lm.model.config._attn_implementation == "sdpa"  # the capture restored the kernel


def test_retention_order_keeps_sinks_then_alternates_recent_and_heavy_hitters():
    imp = torch.tensor([0.0, 0.1, 0.0, 0.0, 0.5, 3.0, 0.2, 3.0, 1.0, 0.0, 0.0, 2.0])
    order = retention_order(imp, 12)
    assert order[:SINK_TOKENS].tolist() == [0, 1, 2, 3]
    # recent 11, heavy 5 (ties by position), recent 10, heavy 7, recent 9, heavy 8 (11 taken), recent 8 taken -> 6
    assert order[SINK_TOKENS:].tolist() == [11, 5, 10, 7, 9, 8, 6, 4]
    assert sorted(order.tolist()) == list(range(12))
    assert retention_order(None, 5).tolist() == [0, 1, 2, 3, 4]
    assert kept_positions(imp, 12, 0.5).tolist() == [0, 1, 2, 3, 5, 11]
    assert kept_positions(imp, 12, 0.25, "recency").tolist() == [9, 10, 11]
    assert kept_count(9, 0.01) == 1 and kept_count(9, 1.0) == 9 and kept_count(10, 0.4) == 4
    assert sorted(kept_positions(imp, 12, 0.5, "random").tolist()) == kept_positions(imp, 12, 0.5, "random").tolist()


@pytest.mark.parametrize("bad", [0, -0.1, 1.01, float("nan"), "x"])
def test_retention_outside_range_is_refused(bad):
    with pytest.raises(ValueError, match="retention"):
        check_retention(bad)


@pytest.mark.parametrize("family", ["llama", "qwen3", "llama-yarn"])
@pytest.mark.parametrize("anchored", [False, True], ids=["isolated", "anchored"])
def test_partial_retention_matches_reference_over_kept_tokens(family, anchored):
    lm = tiny_model(family)
    prefix_ids, prefix, docs_ids, docs = _encode_all(lm, anchored)
    torch.manual_seed(5)
    link_embeds = torch.randn(K, lm.config.hidden_size) * 0.02
    q_ids = random_ids(QUESTION_LEN, 99)
    layered = LayeredDocuments.from_documents(docs, retention=0.5)
    kept = layered.positions
    assert [int(p.numel()) for p in kept] == [7, 15, 4]
    ctx = link(lm, prefix, layered, link_embeds, q_ids, anchored=anchored)
    assert ctx.segments[-1].end == PREFIX_LEN + sum(DOC_LENS) + 3 * K + QUESTION_LEN  # gaps keep their positions

    pieces = _reference_pieces(prefix_ids, docs_ids, kept, link_embeds, q_ids, anchored)
    ref_logits, ref_k, ref_v, ref_pos = reference_forward(lm, pieces)
    assert (ctx.last_logits - ref_logits[-1]).abs().max().item() < TOL
    k, v = cache_tensors(ctx.cache)
    assert k.shape[2] == PREFIX_LEN + sum(int(p.numel()) for p in kept) + 3 * K + QUESTION_LEN
    keep = torch.tensor([p.kind != "prefix-copy" for p in pieces for _ in p.positions])
    rk, rv = kv_by_position(ref_k[:, :, keep], ref_v[:, :, keep], ref_pos[keep], ctx.storage_positions)
    assert (k - rk).abs().max().item() < TOL and (v - rv).abs().max().item() < TOL


def test_full_retention_is_exactly_todays_output():
    lm = tiny_model("llama")
    prefix_ids, prefix, docs_ids, docs = _encode_all(lm, True)
    q_ids = random_ids(QUESTION_LEN, 99)
    embeds = torch.randn(K, lm.config.hidden_size) * 0.02
    today = link(lm, prefix, docs, embeds, q_ids, anchored=True)
    full = link(lm, prefix, LayeredDocuments.from_documents(docs, retention=1.0), embeds, q_ids, anchored=True)
    assert torch.equal(today.last_logits, full.last_logits)
    assert torch.equal(today.storage_positions, full.storage_positions)
    partial = link(lm, prefix, LayeredDocuments.from_documents(docs, retention=0.5), embeds, q_ids, anchored=True)
    assert not torch.allclose(today.last_logits, partial.last_logits)


def test_overlapping_captures_in_two_threads_count_only_their_own_forwards():
    import threading

    from kvlink_rag.model.attention import capture_attention

    lm = tiny_model("llama")
    ids = random_ids(9, 4)
    seen = {"main": 0, "other": 0}
    inside, release = threading.Event(), threading.Event()

    def other():
        with capture_attention(lm, lambda layer, w: seen.__setitem__("other", seen["other"] + 1)):
            inside.set()
            release.wait(5)
            lm.model.model(input_ids=ids[None])

    t = threading.Thread(target=other)
    t.start()
    inside.wait(5)
    with capture_attention(lm, lambda layer, w: seen.__setitem__("main", seen["main"] + 1)):
        lm.model.model(input_ids=ids[None])
    assert lm.model.config._attn_implementation == "eager"  # the other capture is still open
    release.set()
    t.join()
    assert seen == {"main": lm.num_layers, "other": lm.num_layers}
    assert lm.model.config._attn_implementation == "sdpa"  # restored by the last capture to close


def test_the_fraction_checks_import_no_torch():
    """The CLI checks --retention and --recompute-ratio before loading anything: kvlink_rag.bounds stays torch-free."""
    import subprocess
    import sys

    code = ("import sys; from kvlink_rag.bounds import check_recompute_ratio, check_retention; "
            "check_retention(0.5); check_recompute_ratio(0.0); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
