"""Q4 x Q8 decode linears: llama.cpp's Q4_1 x Q8_1 dot product as a small C++ kernel (AVX512-VNNI or AVX2).

A decode step multiplies each weight once by one activation row, so its cost is reading the weights and the
instructions per weight. torch's ``_weight_int4pack_mm_for_cpu`` unpacks every int4 weight to floating point
and multiplies in bfloat16 (~16 G multiply-adds/s on one thread here); llama.cpp instead quantises the
activation row to int8 per block of 32 (Q8_1) and multiplies 4-bit by 8-bit integers with ``vpdpbusd``
(64 products an instruction; on AVX2 vpmaddubsw + vpmaddwd), scaling once per block. :file:`csrc/cpu_kernels.cpp` does the same over weights
packed in tiles of 16 output rows (each 32-bit lane of a vector one row, so no horizontal sums):
``y_j = sum_b d_jb dx_b (q_j . qx)_b + m_jb dx_b (sum qx)_b`` with ``w = d q + m`` per block of 32 (GGUF
Q4_1's grid, its float16 ``d`` and ``m`` kept as float16) and ``x ~ dx qx`` (``dx = max|x| / 127``).

The kernels are compiled once per machine (:mod:`.cpu_kernels`); :func:`available` says whether they run here.
"""

from __future__ import annotations

import torch

from .cpu_kernels import available, kernels
from .quantize import int8_rows, q4_groups

BLOCK, TILE_ROWS = 32, 16


def pack(q: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """Tiles of the kernel from a 4-bit weight.

    Args:
        q: ``[n, k]`` integers in 0..15 (``n`` a multiple of 16, ``k`` of 32).
        scale, low: ``[n, k / 32]`` float, ``w = scale * q + low`` per block (stored as float16).
    Returns:
        ``[n / 16, k / 32, 320]`` uint8.
    Raises:
        ValueError: ``n`` or ``k`` not a multiple of the tile.
    """
    n, k = q.shape
    if n % TILE_ROWS or k % BLOCK:
        raise ValueError(f"Q4 x Q8 needs [n, k] multiples of [{TILE_ROWS}, {BLOCK}], got [{n}, {k}]")
    tiles, blocks = n // TILE_ROWS, k // BLOCK
    # k = 32 b + 8 p + 4 h + i: vector p of block b holds, per row lane, bytes i with nibble h
    q6 = q.to(torch.uint8).view(tiles, TILE_ROWS, blocks, 4, 2, 4).permute(0, 2, 3, 1, 5, 4)
    nibbles = (q6[..., 0] | (q6[..., 1] << 4)).reshape(tiles, blocks, 256)

    def halves(t: torch.Tensor) -> torch.Tensor:  # [n, blocks] -> [tiles, blocks, 32] bytes of float16
        return t.to(torch.float16).view(tiles, TILE_ROWS, blocks).permute(0, 2, 1).contiguous().view(torch.uint8)

    return torch.cat([nibbles, halves(scale), halves(low)], dim=-1).contiguous()


def q4q8_mm(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """``[m, k]`` float32 x the packed ``[n, k]`` weight -> ``[m, n]`` float32 (see module docstring).

    Raises:
        RuntimeError: the kernel is not available here (check :func:`available` first).
    """
    ext = kernels()
    if ext is None:
        raise RuntimeError("the Q4 x Q8 kernel is not available on this machine")
    return ext.q4q8_mm(x.float(), packed)


class Q4Q8Linear:
    """A :class:`~kvlink_rag.runtime.linear.Linear` on the Q4 x Q8 kernel: ``w = d q + m`` per block of 32
    inputs with float16 ``d`` and ``m`` (re-quantised from ``weight``: a weight dequantised from GGUF Q4_1
    lands back on its own grid and scales exactly), activations rounded to int8 per block of 32 inside the
    kernel; returns in ``x``'s dtype. CPU with AVX2 or AVX512-VNNI only.

    Raises:
        ValueError: a shape that is not a multiple of the tile. RuntimeError: the kernel is not available.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        if not available():
            raise RuntimeError("the Q4 x Q8 formats need AVX2 (or AVX512-VNNI) and a C++ compiler (see the log)")
        n, k = weight.shape
        if k % BLOCK or n % TILE_ROWS:
            raise ValueError(f"Q4 x Q8 needs [out, in] multiples of [{TILE_ROWS}, {BLOCK}], got [{n}, {k}]")
        self.packed = pack(*q4_groups(weight, BLOCK, torch.float16))  # scales and mins as float16 holds them
        self.bias = None if bias is None else bias.detach().float()
        self.out_features = int(n)

    def __call__(self, x: torch.Tensor, split=None) -> torch.Tensor:
        y = q4q8_mm(x, self.packed)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)


def pack_q8(q: torch.Tensor) -> torch.Tensor:
    """Tiles of the Q8 x Q8 kernel from int8 weights ``[n, k]`` (``n`` a multiple of 16, ``k`` of 32):
    ``[n / 16, k / 32, 576]`` uint8 (512 bytes of weights, then 16 int32 corrections ``128 * sum`` per block)."""
    n, k = q.shape
    tiles, blocks = n // TILE_ROWS, k // BLOCK
    q8 = q.to(torch.int8).view(tiles, TILE_ROWS, blocks, 8, 4).permute(0, 2, 3, 1, 4)  # [t, b, g, row, i]
    corr = (q.to(torch.int32).view(tiles, TILE_ROWS, blocks, BLOCK).sum(-1) * 128).to(torch.int32).permute(0, 2, 1)
    return torch.cat([q8.reshape(tiles, blocks, 512).view(torch.uint8),
                      corr.contiguous().view(torch.uint8).view(tiles, blocks, 64)], dim=-1).contiguous()


class Q8Q8Linear:
    """int8 weights (symmetric per output row, as :class:`~kvlink_rag.runtime.linear.Int8Linear` rounds them)
    times int8 activations per block of 32 on the kernel; for the LM head of a decode step, where torch's
    ``_weight_int8pack_mm`` runs ~4 ms on one thread for SmolLM2's 49,152 x 576 and this ~1.5 ms.

    Raises:
        ValueError: a shape that is not a multiple of the tile. RuntimeError: the kernel is not available.
    """

    def __init__(self, weight: torch.Tensor):
        if not available():
            raise RuntimeError("the Q8 x Q8 kernel needs AVX2 (or AVX512-VNNI) and a C++ compiler (see the log)")
        n, k = weight.shape
        if k % BLOCK or n % TILE_ROWS:
            raise ValueError(f"Q8 x Q8 needs [out, in] multiples of [{TILE_ROWS}, {BLOCK}], got [{n}, {k}]")
        q, self.scale = int8_rows(weight)  # scale: [out]
        self.packed = pack_q8(q)
        self.out_features = int(n)

    def __call__(self, x: torch.Tensor, split=None) -> torch.Tensor:
        return (kernels().q8q8_mm(x.float(), self.packed) * self.scale).to(x.dtype)
