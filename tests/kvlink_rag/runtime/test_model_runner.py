"""The model runner against transformers' own forward: every family, RoPE scaling and LoRA adapter."""

from __future__ import annotations

import pytest
import torch

from factories import random_ids, randomise_lora, tiny_model
from kvlink_rag.model.lora import adapter_scope, add_lora
from kvlink_rag.runtime import q4q8
from kvlink_rag.runtime.model_runner import ModelRunner, forward_ragged, get_runner
from kvlink_rag.runtime.ragged import RaggedBatch, SequenceKV

FAMILIES = ["llama", "llama3", "llama-linear", "llama-yarn", "qwen2", "qwen3", "mistral"]


def _own_forward(lm, ids_list: list[torch.Tensor]) -> torch.Tensor:
    """Each prompt as one row of a packed forward from an empty KV: ``[rows, vocab]`` logits."""
    cfg = lm.config
    batch = RaggedBatch()
    for ids in ids_list:
        batch.add(SequenceKV([], cfg.num_hidden_layers, cfg.num_key_value_heads, lm.head_dim, torch.float32), len(ids))
    embeds = torch.cat([lm.embed_tokens(i) for i in ids_list])
    positions = torch.cat([torch.arange(len(i)) for i in ids_list])
    return forward_ragged(lm, batch, embeds, positions)


def _reference(lm, ids: torch.Tensor) -> torch.Tensor:
    return lm.model(input_ids=ids[None], position_ids=torch.arange(len(ids))[None]).logits[0, -1].float()


@pytest.mark.parametrize("family", FAMILIES)
@torch.inference_mode()
def test_packed_rows_equal_transformers_forward_for_every_family(family):
    lm = tiny_model(family)
    prompts = [random_ids(n, seed=n) for n in (11, 4, 17)]
    got = _own_forward(lm, prompts)
    for g, ids in zip(got, prompts):
        assert (g - _reference(lm, ids)).abs().max() < 1e-4


@pytest.mark.parametrize("targets", [("q_proj", "k_proj", "v_proj", "o_proj"),
                                     ("q_proj", "v_proj", "gate_proj", "up_proj", "down_proj")])
@torch.inference_mode()
def test_an_adapter_on_the_runner_equals_it_on_transformers(targets):
    lm = tiny_model("qwen3")
    add_lora(lm, "a", rank=4, alpha=8, targets=targets)
    randomise_lora(lm, "a")
    ids = random_ids(13, seed=3)
    with adapter_scope(lm, "a"):
        on_ref, on_got = _reference(lm, ids), _own_forward(lm, [ids])[0]
    off_got = _own_forward(lm, [ids])[0]
    assert (on_got - on_ref).abs().max() < 1e-4
    assert (off_got - _reference(lm, ids)).abs().max() < 1e-4
    assert (on_got - off_got).abs().max() > 1e-3  # the adapter really changes the forward


@torch.inference_mode()
def test_an_adapter_added_after_the_runner_was_built_is_seen():
    lm = tiny_model("llama")
    ids = random_ids(9, seed=1)
    _own_forward(lm, [ids])  # builds the runner
    add_lora(lm, "late", rank=4, alpha=8)
    randomise_lora(lm, "late", seed=2)
    with adapter_scope(lm, "late"):
        assert (_own_forward(lm, [ids])[0] - _reference(lm, ids)).abs().max() < 1e-4


def test_an_adapter_updated_in_place_after_a_forward_is_seen():
    """The runner's fused low-rank stacks are copies: an optimizer-style in-place update of an adapter's
    tensors (training) must rebuild them, never leave the runner on the old adapter."""
    lm = tiny_model("llama")
    add_lora(lm, "t", rank=4, alpha=8)
    randomise_lora(lm, "t", seed=3)
    ids = random_ids(7, seed=2)
    with adapter_scope(lm, "t"):
        before = _own_forward(lm, [ids])[0]
        with torch.no_grad():
            for n, p in lm.model.named_parameters():
                if ".t." in n:  # adapter t's LoRA A and B
                    p.mul_(1.5)
        after, want = _own_forward(lm, [ids])[0], _reference(lm, ids)
    assert (after - want).abs().max() < 1e-4 and (after - before).abs().max() > 1e-3


