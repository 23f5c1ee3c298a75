"""The model-family adapter: one family per supported model type, each naming its layout's modules."""

from __future__ import annotations

import pytest
from factories import tiny_config, tiny_model

from kvlink_rag.model.attention import attention_modules
from kvlink_rag.model.families import FAMILIES, MistralFamily, Qwen2Family, Qwen3Family, family_of
from kvlink_rag.model.family import ModelFamily
from kvlink_rag.model.support import SUPPORTED_MODEL_TYPES


def test_every_supported_model_type_has_one_registered_family():
    assert set(FAMILIES) == set(SUPPORTED_MODEL_TYPES) == {"llama", "qwen2", "qwen3", "mistral"}
    assert all(isinstance(f, ModelFamily) and t in f.model_types for t, f in FAMILIES.items())
    with pytest.raises(ValueError, match="model_type='gpt2' is not supported; supported: llama"):
        family_of(type("Config", (), {"model_type": "gpt2"})())


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "mistral"])
def test_a_family_names_every_module_of_its_layout(name):
    lm = tiny_model(name)
    fam = lm.family
    layers = fam.layers(lm.model)
    assert len(layers) == lm.num_layers and lm.decoder is lm.model.model
    assert lm.rotary_emb is lm.model.model.rotary_emb and fam.lm_head(lm.model) is lm.model.lm_head
    parts = fam.parts(layers[1])
    assert parts.v is layers[1].self_attn.v_proj and parts.down is layers[1].mlp.down_proj
    assert (parts.q_norm is not None) == (parts.k_norm is not None) == (name == "qwen3")
    assert attention_modules(lm) == [layer.self_attn for layer in layers]


def test_the_attention_kernel_switch_is_the_familys():
    lm = tiny_model("llama")
    fam = lm.family
    assert fam.attention_kernel(lm.config) == "sdpa"
    fam.set_attention_kernel(lm.config, "eager")
    assert fam.attention_kernel(lm.config) == "eager"
    fam.set_attention_kernel(lm.config, "sdpa")


def test_the_sliding_window_rule_differs_by_family():
    assert MistralFamily().windowed(tiny_config("mistral"))
    assert not Qwen2Family().windowed(tiny_config("qwen2"))  # no layer marked sliding
    assert Qwen3Family().windowed(tiny_config("qwen3", layer_types=["sliding_attention", "full_attention"]))
