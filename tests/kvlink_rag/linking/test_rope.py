"""RoPE algebra on the model's own rotary tables."""

import pytest
import torch

from factories import tiny_model
from kvlink_rag.linking.rope import apply_rope, remove_rope, rope_cos_sin


def _x(n=37, d=64, seed=0):
    return torch.randn(2, 3, n, d, generator=torch.Generator().manual_seed(seed))  # [layers, kv_heads, tokens, hd]


@pytest.mark.parametrize("family", ["llama", "llama3", "qwen3"])
def test_rotating_by_a_then_b_equals_rotating_by_a_plus_b(family):
    rot = tiny_model(family).rotary_emb
    x = _x()
    a = torch.arange(37) * 3 + 5
    b = torch.full((37,), 1234)
    ca, sa = rope_cos_sin(rot, a)
    cb, sb = rope_cos_sin(rot, b)
    cab, sab = rope_cos_sin(rot, a + b)
    twice = apply_rope(apply_rope(x, ca, sa), cb, sb)
    once = apply_rope(x, cab, sab)
    # float32 angles at position ~1300 carry ~1e-4 rad of rounding (the model's own tables do too)
    assert (twice - once).abs().max().item() < 5e-4
    assert (apply_rope(x, ca, sa) - x).abs().max().item() > 0.1  # it does rotate


@pytest.mark.parametrize("family", ["llama", "llama3", "llama-yarn", "qwen2", "qwen3", "mistral"])
def test_remove_then_apply_is_identity(family):
    rot = tiny_model(family).rotary_emb
    x = _x(seed=1)
    pos = torch.tensor([0, 1, 7, 100, 2047] * 7 + [3, 4])
    cos, sin = rope_cos_sin(rot, pos)
    assert (apply_rope(remove_rope(x, cos, sin), cos, sin) - x).abs().max().item() < 1e-5
    assert (remove_rope(apply_rope(x, cos, sin), cos, sin) - x).abs().max().item() < 1e-5


def test_yarn_tables_carry_the_attention_scaling():
    rot = tiny_model("llama-yarn").rotary_emb
    cos, sin = rope_cos_sin(rot, torch.arange(5))
    scale = (cos * cos + sin * sin).sqrt()
    assert torch.allclose(scale, torch.full_like(scale, rot.attention_scaling), atol=1e-5)
    assert rot.attention_scaling > 1.0


def test_apply_rope_keeps_dtype():
    rot = tiny_model("llama").rotary_emb
    x = _x().to(torch.bfloat16)
    cos, sin = rope_cos_sin(rot, torch.arange(37))
    assert apply_rope(x, cos, sin).dtype == torch.bfloat16


def test_the_position_table_gives_the_modules_own_angles_bit_for_bit_and_grows():
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from kvlink_rag.linking import rope

    cfg = LlamaConfig(hidden_size=64, num_attention_heads=2, max_position_embeddings=32768,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    module = LlamaRotaryEmbedding(cfg)
    for pos in (torch.tensor([5, 0, 4095, 17]), torch.tensor([4096, 9000, 3]), torch.tensor([*range(0, 20000, 397), 19999])):
        cos, sin = rope.rope_cos_sin(module, pos, torch.bfloat16)
        ref_cos, ref_sin = module(torch.empty(1), pos.reshape(1, -1))
        assert torch.equal(cos, ref_cos[0].to(torch.bfloat16)) and torch.equal(sin, ref_sin[0].to(torch.bfloat16))
    assert rope._TABLES[module][0].shape[0] == 32768  # grown to the next power of two past 20,000 once
