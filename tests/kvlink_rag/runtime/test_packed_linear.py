"""bfloat16 weights packed once for oneDNN: the same outputs as F.linear, bit for bit, at any row count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from factories import random_ids, tiny_model
from kvlink_rag.runtime import packed_linear
from kvlink_rag.runtime.linear import DenseLinear, SplitLinear, bfloat16_linear
from kvlink_rag.runtime.model_runner import ModelRunner
from kvlink_rag.runtime.packed_linear import PackedLinear, packing_available
from kvlink_rag.runtime.ragged import RaggedBatch, SequenceKV

needs_packing = pytest.mark.skipif(not packing_available(torch.zeros(1, 1, dtype=torch.bfloat16)),
                                   reason="no oneDNN bfloat16 linear on this CPU")


def _weights(out: int, inp: int, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, inp, generator=g).bfloat16()
    return w, (torch.randn(out, generator=g).bfloat16() if bias else None)


@needs_packing
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.inference_mode()
def test_packed_linear_equals_f_linear_bit_for_bit_at_every_row_count(bias, dtype):
    w, b = _weights(96, 80, bias)
    packed = PackedLinear(w, b)
    x = torch.randn(300, 80, generator=torch.Generator().manual_seed(1)).to(dtype)
    for rows in (1, 2, 5, 22, 63, 64, 65, 100, 257, 300):
        want = F.linear(x[:rows].bfloat16(), w, b).to(dtype)  # what DenseLinear computes
        got = packed(x[:rows])
        assert got.dtype == dtype and got.shape == (rows, 96)
        assert torch.equal(got, want)
        assert torch.equal(got[:1], packed(x[:1]))  # a row's output never depends on its batch


@needs_packing
@torch.inference_mode()
def test_packed_linear_takes_non_contiguous_activations():
    w, _ = _weights(64, 48, False)
    x = torch.randn(48, 20).t()  # [20, 48], not contiguous
    assert torch.equal(PackedLinear(w)(x), F.linear(x.bfloat16(), w).float())


def test_packing_refuses_what_onednn_cannot_pack():
    w = torch.randn(8, 8)
    assert not packing_available(w)  # float32
    with pytest.raises(ValueError, match="bfloat16 CPU weight"):
        PackedLinear(w)
    assert isinstance(bfloat16_linear(w, None, pack=False), DenseLinear)


@needs_packing
@torch.inference_mode()
def test_bfloat16_runner_gives_the_same_logits_packed_or_not(monkeypatch):
    """The runner's bfloat16 format packs its layers' weights; its logits equal the unpacked runner's exactly."""
    lm = tiny_model("qwen2", head_dim=64)  # Qwen2: q/k/v biases travel packed too
    cfg = lm.config
    packed = ModelRunner(lm.model, "bfloat16")
    assert isinstance(packed.weights.layers[0].qkv, PackedLinear)
    monkeypatch.setattr(packed_linear, "packing_available", lambda w: False)
    dense = ModelRunner(lm.model, "bfloat16")
    assert isinstance(dense.weights.layers[0].qkv, DenseLinear)

    def run(runner, ids):
        batch = RaggedBatch()
        batch.add(SequenceKV([], cfg.num_hidden_layers, cfg.num_key_value_heads, lm.head_dim, torch.float32), len(ids))
        return runner.forward(batch, lm.embed_tokens(ids), torch.arange(len(ids)))[0]

    for n in (1, 9, 40):
        ids = random_ids(n, seed=n)
        assert torch.equal(run(packed, ids), run(dense, ids))


@needs_packing
def test_q4q8_prefill_rows_pack_and_the_rescored_head_keeps_its_plain_weight():
    from kvlink_rag.runtime import q4q8

    if not q4q8.available():
        pytest.skip("neither AVX2 nor AVX512-VNNI on this CPU")
    lm = tiny_model("llama", head_dim=64)
    w = ModelRunner(lm.model, "q4q8-bf16").weights
    assert isinstance(w.layers[0].gate_up, SplitLinear) and isinstance(w.layers[0].gate_up.large, PackedLinear)
    assert isinstance(w.lm_head.small.exact, DenseLinear)  # candidate rows are read from its weight
