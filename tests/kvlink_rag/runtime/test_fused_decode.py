"""The fused decode-layer halves (C++) against the runner's general path, on the same weights and KV."""

import pytest
import torch

from factories import random_ids, randomise_lora, tiny_model
from kvlink_rag.model.lora import add_lora
from kvlink_rag.runtime import fused_decode, q4q8
from kvlink_rag.runtime.model_runner import ModelRunner
from kvlink_rag.runtime.ragged import KVChunk, RaggedBatch, SequenceKV

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
@pytest.mark.parametrize("threads", [1, 2])
def test_fused_halves_with_lora_equal_the_general_path_bit_for_bit(threads):
    """With a LoRA adapter, at one thread (and two) explicitly: the fused halves' logits are the general path's
    exactly. Equal to float32 rounding is not enough: each Q4 x Q8 product quantises its input to int8, so an
    input one ulp apart can round to another integer (x / dx = -59.5000038 against -59.4999886 here) and the
    logits apart by a bfloat16 step. At one thread the general path's LoRA GEMMs (another summation order than
    the fused loops) and g++'s FMA in the fused RoPE did that: 0.0078 apart where the suite's 2 threads passed."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        lm = tiny_model("llama", head_dim=64)
        with torch.inference_mode(False):
            add_lora(lm, "a", rank=4, alpha=8)
            randomise_lora(lm, "a", seed=3)
        general = ModelRunner(lm.model, "q4q8-f32")
        general.fused = False
        want = _decode_two_rows(lm, general, "a")
        got = _decode_two_rows(lm, ModelRunner(lm.model, "q4q8-f32"), "a")
    finally:
        torch.set_num_threads(before)
    assert torch.equal(got, want)


@needs_kernel
def test_lora_terms_of_decode_rows_take_the_kernel_whatever_the_batch():
    """FusedLowRank.add_to: a decode row's terms are the fused halves' kernel's (lowrank_add) alone, in a
    batch of decode rows or beside a prefill row; a prefill row's the two GEMMs', as before."""
    from kvlink_rag.runtime.cpu_kernels import kernels
    from kvlink_rag.runtime.linear import TokenSplit
    from kvlink_rag.runtime.lora import FusedLowRank, LowRank

    g = torch.Generator().manual_seed(7)
    a1, b1, a2, b2 = (torch.randn(*shape, generator=g) for shape in ((4, 64), (32, 4), (2, 64), (16, 2)))
    term = FusedLowRank([LowRank(8, 40, a1, b1, 2.0), LowRank(48, 64, a2, b2, 0.5)])
    x, y0 = torch.randn(5, 64, generator=g), torch.randn(5, 80, generator=g)
    a, b_t = term.stacks()
    alone = []
    for i in range(5):
        yi = y0[i:i + 1].clone()
        kernels().lowrank_add(yi, x[i:i + 1].contiguous(), a, b_t, 8)
        alone.append(yi)
    decode = y0.clone()
    term.add_to(decode, x, TokenSplit.of_rows([1] * 5, x.device))
    assert torch.equal(decode, torch.cat(alone))
    mixed = y0.clone()
    term.add_to(mixed, x, TokenSplit.of_rows([1, 3, 1], x.device))  # rows 0 and 4 decode, 1-3 a prefill
    gemm = y0.clone()
    gemm[:, 8:64].addmm_(x @ a.t(), b_t)
    assert torch.equal(mixed[[0, 4]], decode[[0, 4]]) and torch.equal(mixed[1:4], gemm[1:4])
    ref = y0.double()
    ref[:, 8:64] += (x.double() @ a.double().t()) @ b_t.double()
    assert torch.allclose(decode.double(), ref, atol=1e-5) and torch.allclose(mixed.double(), ref, atol=1e-5)


@needs_kernel
def test_fused_halves_only_where_they_fit():
    """Decode rows of q4q8-f32 fit; float32 weights, a Qwen3 q/k norm or float16 embeddings do not."""
    lm = tiny_model("llama", head_dim=64)
    w = ModelRunner(lm.model, "q4q8-f32").weights
    h = torch.zeros(2, lm.config.hidden_size)
    assert fused_decode.fits(w, None, h)
    assert not fused_decode.fits(w, None, h.half())
    assert not fused_decode.fits(ModelRunner(lm.model, "native").weights, None, h)
    qwen3 = tiny_model("qwen3", head_dim=64)
    assert not fused_decode.fits(ModelRunner(qwen3.model, "q4q8-f32").weights, None, h)


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
    assert fused_decode.fits(fused.weights, None, torch.zeros(2, lm.config.hidden_size, dtype=torch.bfloat16))
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


def _over_shared_chunk(lm, runner: ModelRunner, dtype: torch.dtype) -> tuple[torch.Tensor, list[SequenceKV]]:
    """Two rows over one shared bfloat16 chunk (a strided view into a larger buffer, as the prefix tree
    lends), then 4 decode steps each; the last logits and the rows' KV."""
    cfg = lm.config
    layers, kv, hd = cfg.num_hidden_layers, cfg.num_key_value_heads, lm.head_dim
    g = torch.Generator().manual_seed(5)
    big = [torch.randn(layers, kv, 40, hd, generator=g).bfloat16() for _ in range(2)]
    chunk = KVChunk(big[0][:, :, 3:20], big[1][:, :, 3:20])
    seqs = [SequenceKV([chunk], layers, kv, hd, torch.bfloat16), SequenceKV([], layers, kv, hd, torch.bfloat16)]
    seqs[1].append(big[0][:, :, :7], big[1][:, :, :7])  # a row with own tokens and no chunk
    for step in range(4):
        batch = RaggedBatch()
        for seq in seqs:
            batch.add(seq, 1)
        embeds = lm.embed_tokens(random_ids(2, seed=30 + step)).to(torch.bfloat16).to(dtype)
        logits = runner.forward(batch, embeds, torch.tensor([17 + step, 7 + step]))
    return logits, seqs


