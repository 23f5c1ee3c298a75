"""Packed (ragged) forwards: every row equals its own batch-1 forward, whatever else is in the batch."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from factories import random_ids, tiny_model
from kvlink_rag.linking.kvcache import cache_tensors
from kvlink_rag.runtime.model_runner import forward_ragged
from kvlink_rag.runtime.ragged import KVChunk, RaggedBatch, SequenceKV


def reference(lm, prompt: torch.Tensor, new: torch.Tensor) -> tuple[torch.Tensor, tuple]:
    """Batch-1 causal forward of ``prompt`` then ``new``: logits after ``new`` and the prompt's KV."""
    out = lm.model(input_ids=prompt[None], position_ids=torch.arange(len(prompt))[None], cache=DynamicCache(),
                   use_cache=True)
    kv = cache_tensors(out.cache)
    pos = torch.arange(len(prompt), len(prompt) + len(new))
    out2 = lm.model(input_ids=new[None], position_ids=pos[None], cache=out.cache, use_cache=True)
    return out2.logits[0, -1].float(), kv


def sequence(lm, keys, values, split: int | None) -> SequenceKV:
    """The prompt's KV as a request sequence: all own, or a shared chunk (first ``split`` tokens) + own."""
    cfg = lm.config
    chunks = [KVChunk(keys[:, :, :split], values[:, :, :split])] if split else []
    seq = SequenceKV(chunks, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, torch.float32, "cpu", 4)
    start = split or 0
    seq.append(keys[:, :, start:], values[:, :, start:])
    return seq


@pytest.mark.parametrize("family", ["llama", "qwen3", "llama3", "mistral"])
@torch.inference_mode()
def test_each_row_of_a_packed_forward_equals_its_own_forward(family):
    lm = tiny_model(family)
    prompts = [random_ids(n, seed=n) for n in (9, 23, 14)]
    news = [random_ids(1, seed=1), random_ids(6, seed=2), random_ids(3, seed=3)]  # a decode row, two prefills
    splits = [None, 10, 5]  # the second and third rows read part of their KV from a shared chunk
    batch, embeds, positions, expected = RaggedBatch(), [], [], []
    for prompt, new, split in zip(prompts, news, splits):
        logits, (k, v) = reference(lm, prompt, new)
        expected.append(logits)
        seq = sequence(lm, k, v, split)
        batch.add(seq, len(new))
        embeds.append(lm.embed_tokens(new))
        positions.append(torch.arange(len(prompt), len(prompt) + len(new)))
    got = forward_ragged(lm, batch, torch.cat(embeds), torch.cat(positions))
    for g, e in zip(got, expected):
        assert (g - e).abs().max() < 1e-4
    assert [r.seq.num_tokens for r in batch.rows] == [10, 29, 17]  # the new tokens joined each sequence
    assert lm.model.config._attn_implementation == "sdpa"  # restored after the forward


@torch.inference_mode()
def test_an_explicit_mask_row_hides_what_its_mask_hides():
    lm = tiny_model("llama")
    prompt, new = random_ids(8, seed=5), random_ids(2, seed=6)
    _, (k, v) = reference(lm, prompt, new)
    mask = torch.zeros(2, 10)
    mask[:, 3:8] = torch.finfo(torch.float32).min  # the new tokens may not see prompt tokens 3..7
    mask[0, 9] = torch.finfo(torch.float32).min  # causal among the new tokens
    batch = RaggedBatch()
    batch.add(sequence(lm, k, v, None), 2, mask)
    got = forward_ragged(lm, batch, lm.embed_tokens(new), torch.arange(8, 10))
    keep = torch.tensor([0, 1, 2])  # the reference: the same positions without the hidden tokens
    ref = DynamicCache(ddp_cache_data=[(k[i][None][:, :, keep], v[i][None][:, :, keep]) for i in range(k.shape[0])])
    out = lm.model(input_ids=new[None], position_ids=torch.arange(8, 10)[None], cache=ref, use_cache=True)
    assert (got[0] - out.logits[0, -1]).abs().max() < 1e-4


@pytest.mark.parametrize("pieces", [1, 2])
@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.parametrize("kernel", [True, False])
def test_float32_queries_over_bfloat16_kv_attend_in_bfloat16_and_return_float32(pieces, n, kernel, monkeypatch):
    """Sequences of the bfloat16 formats hold bfloat16 KV (kv_dtype_of); their float32 queries attend as
    bfloat16 queries do over the same KV (one piece or several, decode or prefill) and come back float32 - but
    prefill rows on a CPU without native bfloat16 attention (``kernel`` False: no AVX512-BF16), which attend in
    float32 over the KV widened exactly to float32."""
    import kvlink_rag.runtime.ragged as ragged

    monkeypatch.setattr(ragged, "prefill_kernel", lambda: kernel)
    monkeypatch.setattr(ragged, "bf16_native", lambda: kernel)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(4, n, 8, generator=g)  # 4 heads over 2 kv heads
    kv = [(torch.randn(2, 5, 8, generator=g).bfloat16(), torch.randn(2, 5, 8, generator=g).bfloat16())
          for _ in range(pieces)]
    got = ragged.attend(q, kv, None, 8 ** -0.5)
    if n > 1 and not kernel:
        wide = [(torch.cat([k for k, _ in kv], 1).float(), torch.cat([v for _, v in kv], 1).float())]
        want = ragged.attend(q, wide, None, 8 ** -0.5)
    else:
        want = ragged.attend(q.bfloat16(), kv, None, 8 ** -0.5).float()
    assert got.dtype == torch.float32 and torch.equal(got, want)


def test_the_kv_dtype_follows_the_weight_format():
    from kvlink_rag.model.loader import kv_dtype_of

    assert kv_dtype_of("int4-bf16", torch.float32) == torch.bfloat16
    assert kv_dtype_of("bfloat16", torch.float32) == torch.bfloat16
    assert kv_dtype_of("native", torch.float32) == torch.float32  # the exactness reference
    assert kv_dtype_of("int4-f32", torch.float32) == torch.float32  # CPUs without native bfloat16
    assert kv_dtype_of("q4q8-f32", torch.float32) == torch.float32
    assert kv_dtype_of("q4q8-f32", torch.float32, "bfloat16") == torch.bfloat16  # the setting: half the KV bytes
    assert kv_dtype_of("q4q8-bf16", torch.float32, "float32") == torch.float32
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        kv_dtype_of("native", torch.float32, "int8")

    assert kv_dtype_of("native", torch.bfloat16) == torch.bfloat16


def test_the_causal_path_equals_the_causal_mask():
    """A row that opens its sequence takes the kernel's causal path: the same attention as its triangle mask."""
    from kvlink_rag.runtime.ragged import _causal_tail, attend

    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(4, 9, 8, generator=g), torch.randn(2, 9, 8, generator=g), torch.randn(2, 9, 8, generator=g)
    mask = _causal_tail(9, 9, torch.float32, "cpu")
    want = attend(q, [(k, v)], mask, 8 ** -0.5)
    assert torch.allclose(attend(q, [(k, v)], mask, 8 ** -0.5, causal=True), want, atol=1e-6)
    seq = SequenceKV([], 1, 2, 8, torch.float32, "cpu", 16)
    batch = RaggedBatch()
    assert batch.add(seq, 9).causal and not batch.add(SequenceKV([], 1, 2, 8, torch.float32, "cpu", 16), 1).causal
    seq.append(k[None], v[None])
    assert not RaggedBatch().add(seq, 3).causal  # keys before it: the mask's rectangle, not the kernel's triangle
