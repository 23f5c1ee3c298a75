"""Document-side artifacts on a tiny random model: a no-op adapter reproduces base linking exactly, a real one
changes the documents' KV under a fingerprint of its own, gradients reach the adapter through document
tokens, and serving refuses such artifacts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from factories import tiny_text_engine
from kvlink_rag.linking.link_tokens import LinkTokens, LinkTokensMismatch
from kvlink_rag.linking.linker import link
from kvlink_rag.model.lora import DEFAULT_TARGETS, adapter_scope, add_lora, lora_state, remove_lora
from kvlink_rag.reuse.doc_side import check_query_side, encode_with_adapter, is_doc_side
from kvlink_rag.types import Document

DOCS = [Document("The red fox lives in the old forest near the river.", "Fox"),
        Document("Paris is the capital of France and sits on the Seine.", "Paris")]


def _artifact(engine, doc_side: bool, b_scale: float, seed: int = 0) -> LinkTokens:
    """K=2 link tokens with a rank-4 LoRA whose B matrices are ``b_scale`` x random (0: a no-op adapter)."""
    torch.manual_seed(seed)
    add_lora(engine.lm, "scratch", rank=4, alpha=8)
    lora = {n: (torch.randn_like(w) * b_scale if "lora_B" in n else w.clone())
            for n, w in lora_state(engine.lm, "scratch").items()}
    remove_lora(engine.lm, "scratch")
    embeds = torch.randn(2, engine.lm.config.hidden_size) * 0.02
    return LinkTokens(embeds, engine.lm.fingerprint, {"trained": True, "doc_side": doc_side}, lora,
                      {"rank": 4, "alpha": 8, "targets": list(DEFAULT_TARGETS)})


def test_doc_side_with_zero_b_adapter_equals_base_linked(tmp_path):
    engine = tiny_text_engine(tmp_path)
    art = _artifact(engine, doc_side=True, b_scale=0.0)
    doc_side = engine.with_link_tokens(art)
    base = engine.with_link_tokens(LinkTokens(art.embeds, art.model_fingerprint, {}))
    assert is_doc_side(art) and doc_side.doc_adapter is not None and base.doc_adapter is None
    ctx_doc, _ = doc_side.link_context("Where does the fox live?", DOCS)
    ctx_base, _ = base.link_context("Where does the fox live?", DOCS)
    assert torch.allclose(ctx_doc.last_logits, ctx_base.last_logits, atol=1e-5, rtol=0)
    # own caches: another fingerprint, other keys, both kept side by side in the shared cache
    assert doc_side.fingerprint != base.fingerprint == engine.fingerprint
    assert doc_side.cache_key(DOCS[0]) != base.cache_key(DOCS[0])
    assert len(engine.cache) == 2 * len(DOCS)


def test_doc_side_adapter_changes_document_kv_and_the_key_follows_the_adapter(tmp_path):
    engine = tiny_text_engine(tmp_path)
    one = engine.with_link_tokens(_artifact(engine, doc_side=True, b_scale=0.5, seed=1))
    two = engine.with_link_tokens(_artifact(engine, doc_side=True, b_scale=0.5, seed=2))
    kv_base, kv_one = engine.encode(DOCS[0]), one.encode(DOCS[0])
    assert not torch.allclose(kv_base.keys.float(), kv_one.keys.float(), atol=1e-3)
    with torch.no_grad():  # the same as encoding by hand with the adapter on
        ref = encode_with_adapter(engine.lm, engine.document_ids(DOCS[0]), one.adapter, prefix=engine.prefix,
                                  kv_dtype=engine.settings.kv_dtype, fingerprint=one.fingerprint)
    assert torch.equal(ref.keys, kv_one.keys) and torch.equal(ref.values, kv_one.values)
    assert kv_one.fingerprint == one.fingerprint != two.fingerprint  # retraining invalidates the caches
    assert one.cache_key(DOCS[0]) != two.cache_key(DOCS[0])


def test_gradient_reaches_the_lora_through_document_tokens_only(tmp_path):
    engine = tiny_text_engine(tmp_path)
    lm = engine.lm
    add_lora(lm, "g", rank=4, alpha=8)  # B = 0: only B gets a gradient
    q = engine.template.question_ids(lm.tokenizer, "Where does the fox live?")
    with adapter_scope(lm, "g"):  # as the trainer does (peft keeps only the active adapter trainable)
        params = {n: p for n, p in lm.model.named_parameters() if ".g." in n}
        for p in params.values():
            p.requires_grad_(True)
        kvs = [encode_with_adapter(lm, engine.document_ids(d), "g", prefix=engine.prefix, kv_dtype="float32",
                                   fingerprint="t") for d in DOCS]
        with adapter_scope(lm, None):  # link tokens and question with the adapter off
            ctx = link(lm, engine.prefix, kvs, torch.zeros(2, lm.config.hidden_size), q, anchored=True,
                       logits_to_keep=3)
        F.cross_entropy(ctx.logits.float(), q[-3:]).backward()
    # every layer's k/v projections shape the documents' KV (the last layer's q/o do not)
    grads = {n: p.grad for n, p in params.items() if "lora_B" in n and ("k_proj" in n or "v_proj" in n)}
    assert len(grads) == 2 * lm.num_layers
    assert all(g is not None and float(g.abs().sum()) > 0 for g in grads.values())


def test_serving_refuses_a_doc_side_artifact(tmp_path):
    from kvlink_rag.engine import Engine

    engine = tiny_text_engine(tmp_path)
    art = _artifact(engine, doc_side=True, b_scale=0.1)
    check_query_side(_artifact(engine, doc_side=False, b_scale=0.1), "x")  # query-side: fine
    with pytest.raises(LinkTokensMismatch, match="document-side"):
        check_query_side(art, "adapter 'a'")
    art.save(tmp_path / "d.safetensors")
    settings = engine.settings.model_copy(update={"link_tokens_path": tmp_path / "d.safetensors"})
    with pytest.raises(LinkTokensMismatch, match="document-side"):
        Engine(settings, lm=engine.lm)


def test_batched_encode_equals_one_by_one(tmp_path):
    from kvlink_rag.reuse.doc_side import encode_batch_with_adapter

    engine = tiny_text_engine(tmp_path)
    art = engine.with_link_tokens(_artifact(engine, doc_side=True, b_scale=0.5))
    ids = [engine.document_ids(d) for d in DOCS] + [engine.document_ids(Document("Short.", None))]
    assert len({int(x.numel()) for x in ids}) == 3  # padding is exercised
    for prefix in (engine.prefix, None):
        with torch.no_grad():
            batched = encode_batch_with_adapter(engine.lm, ids, art.adapter, prefix=prefix, kv_dtype="float32",
                                                fingerprint="f")
            single = [encode_with_adapter(engine.lm, x, art.adapter, prefix=prefix, kv_dtype="float32",
                                          fingerprint="f") for x in ids]
        for a, b in zip(batched, single):
            assert a.keys.shape == b.keys.shape and a.encoding == b.encoding
            assert torch.allclose(a.keys, b.keys, atol=1e-5) and torch.allclose(a.values, b.values, atol=1e-5)


def test_named_adapter_registry_refuses_a_doc_side_artifact(tmp_path):
    from kvlink_rag.adapter_registry import AdapterVariants, adapter_path

    engine = tiny_text_engine(tmp_path)
    links = tmp_path / "links"
    _artifact(engine, doc_side=True, b_scale=0.1).save(adapter_path(links, "docs"))
    variants = AdapterVariants(engine, links)
    for call in (variants.check, variants.get):
        with pytest.raises(LinkTokensMismatch, match="adapter 'docs' is a document-side artifact"):
            call("docs")


def test_a_chunk_encoded_with_the_adapter_after_its_context_is_the_tail_of_both_as_one(tmp_path):
    from factories import random_ids, tiny_model

    lm = tiny_model("llama")
    ctx, ids = random_ids(7, seed=1), random_ids(11, seed=2)
    kw = dict(prefix=None, kv_dtype="float32", fingerprint="f")
    with torch.no_grad():
        joint = encode_with_adapter(lm, torch.cat([ctx, ids]), None, **kw)
        got = encode_with_adapter(lm, ids, None, context=ctx, **kw)
    assert got.token_ids.tolist() == ids.tolist()
    assert (got.keys - joint.keys[:, :, 7:]).abs().max() < 1e-4
    assert (got.values - joint.values[:, :, 7:]).abs().max() < 1e-4