@needs_kernel
def test_decode_rows_write_and_attend_as_the_general_path():
    """The one-call K/V writes and attention of every row (decode_rows.cpp) over a shared strided chunk and
    own tokens: the same logits and the same stored KV as the general path (float32 rounding)."""
    lm = tiny_model("llama", head_dim=64)
    got, got_seqs = _over_shared_chunk(lm, ModelRunner(lm.model, "q4q8-bf16"), torch.bfloat16)
    general = ModelRunner(lm.model, "q4q8-f32")
    general.fused = False
    want, want_seqs = _over_shared_chunk(lm, general, torch.float32)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    for a, b in zip(got_seqs, want_seqs):
        assert a.length == b.length and torch.equal(a.own_kv()[0], b.own_kv()[0])
        assert torch.equal(a.own_kv()[1], b.own_kv()[1])


def test_decode_rows_only_for_plain_decode_rows():
    """A prefill row, a masked row or a row wanting attention probabilities keeps the general path."""
    seq = SequenceKV([], 2, 1, 64, torch.bfloat16)
    plain, prefill, masked, explain = RaggedBatch(), RaggedBatch(), RaggedBatch(), RaggedBatch()
    plain.add(seq, 1)
    prefill.add(seq, 3)
    masked.add(seq, 1, mask=torch.zeros(1, 1))
    explain.add(seq, 1, attention=object())
    assert fused_decode.DecodeRows.of(plain).pos == [0]
    assert all(fused_decode.DecodeRows.of(b) is None for b in (prefill, masked, explain, RaggedBatch()))


