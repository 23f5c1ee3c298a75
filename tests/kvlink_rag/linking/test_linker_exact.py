"""The linked cache against transformers' own forward under the KVLink masks (tiny random models)."""

from __future__ import annotations

import pytest
import torch

from factories import random_ids, tiny_model
from kvlink_rag.decoding.generate import SamplingParams, decode
from kvlink_rag.linking.document_prefill import encode_document, encode_prefix
from kvlink_rag.linking.kvcache import cache_tensors
from kvlink_rag.linking.linker import link
from reference import Piece, kv_by_position, reference_forward

FAMILIES = [("llama", 64), ("llama", 128), ("llama3", 64), ("llama-yarn", 64), ("llama-linear", 64), ("qwen2", 64),
            ("qwen3", 64), ("qwen3", 128), ("mistral", 64)]
TOL = 1e-4
DOC_LENS = (13, 29, 7)  # offsets that are multiples of nothing convenient
PREFIX_LEN, QUESTION_LEN = 11, 6


def _build(lm, k: int, anchored: bool, with_prefix: bool = True, doc_lens=DOC_LENS, slots: int = 0, joined=None):
    """Linked context and reference pieces for the same layout (``slots`` > 0: per-slot link tokens; ``joined``:
    no link tokens after those documents)."""
    prefix_ids = random_ids(PREFIX_LEN, 1)
    prefix = encode_prefix(lm, prefix_ids) if with_prefix else None
    docs_ids = [random_ids(n, 10 + i) for i, n in enumerate(doc_lens)]
    q_ids = random_ids(QUESTION_LEN, 99)
    docs = [encode_document(lm, ids, kv_dtype="float32", prefix=prefix if anchored else None) for ids in docs_ids]
    torch.manual_seed(5)
    shape = (slots, k, lm.config.hidden_size) if slots else (k, lm.config.hidden_size)
    link_embeds = torch.randn(shape) * 0.02 if k else None
    ctx = link(lm, prefix, docs, link_embeds, q_ids, anchored=anchored, joined=joined)

    pieces: list[Piece] = []
    pos = 0
    if with_prefix:
        pieces.append(Piece("prefix", torch.arange(PREFIX_LEN), ids=prefix_ids))
        pos = PREFIX_LEN
    for slot, ids in enumerate(docs_ids):
        n = len(ids)
        if anchored:  # the document sees its own copy of the prefix right before it, as when encoded
            pieces.append(Piece("prefix-copy", torch.arange(pos - PREFIX_LEN, pos), ids=prefix_ids,
                                owner=len(pieces) + 1))
        pieces.append(Piece("document", torch.arange(pos, pos + n), ids=ids))
        pos += n
        if k and not (joined and joined[slot]):
            embeds = link_embeds[min(slot, slots - 1)] if slots else link_embeds
            pieces.append(Piece("link", torch.arange(pos, pos + k), embeds=embeds))
            pos += k
    pieces.append(Piece("question", torch.arange(pos, pos + QUESTION_LEN), ids=q_ids))
    return ctx, pieces


def _assert_matches(lm, ctx, pieces):
    ref_logits, ref_k, ref_v, ref_pos = reference_forward(lm, pieces)
    keep = torch.tensor([p.kind != "prefix-copy" for p in pieces for _ in p.positions])
    ref_k, ref_v, ref_pos = ref_k[:, :, keep], ref_v[:, :, keep], ref_pos[keep]
    assert (ctx.last_logits - ref_logits[-1]).abs().max().item() < TOL
    k, v = cache_tensors(ctx.cache)
    assert k.shape == ref_k.shape
    rk, rv = kv_by_position(ref_k, ref_v, ref_pos, ctx.storage_positions)
    assert (k - rk).abs().max().item() < TOL, "keys differ"
    assert (v - rv).abs().max().item() < TOL, "values differ"


