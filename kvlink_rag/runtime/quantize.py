"""Weight rounding grids shared by the runner's weight formats: symmetric int8 per output row and asymmetric
4-bit per group of inputs (GGUF Q4_1's grid). torch's kernels (:mod:`.linear`) and the runner's own
(:mod:`.q4q8`) pack the same rounded weights in their own layouts."""

from __future__ import annotations

import torch


def int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 rounding per output row (torchao's int8 weight-only): ``W ~= q * s``.

    Args: ``weight`` ``[out, in]``. Returns: ``q`` int8 ``[out, in]`` in -127..127, ``s`` float32 ``[out]``.
    """
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # [out]
    return torch.clamp(torch.round(w / scale[:, None]), -127, 127).to(torch.int8), scale


def q4_groups(weight: torch.Tensor, group: int = 32, grid_dtype: torch.dtype = torch.float32
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit rounding per group of ``group`` inputs (GGUF Q4_1's grid): ``W ~= q * s + m``.

    Args:
        weight: ``[out, in]``, ``in`` a multiple of ``group``.
        grid_dtype: ``m`` and ``s`` are rounded to this dtype before ``q`` is chosen (float16 keeps a weight
            dequantised from Q4_1 exactly on its grid).
    Returns:
        ``q`` float ``[out, in]`` in 0..15, ``s`` and ``m`` float32 ``[out, in / group]``.
    """
    n, k = weight.shape
    w = weight.detach().float().view(n, k // group, group)
    lo = w.amin(-1).to(grid_dtype).float()  # [out, groups]
    scale = ((w.amax(-1) - lo) / 15).clamp(min=1e-12).to(grid_dtype).float()
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # a float16 scale can round to 0 (a flat group)
    q = torch.clamp(torch.round((w - lo[..., None]) / safe[..., None]), 0, 15)
    return q.view(n, k), scale, lo
