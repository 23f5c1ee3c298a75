"""Query-side LoRA: off for documents, on for link/question/answer tokens, never invalidating caches."""

from __future__ import annotations

import pytest
import torch

from factories import random_ids, randomise_lora, tiny_model, tiny_text_engine
from kvlink_rag.engine import Engine
from kvlink_rag.linking.document_prefill import encode_document, encode_prefix
from kvlink_rag.linking.kvcache import build_cache, cache_tensors
from kvlink_rag.linking.link_tokens import LinkTokens, load_link_tokens
from kvlink_rag.linking.linker import link
from kvlink_rag.model.lora import adapter_scope, add_lora, lora_state
from kvlink_rag.types import Document
from reference import Piece, reference_mask


def test_document_kv_is_bitwise_the_same_with_an_adapter_loaded_and_active():
    lm = tiny_model("qwen3")
    ids = random_ids(21, 0)
    prefix = encode_prefix(lm, random_ids(6, 1))
    before = encode_document(lm, ids, kv_dtype="float32", prefix=prefix)
    add_lora(lm, "a", rank=4, alpha=8)
    randomise_lora(lm, "a")
    with adapter_scope(lm, "a"):
        after = encode_document(lm, ids, kv_dtype="float32", prefix=encode_prefix(lm, random_ids(6, 1)))
        with torch.no_grad():  # the adapter really changes the model's forward when on
            on = lm.model(input_ids=ids[None]).logits
    with torch.no_grad():
        off = lm.model(input_ids=ids[None]).logits
    assert torch.equal(before.keys, after.keys) and torch.equal(before.values, after.values)
    assert (on - off).abs().max() > 1e-3


def test_linked_forward_with_adapter_matches_two_stage_reference():
    """Reference: transformers computes prefix+documents (adapter off) at their layout positions, then
    link and question tokens with the adapter on, under the KVLink mask."""
    lm = tiny_model("llama")
    add_lora(lm, "a", rank=4, alpha=8)
    randomise_lora(lm, "a", seed=3)
    prefix_ids, q_ids = random_ids(5, 1), random_ids(4, 2)
    docs_ids = [random_ids(n, 10 + n) for n in (9, 14)]
    k = 2
    embeds = torch.randn(k, lm.config.hidden_size, generator=torch.Generator().manual_seed(4)) * 0.02
    prefix = encode_prefix(lm, prefix_ids)
    kvs = [encode_document(lm, ids, kv_dtype="float32") for ids in docs_ids]
    with torch.no_grad(), adapter_scope(lm, "a"):
        ctx = link(lm, prefix, kvs, embeds, q_ids, anchored=False)

    # stage 1: prefix and documents with the adapter off, positions as in the layout
    pieces = [Piece("prefix", torch.arange(5), ids=prefix_ids)]
    pos, link_pos = 5, []
    for ids in docs_ids:
        pieces.append(Piece("document", torch.arange(pos, pos + len(ids)), ids=ids))
        pos += len(ids)
        link_pos.append(torch.arange(pos, pos + k))
        pos += k
    q_pos = torch.arange(pos, pos + len(q_ids))
    stage1 = pieces
    allowed1 = reference_mask(stage1)
    emb1 = torch.cat([lm.embed_tokens(p.ids) for p in stage1])[None]
    pos1 = torch.cat([p.positions for p in stage1])
    mask1 = torch.zeros(allowed1.shape).masked_fill(~allowed1, torch.finfo(torch.float32).min)
    with torch.no_grad(), adapter_scope(lm, None):
        out1 = lm.model(inputs_embeds=emb1, position_ids=pos1[None], attention_mask=mask1[None, None], use_cache=True)
    # stage 2: link tokens and question with the adapter on
    full = [pieces[0], pieces[1], Piece("link", link_pos[0], embeds=embeds), pieces[2],
            Piece("link", link_pos[1], embeds=embeds), Piece("question", q_pos, ids=q_ids)]
    allowed = reference_mask(full)
    seq_pos = torch.cat([p.positions for p in full])
    cached = torch.cat([p.positions for p in stage1])
    new = torch.cat([link_pos[0], link_pos[1], q_pos])
    order = torch.cat([cached, new])
    idx = torch.tensor([int((seq_pos == p).nonzero()) for p in order])
    rows = allowed[idx[len(cached):]][:, idx]
    mask2 = torch.zeros(rows.shape).masked_fill(~rows, torch.finfo(torch.float32).min)
    emb2 = torch.cat([embeds, embeds, lm.embed_tokens(q_ids)])[None]
    k1, v1 = cache_tensors(out1.cache)
    with torch.no_grad(), adapter_scope(lm, "a"):
        out2 = lm.model(inputs_embeds=emb2, position_ids=new[None], attention_mask=mask2[None, None],
                        cache=build_cache(list(k1), list(v1)), use_cache=True)
    assert (ctx.last_logits - out2.logits[0, -1]).abs().max().item() < 1e-4
    k_ours, _ = cache_tensors(ctx.cache)
    k_ref, _ = cache_tensors(out2.cache)
    assert (k_ours - k_ref).abs().max().item() < 1e-4


def test_cache_stored_before_training_is_served_unchanged_after(tmp_path):
    engine = tiny_text_engine(tmp_path)
    doc = Document("The lighthouse keeper's cat is named Biscuit.", "Lighthouse")
    kv, hit = engine.get_or_encode(doc)
    assert not hit
    # "train": a query-side adapter and new link tokens, saved as an artifact
    add_lora(engine.lm, "fresh", rank=4, alpha=8)
    randomise_lora(engine.lm, "fresh")
    art = LinkTokens(torch.randn(3, engine.lm.config.hidden_size), engine.lm.fingerprint, {"trained": True},
                     lora=lora_state(engine.lm, "fresh"), lora_config={"rank": 4, "alpha": 8,
                                                                        "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]})
    art.save(tmp_path / "a.safetensors")
    loaded = load_link_tokens(tmp_path / "a.safetensors", engine.lm)
    assert loaded.lora is not None and set(loaded.lora) == set(art.lora)
    trained = Engine(engine.settings.model_copy(update={"link_tokens_path": tmp_path / "a.safetensors"}),
                     lm=engine.lm, cache=engine.cache)
    assert trained.fingerprint == engine.fingerprint and trained.adapter is not None
    again, hit = trained.get_or_encode(doc)
    assert hit and again is kv
    with_adapter = trained.answer("What is the cat called?", [doc], max_new_tokens=4)
    without = engine.answer("What is the cat called?", [doc], max_new_tokens=4)
    assert with_adapter.cache_hits == 1 and without.cache_hits == 1


def test_runner_adapter_sets_the_runners_adapter_and_leaves_peft_layers_alone():
    """The scheduler's scope: ``lm.active_adapter`` for the block (restored after), no peft layer switched
    (their switch costs a decode step's time), an unknown adapter refused by name."""
    from kvlink_rag.model.lora import _tuner_layers, runner_adapter

    lm = tiny_model("llama")
    add_lora(lm, "a", rank=4, alpha=8)
    before = [(layer.active_adapters, layer.disable_adapters) for layer in _tuner_layers(lm)]
    with runner_adapter(lm, "a"):
        assert lm.active_adapter == "a"
        assert [(layer.active_adapters, layer.disable_adapters) for layer in _tuner_layers(lm)] == before
    assert lm.active_adapter is None
    with pytest.raises(KeyError, match="'b'"):
        with runner_adapter(lm, "b"):
            pass