def _mixed_step(lm, runner: ModelRunner) -> torch.Tensor:
    """Two rows decode for 2 steps, then one step where a third row's 6-token prefill joins them; its logits."""
    cfg = lm.config
    seqs = [SequenceKV([], cfg.num_hidden_layers, cfg.num_key_value_heads, lm.head_dim, torch.float32) for _ in range(3)]
    for step in range(3):
        batch = RaggedBatch()
        for seq in seqs[:2]:
            batch.add(seq, 1)
        if step == 2:
            batch.add(seqs[2], 6)
        ids = random_ids(batch.num_tokens, seed=40 + step)
        pos = torch.tensor([step, step] + ([0, 1, 2, 3, 4, 5] if step == 2 else []))
        logits = runner.forward(batch, lm.embed_tokens(ids), pos)
    return logits


@needs_kernel
def test_a_mixed_step_runs_its_decode_rows_fused(monkeypatch):
    """A step with decode rows and a prefill row: the decode rows take the fused halves (one sub-batch of 2
    rows), the prefill the general path, and every row's logits equal the all-general step's."""
    lm = tiny_model("llama", head_dim=64)
    general = ModelRunner(lm.model, "q4q8-f32")
    general.fused = False
    want = _mixed_step(lm, general)
    widths = []
    real = fused_decode.layer_pre
    monkeypatch.setattr(fused_decode, "layer_pre", lambda *a: widths.append(a[3].shape[0]) or real(*a))
    got = _mixed_step(lm, ModelRunner(lm.model, "q4q8-f32"))
    assert widths == [2] * (3 * lm.config.num_hidden_layers)
    assert got.shape == want.shape == (3, lm.config.vocab_size)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 16])
def test_lowrank_add_is_the_same_at_any_thread_count(rows):
    """The LoRA terms split over the threads by rank and columns (few rows) or by rows (many): each value is
    summed by one thread in one order, so one thread and two give the same bits, and both the float64 value."""
    from kvlink_rag.runtime.cpu_kernels import kernels

    g = torch.Generator().manual_seed(rows)
    x, a = torch.randn(rows, 576, generator=g), torch.randn(48, 576, generator=g)
    b_t = torch.randn(48, 960, generator=g)
    y0 = torch.randn(rows, 1000, generator=g)
    got = []
    old = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            y = y0.clone()
            kernels().lowrank_add(y, x, a, b_t, 17)
            got.append(y)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(got[0], got[1])
    ref = y0.double()
    ref[:, 17:977] += (x.double() @ a.double().t()) @ b_t.double()
    assert torch.allclose(got[0].double(), ref, rtol=1e-5, atol=1e-3)


@needs_kernel
def test_lora_stacks_of_bfloat16_values_are_read_in_half_the_bytes_with_the_same_sums():
    """An adapter whose weights are bfloat16 values (the shipped one is stored so; its scale 2 keeps them so) hands
    the kernel bfloat16 stacks: the same bits out as its float32 stacks; one trained off that grid keeps float32."""
    from kvlink_rag.runtime.cpu_kernels import kernels
    from kvlink_rag.runtime.lora import FusedLowRank, LowRank

    g = torch.Generator().manual_seed(11)
    a1, b1, a2, b2 = (torch.randn(*s, generator=g).bfloat16().float() for s in ((16, 576), (192, 16), (16, 576),
                                                                                  (576, 16)))
    term = FusedLowRank([LowRank(0, 192, a1, b1, 2.0), LowRank(192, 768, a2, b2, 2.0)])
    a, b_t = term.stacks()
    ka, kb = term.kernel_stacks()
    assert a.dtype == torch.float32 and ka.dtype == kb.dtype == torch.bfloat16
    for rows in (1, 16):
        x, y0 = torch.randn(rows, 576, generator=g), torch.randn(rows, 800, generator=g)
        y32, y16 = y0.clone(), y0.clone()
        kernels().lowrank_add(y32, x, a, b_t, 5)
        kernels().lowrank_add(y16, x, ka, kb, 5)
        assert torch.equal(y32, y16)
    off = FusedLowRank([LowRank(0, 192, a1 + 1e-3, b1, 2.0)])
    assert off.kernel_stacks()[0].dtype == torch.float32 and off.kernel_stacks()[0] is off.stacks()[0]
