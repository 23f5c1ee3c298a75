"""One-token decode attention against the plain formula, for every form it takes."""

import pytest
import torch

from kvlink_rag.runtime.cpu_kernels import available, cpu_flags, kernels
from kvlink_rag.runtime.decode_attention import MATMUL_MIN_KEYS, attend_decode, grouped


def _reference(q, k, v, mask, scale):
    """softmax(q K^T * scale + mask) V in float64 with the KV heads repeated for their query heads."""
    g = q.shape[0] // k.shape[0]
    k, v = k.double().repeat_interleave(g, 0), v.double().repeat_interleave(g, 0)
    s = q.double() @ k.transpose(1, 2) * scale
    if mask is not None:
        s = s + mask.double()
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("tokens", [5, MATMUL_MIN_KEYS + 40])  # the fused kernel's rows and the matmul form
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("masked", [False, True])
def test_one_piece_folds_query_heads_into_their_kv_heads_rows(tokens, dtype, masked):
    """9 query heads over 3 KV heads, one piece, with and without an additive mask: plain attention with each
    KV head repeated for its query heads (float32 to 1e-5, bfloat16 to its rounding)."""
    g = torch.Generator().manual_seed(tokens)
    q, k, v = (torch.randn(h, n, 16, generator=g) for h, n in ((9, 1), (3, tokens), (3, tokens)))
    mask = None
    if masked:
        mask = torch.zeros(1, tokens)
        mask[0, 1::3] = torch.finfo(torch.float32).min  # every third key hidden
    want = _reference(q, k, v, mask, 0.25)
    got = attend_decode(q.to(dtype), [(k.to(dtype), v.to(dtype))], mask, 0.25)
    assert got.shape == (9, 1, 16) and got.dtype == dtype
    assert (got.double() - want).abs().max() < (1e-5 if dtype == torch.float32 else 2e-2)


def test_a_decode_over_bfloat16_pieces_merges_each_pieces_kernel_by_log_sum_exp():
    """One-token queries over several bfloat16 pieces (a long one, runs of short ones joined): the same
    attention as over the pieces joined, to bfloat16 rounding."""
    g = torch.Generator().manual_seed(5)
    sizes = [300, 7, 20, 1, 290, 3]
    pieces = [(torch.randn(2, t, 8, generator=g), torch.randn(2, t, 8, generator=g)) for t in sizes]
    q = torch.randn(4, 1, 8, generator=g)
    k, v = torch.cat([k for k, _ in pieces], 1), torch.cat([v for _, v in pieces], 1)
    want = _reference(q, k, v, None, 8 ** -0.5)
    got = attend_decode(q.bfloat16(), [(k.bfloat16(), v.bfloat16()) for k, v in pieces], None, 8 ** -0.5)
    assert got.dtype == torch.bfloat16 and (got.double() - want).abs().max() < 2e-2
    assert [k.shape[1] for k, _ in grouped(pieces)] == [300, 28, 290, 3]


def test_masked_float32_pieces_concatenate_the_scores():
    """Several float32 pieces under a mask: the scores of all pieces in one softmax (1e-5)."""
    g = torch.Generator().manual_seed(9)
    pieces = [(torch.randn(2, t, 8, generator=g), torch.randn(2, t, 8, generator=g)) for t in (6, 4)]
    q = torch.randn(6, 1, 8, generator=g)
    mask = torch.zeros(1, 10)
    mask[0, 2] = mask[0, 7] = torch.finfo(torch.float32).min
    k, v = torch.cat([k for k, _ in pieces], 1), torch.cat([v for _, v in pieces], 1)
    assert (attend_decode(q, pieces, mask, 0.3).double() - _reference(q, k, v, mask, 0.3)).abs().max() < 1e-5


