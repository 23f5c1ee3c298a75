"""The Q4 x Q8 and Q8 x Q8 decode kernels against their formulas, and the q4q8 weight formats in the runner."""

import pytest
import torch

from kvlink_rag.runtime import q4q8
from kvlink_rag.runtime.linear import make_linear
from kvlink_rag.runtime.model_runner import ModelRunner
from kvlink_rag.runtime.ragged import RaggedBatch, SequenceKV
from factories import random_ids, tiny_model

needs_kernel = pytest.mark.skipif(not q4q8.available(), reason="neither AVX2 nor AVX512-VNNI (or no compiler) on this CPU")


def _q8(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``[m, k]`` rounded as the kernel rounds it: int8 per block of 32, scale max|x| / 127."""
    b = x.view(x.shape[0], -1, 32)
    d = b.abs().amax(-1, keepdim=True) / 127
    return (torch.round(b / d) * d).view_as(x)


def _q4_1_weight(n: int, k: int, seed: int) -> torch.Tensor:
    """A weight on GGUF Q4_1's grid: ``d q + m`` per block of 32 with float16 ``d`` and ``m``."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k // 32, 32), generator=g).float()
    q[..., 0], q[..., 1] = 0, 15  # Q4_1 maps each block's min to 0 and max to 15
    d = (torch.rand(n, k // 32, 1, generator=g) * 0.01 + 1e-3).half().float()
    m = (-torch.rand(n, k // 32, 1, generator=g) * 0.05).half().float()
    return (q * d + m).view(n, k)


@needs_kernel
@pytest.mark.parametrize("n,k,m", [(64, 96, 1), (512, 256, 3), (96, 1536, 2), (48, 64, 9)])  # 9: two 4-row groups + 1
def test_q4q8_keeps_a_q4_1_weight_exactly_and_equals_its_formula(n, k, m):
    """A weight on the Q4_1 grid is held exactly (float16 scales and mins); the product is that weight times
    the activations rounded to int8 per block of 32, to float32 summation (1e-5 of the largest output)."""
    w = _q4_1_weight(n, k, seed=n)
    bias = torch.randn(n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k))
    lin = q4q8.Q4Q8Linear(w, bias)
    want = _q8(x).double() @ w.double().t() + bias.double()
    got = lin(x)
    assert got.shape == (m, n) and got.dtype == torch.float32
    assert (got.double() - want).abs().max() < 1e-5 * want.abs().max()


@needs_kernel
def test_activations_round_to_int8_by_the_formula_bit_for_bit_ties_to_even():
    """Through a one-hot weight (output j = input j, scale 1, min 0) each output is the kernel's rounded input
    ``d * q`` exactly: ``d = max|x| / 127``, ``q = nearbyint(x * (1 / d))`` in float32 (ties to even), for every
    row (rows split over threads, blocks vectorised), an all-zero block and one whose scale is subnormal (zeros)."""
    k = 96
    x = torch.randn(6, k, generator=torch.Generator().manual_seed(5)) * 4
    x[0, :32] = torch.tensor([127.0, 2.5, 3.5, -2.5, -3.5, 0.5, -0.5, 1.5] * 4)  # d = 1: ties at .5
    x[5, 32:64] = 0
    x[4, 64:96] = 1e-37  # a scale below FLT_MIN: zeros (1 / d would lose bits or overflow)
    packed = q4q8.pack(torch.eye(k, dtype=torch.long), torch.ones(k, k // 32), torch.zeros(k, k // 32))
    b = x.view(6, -1, 32)
    d = b.abs().amax(-1, keepdim=True) / 127  # float32 throughout, as the kernel computes
    inv = torch.where(d >= torch.finfo(torch.float32).tiny, 1 / d, torch.zeros_like(d))
    want = (d * torch.round(b * inv)).view_as(x)
    assert torch.equal(q4q8.q4q8_mm(x, packed), want)
    assert want[0, :8].tolist() == [127.0, 2.0, 4.0, -2.0, -4.0, 0.0, -0.0, 2.0] and not want[4, 64:96].any()


@needs_kernel
def test_q8q8_equals_int8_weights_times_int8_activations():
    """The LM head kernel: symmetric int8 rows (one scale each) times the block-rounded activations."""
    g = torch.Generator().manual_seed(2)
    w, x = torch.randn(256, 128, generator=g) * 0.05, torch.randn(2, 128, generator=g)
    lin = q4q8.Q8Q8Linear(w)
    wq = torch.clamp(torch.round(w / lin.scale[:, None]), -127, 127) * lin.scale[:, None]
    want = _q8(x).double() @ wq.double().t()
    assert (lin(x).double() - want).abs().max() < 1e-5 * want.abs().max()


@needs_kernel
def test_shapes_off_the_tile_are_refused():
    with pytest.raises(ValueError, match="multiples"):
        q4q8.Q4Q8Linear(torch.randn(20, 64))
    with pytest.raises(ValueError, match="multiples"):
        q4q8.Q8Q8Linear(torch.randn(32, 40))


def test_without_the_kernel_the_formats_are_refused_by_name(monkeypatch):
    monkeypatch.setattr(q4q8, "available", lambda: False)
    with pytest.raises(RuntimeError, match="AVX2"):
        make_linear(torch.randn(32, 64), None, "q4q8-bf16")


@needs_kernel
@torch.inference_mode()
def test_q4q8_f32_prefills_exactly_native_and_decodes_on_the_kernel():
    """q4q8-f32: a prefill row is exactly native; a decode row is close to native (int4 weights, int8
    activations), and different from it (really the kernel)."""
    lm = tiny_model("llama", head_dim=64)
    cfg = lm.config

    def run(r, ids):
        batch = RaggedBatch()
        batch.add(SequenceKV([], cfg.num_hidden_layers, cfg.num_key_value_heads, lm.head_dim, torch.float32), len(ids))
        return r.forward(batch, lm.embed_tokens(ids), torch.arange(len(ids)))[0]

    native, runner = ModelRunner(lm.model, "native"), ModelRunner(lm.model, "q4q8-f32")
    prefill, decode = random_ids(15, seed=4), random_ids(1, seed=5)
    assert torch.equal(run(runner, prefill), run(native, prefill))
    want, got = run(native, decode), run(runner, decode)
    assert 0 < (got - want).norm() / want.norm() < 0.25