@pytest.mark.parametrize("family,head_dim", FAMILIES)
def test_single_document_at_offset_zero_matches_plain_forward(family, head_dim):
    lm = tiny_model(family, head_dim)
    ctx, pieces = _build(lm, k=0, anchored=False, with_prefix=False, doc_lens=(23,))
    assert ctx.segments[0].start == 0 and ctx.segments[0].kind == "document"
    _assert_matches(lm, ctx, pieces)


@pytest.mark.parametrize("family,head_dim", FAMILIES)
@pytest.mark.parametrize("anchored", [False, True], ids=["isolated", "anchored"])
def test_several_documents_k0_match_block_diagonal_reference(family, head_dim, anchored):
    lm = tiny_model(family, head_dim)
    ctx, pieces = _build(lm, k=0, anchored=anchored)
    _assert_matches(lm, ctx, pieces)


@pytest.mark.parametrize("family,head_dim", FAMILIES)
@pytest.mark.parametrize("anchored", [False, True], ids=["isolated", "anchored"])
def test_link_tokens_match_kvlink_mask_reference(family, head_dim, anchored):
    lm = tiny_model(family, head_dim)
    ctx, pieces = _build(lm, k=3, anchored=anchored)
    assert [s.kind for s in ctx.segments] == ["prefix"] + ["document", "link"] * 3 + ["question"]
    _assert_matches(lm, ctx, pieces)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("anchored", [False, True], ids=["isolated", "anchored"])
def test_per_slot_link_tokens_match_reference_and_the_last_slot_is_reused(family, anchored):
    lm = tiny_model(family)
    ctx, pieces = _build(lm, k=3, anchored=anchored, slots=2)  # 3 documents: the third reuses slot 2's
    _assert_matches(lm, ctx, pieces)
    shared, _ = _build(lm, k=3, anchored=anchored)
    assert not torch.allclose(ctx.last_logits, shared.last_logits)



@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("anchored", [False, True], ids=["isolated", "anchored"])
def test_joined_documents_sit_side_by_side_and_the_last_keeps_its_slots_link_tokens(family, anchored):
    """Chunks of one document joined (``chunk_links`` 'last'): no link tokens between them, the link tokens after
    the last are its own slot's (row 2 of 3), and the context is the KVLink mask reference of that layout."""
    lm = tiny_model(family)
    ctx, pieces = _build(lm, k=3, anchored=anchored, slots=3, joined=[True, True, False])
    assert [s.kind for s in ctx.segments] == ["prefix", "document", "document", "document", "link", "question"]
    assert [s.index for s in ctx.segments if s.kind == "link"] == [2]
    _assert_matches(lm, ctx, pieces)
    part, pieces = _build(lm, k=3, anchored=anchored, slots=3, joined=[True, False, False])
    assert [s.index for s in part.segments if s.kind == "link"] == [1, 2]
    _assert_matches(lm, part, pieces)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_decoding_after_link_matches_reference_with_answer_tokens(family):
    lm = tiny_model(family)
    ctx, pieces = _build(lm, k=2, anchored=True)
    out = list(decode(lm, ctx, SamplingParams(max_new_tokens=4)))
    assert len(out) == 4
    start = ctx.segments[-1].end
    pieces.append(Piece("answer", torch.arange(start, start + 3), ids=torch.tensor(out[:3])))
    ref_logits, *_ = reference_forward(lm, pieces)
    # greedy tokens 2..4 are the argmax of the reference logits at the answer positions
    assert ref_logits[-4:].argmax(-1).tolist() == out


def test_anchored_differs_from_isolated_on_later_layers():
    """Anchoring changes what the document KV is: a check that the setting is really applied."""
    lm = tiny_model("llama")
    prefix = encode_prefix(lm, random_ids(PREFIX_LEN, 1))
    ids = random_ids(17, 3)
    iso = encode_document(lm, ids, kv_dtype="float32")
    anc = encode_document(lm, ids, kv_dtype="float32", prefix=prefix)
    assert torch.allclose(iso.keys[0], anc.keys[0], atol=1e-5)  # layer 0 keys: projections of embeddings
    assert (iso.values[1] - anc.values[1]).abs().max() > 1e-3
    assert iso.fingerprint != anc.fingerprint
