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