@pytest.mark.skipif(not available(), reason="the runner's CPU kernels do not run on this CPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("sizes", [[7], [300, 5, 1, 64]])
def test_the_cpu_kernel_attends_over_strided_pieces(sizes, dtype):
    """head_dim 64, bfloat16 or float32 pieces that are views of larger buffers (as a request's KV and the
    prefix tree's are): the C++ kernel's attention equals the plain formula over the pieces joined (float64,
    on the same rounded inputs: 1e-5)."""
    g = torch.Generator().manual_seed(len(sizes))
    pieces = []
    for t in sizes:
        buf = torch.randn(2, 3, t + 9, 64, generator=g).to(dtype)  # [layers, kv_heads, capacity, head_dim]
        pieces.append((buf[1, :, :t], buf[0, :, 2: 2 + t]))
    q = torch.randn(9, 1, 64, generator=g)
    k = torch.cat([k for k, _ in pieces], 1).float()
    v = torch.cat([v for _, v in pieces], 1).float()
    want = _reference(q, k, v, None, 0.125)
    got = attend_decode(q, pieces, None, 0.125)
    assert got.shape == (9, 1, 64) and got.dtype == torch.float32
    assert (got.double() - want).abs().max() < 1e-5
    direct = kernels().decode_attention(q[:, 0], [k for k, _ in pieces], [v for _, v in pieces], 0.125)
    assert (direct.double() - want[:, 0]).abs().max() < 1e-5


@pytest.mark.skipif(not available(), reason="the runner's CPU kernels do not run on this CPU")
def test_the_cpu_kernels_rms_norm_is_torchs():
    x, w = torch.randn(5, 576), torch.randn(576)
    assert (kernels().rms_norm(x, w, 1e-5) - torch.nn.functional.rms_norm(x, (576,), w, 1e-5)).abs().max() < 1e-5


@pytest.mark.skipif(not available(), reason="the runner's CPU kernels do not run on this CPU")
@pytest.mark.parametrize("sizes", [[7], [300, 5, 1, 64, 33], [16, 17], [0, 5, 0, 257]])
@pytest.mark.parametrize("heads", [3, 6, 9, 12, 15, 18, 21, 24, 27])
def test_bfloat16_valued_queries_over_bfloat16_pieces(sizes, heads):
    """The decode rows' case (the query rounded to the KV's dtype first), for groups of 1 to 9 query heads per KV
    head, and pieces across chunk edges or empty. Where the CPU has AVX512-BF16 (groups up to 8) the scores are its dot products, 16 keys summed at a
    time, and P @ V takes the probabilities rounded to bfloat16 (chunks of 256 keys, online softmax): each weight
    off by at most 2^-9 of itself, so the output by at most 2^-9 max|v| (the bound asserted with 2x slack); elsewhere
    the plain formula on the same inputs to 1e-5 (float64)."""
    g = torch.Generator().manual_seed(sum(sizes) + heads)
    pieces = []
    for t in sizes:
        buf = torch.randn(2, 3, t + 9, 64, generator=g).bfloat16()
        pieces.append((buf[1, :, :t], buf[0, :, 2: 2 + t]))
    q = torch.randn(heads, 64, generator=g).bfloat16().float()
    k = torch.cat([k for k, _ in pieces], 1).float()
    v = torch.cat([v for _, v in pieces], 1).float()
    want = _reference(q[:, None], k, v, None, 0.125)[:, 0]
    got = kernels().decode_attention(q, [k for k, _ in pieces], [v for _, v in pieces], 0.125)
    rounded_p = "avx512_bf16" in cpu_flags() and kernels().isa() == "avx512" and heads // 3 <= 8
    bound = 2 ** -8 * v.abs().max().item() if rounded_p else 1e-5
    assert (got.double() - want).abs().max() < bound


@pytest.mark.skipif(not available(), reason="the runner's CPU kernels do not run on this CPU")
@pytest.mark.parametrize("peak", [3, 300, 520, 599])
def test_a_late_maximum_rescales_what_earlier_chunks_summed(peak):
    """One piece of 600 bfloat16 keys (three chunks of the one-pass kernel) with one key far above the rest at
    `peak`: the output is that key's value wherever it lies (earlier chunks' sums rescaled by the online softmax,
    to bfloat16 rounding of the value), and random scores around it still match the plain formula to the bound."""
    g = torch.Generator().manual_seed(peak)
    k = (torch.randn(3, 600, 64, generator=g) * 0.1).bfloat16()
    v = torch.randn(3, 600, 64, generator=g).bfloat16()
    q = torch.randn(9, 64, generator=g).bfloat16().float()
    k[:, peak] = (q.view(3, 3, 64).mean(1) * 4).bfloat16()  # every query head of a KV head scores it highest
    want = _reference(q[:, None], k.float(), v.float(), None, 1.0)[:, 0]
    got = kernels().decode_attention(q, [k], [v], 1.0)
    assert (got.double() - want).abs().max() < 2 ** -8 * v.abs().max().item()
    top = torch.softmax(q.double().view(3, 3, 64) @ k.double().transpose(1, 2), -1).max(-1).values
    assert top.min() > 0.999  # the case is what it says: one key holds the weight