def test_native_weights_are_the_models_own_tensors_not_a_copy():
    lm = tiny_model("llama")
    runner = get_runner(lm)
    attn = lm.model.model.layers[0].self_attn
    fused = runner.weights.layers[0].qkv.weight
    start, end = fused.data_ptr(), fused.data_ptr() + fused.numel() * fused.element_size()
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
        assert start <= proj.weight.data_ptr() < end


@pytest.mark.parametrize("fmt,tol", [("bfloat16", 0.02), ("int8", 0.05), ("int4", 0.25), ("int4-bf16", 0.25),
                                     pytest.param("q4q8-bf16", 0.25, marks=pytest.mark.skipif(
                                         not q4q8.available(), reason="neither AVX2 nor AVX512-VNNI on this CPU"))])
@torch.inference_mode()
def test_compressed_weight_formats_stay_close_to_native(fmt, tol):
    lm = tiny_model("llama", head_dim=64)
    ids = random_ids(15, seed=4)
    native = _own_forward(lm, [ids])[0]
    cfg = lm.config
    batch = RaggedBatch()
    batch.add(SequenceKV([], cfg.num_hidden_layers, cfg.num_key_value_heads, lm.head_dim, torch.float32), len(ids))
    got = ModelRunner(lm.model, fmt).forward(batch, lm.embed_tokens(ids), torch.arange(len(ids)))[0]
    rel = (got - native).norm() / native.norm()
    assert 0 < rel < tol  # a different format (not silently native), within its rounding


def test_an_unknown_format_and_a_non_silu_model_are_refused():
    with pytest.raises(ValueError, match="unknown weight format"):
        ModelRunner(tiny_model("llama").model, "fp8")
    with pytest.raises(ValueError, match="hidden_act='gelu'"):
        ModelRunner(tiny_model("llama", hidden_act="gelu").model)


@torch.inference_mode()
def test_each_row_takes_its_own_format_whatever_its_batch_holds():
    """int4-bf16: a decode row (int4) packed with a long prefill row (bfloat16) gets the logits it gets
    alone, and so does the prefill row: a row's numerics never depend on its batch."""
    lm = tiny_model("llama")
    runner = ModelRunner(lm.model, "int4-bf16")
    cfg = lm.config

    def seq():
        return SequenceKV([], cfg.num_hidden_layers, cfg.num_key_value_heads, lm.head_dim, torch.float32)

    decode, prefill = random_ids(1, seed=7), random_ids(30, seed=8)

    def alone(ids):
        batch = RaggedBatch()
        batch.add(seq(), len(ids))
        return runner.forward(batch, lm.embed_tokens(ids), torch.arange(len(ids)))[0]

    batch = RaggedBatch()
    batch.add(seq(), 1)
    batch.add(seq(), 30)
    both = runner.forward(batch, lm.embed_tokens(torch.cat([decode, prefill])),
                          torch.cat([torch.arange(1), torch.arange(30)]))
    assert (both[0] - alone(decode)).abs().max() < 1e-5
    assert (both[1] - alone(prefill)).abs().max() < 1e-5


@torch.inference_mode()
def test_int4_f32_prefills_on_the_models_own_float32_weights_and_decodes_in_int4():
    """int4-f32 (CPUs without native bfloat16): a prefill row is exactly native (the same shared tensors, no
    copy), a decode row exactly int4's."""
    lm = tiny_model("llama", head_dim=64)
    cfg = lm.config
    runner = ModelRunner(lm.model, "int4-f32")
    fused = runner.weights.layers[0].qkv.large.weight
    assert fused.data_ptr() <= lm.model.model.layers[0].self_attn.q_proj.weight.data_ptr() < fused.data_ptr() + fused.nbytes

    def run(r, ids):
        batch = RaggedBatch()
        batch.add(SequenceKV([], cfg.num_hidden_layers, cfg.num_key_value_heads, lm.head_dim, torch.float32), len(ids))
        return r.forward(batch, lm.embed_tokens(ids), torch.arange(len(ids)))[0]

    prefill, decode = random_ids(15, seed=4), random_ids(1, seed=5)
    assert torch.equal(run(runner, prefill), run(ModelRunner(lm.model, "native"), prefill))
    assert torch.equal(run(runner, decode), run(ModelRunner(lm.model, "int4"), decode))
