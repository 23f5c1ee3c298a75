"""The one-request engine applies its query-side adapter the same whether the runner alone runs (no peft layers
switched) or transformers does (peft switched: explain's attention capture)."""

from __future__ import annotations

import torch

from factories import randomise_lora, real_engine, tiny_text_engine
from kvlink_rag.model.attention import capture_attention
from kvlink_rag.model.lora import add_lora
from kvlink_rag.types import Document

DOCS = [Document(f"Document {i} says the code word is kiwi{i}.", f"T{i}") for i in range(3)]


def test_the_adapter_applies_on_the_runner_as_through_peft(tmp_path):
    engine = tiny_text_engine(tmp_path, kv_dtype="float32")
    lm = engine.lm
    add_lora(lm, "q")
    randomise_lora(lm, "q", seed=3)
    engine.adapter = "q"
    runner_ctx, _ = engine.link_context("what is the code word?", DOCS)
    with capture_attention(lm, lambda layer, weights: None):  # transformers' forward, peft layers switched on
        peft_ctx, _ = engine.link_context("what is the code word?", DOCS)
    engine.adapter = None
    base_ctx, _ = engine.link_context("what is the code word?", DOCS)
    assert (runner_ctx.last_logits - peft_ctx.last_logits).abs().max() < 1e-4
    assert (runner_ctx.last_logits - base_ctx.last_logits).abs().max() > 1e-3  # the adapter really did something
    full_runner = engine.full_context("what is the code word?", DOCS).last_logits
    engine.adapter = "q"
    assert not torch.equal(engine.full_context("what is the code word?", DOCS).last_logits, full_runner)


def test_the_engine_merges_its_adapter_into_the_prefill_weights_when_built(tmp_path, monkeypatch):
    """The query-side adapter's merged prefill weights are built with the engine, not in the first linked query
    (0.30 s to the first token against 0.05 s after, on an AMX Xeon): prepare() merged every term that merges."""
    from kvlink_rag.runtime import model_runner

    calls = []
    real = model_runner.ModelRunner.prepare
    monkeypatch.setattr(model_runner.ModelRunner, "prepare", lambda self, a: calls.append(a) or real(self, a))
    engine = real_engine(tmp_path)
    assert engine.adapter is not None and calls[-1] == engine.adapter
    terms = model_runner.get_runner(engine.lm)._adapters[engine.adapter]
    merging = [t for layer in terms for t in layer.present()
               if t.modules is not None and t.gemm_dtype == torch.bfloat16]
    if engine.lm.weight_format in ("q4q8-bf16", "int4-bf16", "bfloat16"):  # the formats whose prefill rows merge
        assert len(merging) == 4 * engine.lm.num_layers
    assert all(t._merged is not None for t in merging)  # built before any query
