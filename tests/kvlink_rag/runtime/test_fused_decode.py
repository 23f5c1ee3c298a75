"""The fused decode-layer halves (C++) against the runner's general path, on the same weights and KV."""

import pytest
import torch

from factories import random_ids, randomise_lora, tiny_model
from kvlink_rag.model.lora import add_lora
from kvlink_rag.runtime import fused_decode, q4q8
from kvlink_rag.runtime.linear import TokenSplit
from kvlink_rag.runtime.model_runner import ModelRunner
from kvlink_rag.runtime.ragged import RaggedBatch, SequenceKV

needs_kernel = pytest.mark.skipif(not q4q8.available(), reason="neither AVX2 nor AVX512-VNNI (or no compiler) on this CPU")


def _decode_two_rows(lm, runner: ModelRunner, adapter: str | None) -> torch.Tensor:
    """Prefill two rows (9 and 5 tokens), then 3 steps of both rows' decode tokens; the last step's logits."""
    cfg = lm.config
    seqs = [SequenceKV([], cfg.num_hidden_layers, cfg.num_key_value_heads, lm.head_dim, torch.float32) for _ in range(2)]
    prompts = [random_ids(9, seed=1), random_ids(5, seed=2)]
    for seq, ids in zip(seqs, prompts):
        batch = RaggedBatch()
        batch.add(seq, len(ids))
        runner.forward(batch, lm.embed_tokens(ids), torch.arange(len(ids)), adapter)
    for step in range(3):
        batch = RaggedBatch()
        for seq in seqs:
            batch.add(seq, 1)
        ids = random_ids(2, seed=10 + step)
        pos = torch.tensor([len(prompts[0]) + step, len(prompts[1]) + step])
        logits = runner.forward(batch, lm.embed_tokens(ids), pos, adapter)
    return logits


@needs_kernel
@pytest.mark.parametrize("family,adapter", [("llama", None), ("llama", "a"), ("qwen2", None)])
def test_fused_halves_decode_as_the_general_path(family, adapter, monkeypatch):
    """Two decode rows over their own KV for 3 steps, q4q8-f32: logits equal the general path's to float32
    rounding (the same operations in the same order; Qwen2 adds q/k/v biases, "a" a random LoRA adapter)."""
    lm = tiny_model(family, head_dim=64)
    if adapter:
        with torch.inference_mode(False):
            add_lora(lm, adapter, rank=4, alpha=8)
            randomise_lora(lm, adapter, seed=3)
    fused, general = ModelRunner(lm.model, "q4q8-f32"), ModelRunner(lm.model, "q4q8-f32")
    general.fused = False
    want = _decode_two_rows(lm, general, adapter)
    calls = []
    real = fused_decode.layer_pre
    monkeypatch.setattr(fused_decode, "layer_pre", lambda *a: calls.append(1) or real(*a))
    got = _decode_two_rows(lm, fused, adapter)
    assert len(calls) == 3 * lm.config.num_hidden_layers  # the three decode steps, not the prefills
    assert got.shape == want.shape == (2, lm.config.vocab_size)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


@needs_kernel
def test_fused_halves_only_where_they_fit():
    """Decode rows of q4q8-f32 fit; a prefill row in the step, float32 weights or a Qwen3 q/k norm do not."""
    lm = tiny_model("llama", head_dim=64)
    w = ModelRunner(lm.model, "q4q8-f32").weights
    h = torch.zeros(2, lm.config.hidden_size)
    assert fused_decode.fits(w, None, h, TokenSplit.of_rows([1, 1], "cpu"))
    assert not fused_decode.fits(w, None, torch.zeros(40, h.shape[1]), TokenSplit.of_rows([1, 39], "cpu"))
    assert not fused_decode.fits(ModelRunner(lm.model, "native").weights, None, h, TokenSplit.of_rows([1, 1], "cpu"))
    qwen3 = tiny_model("qwen3", head_dim=64)
    assert not fused_decode.fits(ModelRunner(qwen3.model, "q4q8-f32").weights, None, h, TokenSplit.of_rows([1, 1], "cpu"))


def _token_by_token(lm, runner: ModelRunner, dtype: torch.dtype, steps: int = 6) -> torch.Tensor:
    """Two rows over ``dtype`` KV, every step one token each (so every step is a decode step, no prefill
    GEMM in either format); embeddings rounded to bfloat16 and handed over in ``dtype``. The last logits."""
    cfg = lm.config
    seqs = [SequenceKV([], cfg.num_hidden_layers, cfg.num_key_value_heads, lm.head_dim, torch.bfloat16) for _ in range(2)]
    for step in range(steps):
        batch = RaggedBatch()
        for seq in seqs:
            batch.add(seq, 1)
        embeds = lm.embed_tokens(random_ids(2, seed=20 + step)).to(torch.bfloat16).to(dtype)
        logits = runner.forward(batch, embeds, torch.tensor([step, step]))
    return logits


@needs_kernel
def test_fused_halves_run_bf16_steps_in_float32():
    """q4q8-bf16 decode steps take the fused halves with a float32 residual stream: the same logits as
    q4q8-f32's general path over the same bfloat16 KV and embeddings (float32 rounding), and close to the
    bfloat16 general path they replace."""
    lm = tiny_model("llama", head_dim=64)
    fused = ModelRunner(lm.model, "q4q8-bf16")
    assert fused_decode.fits(fused.weights, None, torch.zeros(2, lm.config.hidden_size, dtype=torch.bfloat16),
                             TokenSplit.of_rows([1, 1], "cpu"))
    got = _token_by_token(lm, fused, torch.bfloat16)
    general32 = ModelRunner(lm.model, "q4q8-f32")
    general32.fused = False
    want = _token_by_token(lm, general32, torch.float32)
    assert got.dtype == torch.float32 and got.shape == (2, lm.config.vocab_size)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    general16 = ModelRunner(lm.model, "q4q8-bf16")
    general16.fused = False
    old = _token_by_token(lm, general16, torch.bfloat16)
    assert (got - old).abs().max() <= 5e-2 * old.abs().max()
