"""Pure RoPE math with explicit position ids (rotate-half convention of Llama-family models).

The angles come from the model's own rotary module (found by its family:
:attr:`kvlink_rag.model.loader.LoadedModel.rotary_emb`), so llama3, linear and yarn scaling and the
attention-scaling factor are carried exactly as the model applies them (sequence-length-dependent types
such as dynamic and longrope are refused at load, see :func:`kvlink_rag.model.support.check_supported`).
The rotation itself follows ``apply_rotary_pos_emb`` in transformers' Llama code and gpt-fast's
``apply_rotary_emb``: ``x * cos + rotate_half(x) * sin`` (Su et al., 2021, RoFormer, eq. 34).
"""

from __future__ import annotations

import weakref

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of the last dim: ``[x1, x2] -> [-x2, x1]``. Shape preserved."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # rotary module -> CPU (cos, sin) [N, head_dim]
MIN_TABLE = 4096  # positions a module's first table covers (grown to the next power of two past the largest asked)


@torch.no_grad()
def rope_cos_sin(rotary_emb: torch.nn.Module, position_ids: torch.Tensor, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables for ``position_ids`` from the model's rotary module.

    On the CPU the module is called once for positions ``0..N-1`` and its rows are gathered per call (every
    supported RoPE type is static in the position: the dynamic ones are refused at load): bit-identical to calling
    it with ``position_ids`` (each angle is one float32 product ``inv_freq * position``), at a fraction of its cost
    (development machine, two threads: 43-50 -> 17-18 us at 16 positions, 473-499 -> 57-73 us at 4,096). On an
    accelerator the module is called as it is (sizing the table would read the largest position back to the host).

    Args:
        rotary_emb: the model's rotary embedding module, called as ``rotary_emb(x, position_ids)``.
        position_ids: ``[tokens]`` int64 positions >= 0 (any order, need not be contiguous).
        dtype: dtype of the returned tables.
    Returns:
        ``(cos, sin)``, each ``[tokens, head_dim]``; they include the module's attention scaling.
    """
    device = torch.device(device if device is not None else position_ids.device)
    pos = position_ids.to(device=device, dtype=torch.long).reshape(-1)
    if device.type != "cpu":
        cos, sin = rotary_emb(torch.empty(1, dtype=torch.float32, device=device), pos.reshape(1, -1))
        return cos[0].to(dtype), sin[0].to(dtype)
    n = int(pos.max()) + 1 if pos.numel() else 0
    cos, sin = _table(rotary_emb, n)
    return cos.index_select(0, pos).to(dtype), sin.index_select(0, pos).to(dtype)


def _table(rotary_emb: torch.nn.Module, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The module's float32 CPU ``(cos, sin)`` ``[N, head_dim]`` with ``N >= n`` (made or grown here)."""
    table = _TABLES.get(rotary_emb)
    if table is None or table[0].shape[0] < n:
        size = max(MIN_TABLE, 1 << max(n - 1, 0).bit_length())
        cos, sin = rotary_emb(torch.empty(1, dtype=torch.float32), torch.arange(size).reshape(1, -1))
        table = (cos[0].float(), sin[0].float())
        _TABLES[rotary_emb] = table  # one assignment: a reader sees the old table or the new one
    return table


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` at the positions that ``cos``/``sin`` were made for.

    Args:
        x: ``[..., tokens, head_dim]`` (e.g. ``[layers, kv_heads, tokens, head_dim]``).
        cos, sin: ``[tokens, head_dim]`` from :func:`rope_cos_sin`.
    Returns:
        Rotated tensor, same shape and dtype as ``x`` (math in the dtype of ``cos``).
    """
    xf = x.to(cos.dtype)
    return (xf * cos + rotate_half(xf) * sin).to(x.dtype)


def remove_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`apply_rope` at the same positions.

    The rotation scaled by ``s`` (yarn's attention factor) has inverse ``R^T / s^2``, and
    ``cos^2 + sin^2 = s^2`` elementwise, so the inverse is exact for every scaling type.

    Args:
        x: ``[..., tokens, head_dim]`` rotated keys.
        cos, sin: ``[tokens, head_dim]``.
    Returns:
        Keys before RoPE, same shape and dtype as ``x``.
    """
    xf = x.to(cos.dtype)
    return ((xf * cos - rotate_half(xf) * sin) / (cos * cos + sin * sin)).to(x.dtype)
