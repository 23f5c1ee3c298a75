"""Asymmetric int8 quantisation of document KV tensors.

A tensor ``x`` of shape ``[..., tokens, head_dim]`` (usually ``[layers, kv_heads, tokens, head_dim]``
or one layer ``[kv_heads, tokens, head_dim]``) is stored as ``q`` int8 plus a ``scale`` and a ``zero``
per group::

    x ~= (q + 128) * scale + zero          # q in [-128, 127], scale >= 0, zero = group minimum

Two groupings:

- ``axis="token"``: one (scale, zero) per token per head, reduced over ``head_dim``;
  ``scale``/``zero`` have shape ``[..., tokens, 1]``. Used for values, and for keys by default.
- ``axis="channel"`` (KIVI-style): one (scale, zero) per channel per head, reduced over the tokens
  of the document; ``scale``/``zero`` have shape ``[..., 1, head_dim]``. Pre-RoPE keys have a few
  large-magnitude channels that are stable across tokens, so per-channel grouping keeps the small
  channels from being swamped by them (see ``tests/store/test_quant.py`` for the measured errors).

``scale`` and ``zero`` are float16 by default (float32 when the input range does not fit float16).
They are rounded to their storage dtype *before* ``q`` is computed, so dequantisation reproduces
exactly what was measured at quantisation time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

AXES = ("token", "channel")
_FP16_MAX = 65504.0
_LEVELS = 255.0


@dataclass(frozen=True)
class QuantizedTensor:
    """An int8-quantised tensor.

    Attributes:
        q: int8, same shape as the source tensor.
        scale: float16/float32, ``[..., tokens, 1]`` (``axis='token'``) or ``[..., 1, head_dim]``
            (``axis='channel'``); broadcastable against ``q``.
        zero: same shape and dtype as ``scale``; the group minimum.
        axis: ``'token'`` or ``'channel'``.
        source_dtype: dtype of the tensor that was quantised (default target of :func:`dequantize`).
    """

    q: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    axis: str
    source_dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of ``q``, ``scale`` and ``zero`` together."""
        return sum(t.numel() * t.element_size() for t in (self.q, self.scale, self.zero))


def quantize_int8(x: torch.Tensor, axis: str = "token", scale_dtype: torch.dtype = torch.float16) -> QuantizedTensor:
    """Quantise ``x`` (``[..., tokens, head_dim]``, any float dtype) to int8.

    Args:
        x: at least 2-D float tensor; the last two dims are ``tokens, head_dim``.
        axis: ``'token'`` (reduce over ``head_dim``) or ``'channel'`` (reduce over ``tokens``).
        scale_dtype: dtype of ``scale``/``zero``; ``torch.float16`` falls back to ``torch.float32``
            when ``|x|`` exceeds the float16 range.

    Raises:
        ValueError: unknown ``axis``, fewer than 2 dims, non-float input, or non-finite values.
    """
    if axis not in AXES:
        raise ValueError(f"unknown axis {axis!r}; choose one of {AXES}")
    if x.dim() < 2 or not x.is_floating_point():
        raise ValueError(f"expected a float tensor with >= 2 dims, got {x.dtype} {tuple(x.shape)}")
    xf = x.float()
    if not torch.isfinite(xf).all():
        raise ValueError("cannot quantise non-finite values")
    dim = -1 if axis == "token" else -2
    lo = xf.amin(dim=dim, keepdim=True)
    hi = xf.amax(dim=dim, keepdim=True)
    if scale_dtype == torch.float16 and xf.numel() and float(xf.abs().max()) > _FP16_MAX / 2:
        scale_dtype = torch.float32
    zero = lo.to(scale_dtype)
    # Range from the *rounded* zero so that the top of the group stays representable.
    scale = ((hi - zero.float()) / _LEVELS).clamp_min(0).to(scale_dtype)
    scale_f = scale.float()
    safe = torch.where(scale_f > 0, scale_f, torch.ones_like(scale_f))
    q = torch.round((xf - zero.float()) / safe).clamp_(0, _LEVELS) - 128
    return QuantizedTensor(
        q=q.to(torch.int8).contiguous(),
        scale=scale.contiguous(),
        zero=zero.contiguous(),
        axis=axis,
        source_dtype=x.dtype,
    )


def dequantize(qt: QuantizedTensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Reconstruct a float tensor of ``qt.q``'s shape in ``dtype`` (default ``qt.source_dtype``).

    The arithmetic runs in float32; the result lies on ``qt.q``'s device.
    """
    out = (qt.q.float() + 128.0) * qt.scale.float() + qt.zero.float()
    return out.to(dtype or qt.source_dtype)


def max_abs_error_bound(qt: QuantizedTensor) -> torch.Tensor:
    """Per-group bound on ``|x - dequantize(qt)|`` (float32, ``scale``'s shape): half a step.

    Rounding of ``zero`` to float16 is absorbed because ``scale`` was computed from the rounded zero;
    values below the rounded zero clamp to it, which adds at most the float16 rounding of the minimum.
    """
    zero = qt.zero.float()
    return qt.scale.float() / 2 + (zero.abs() * 2.0**-11 if qt.zero.dtype == torch.float16 else 0.0)


def bytes_per_token(
    layers: int,
    kv_heads: int,
    head_dim: int,
    dtype: str = "float16",
    key_axis: str = "token",
    tokens: int | None = None,
    scale_bytes: int = 2,
) -> float:
    """Stored bytes per document token for K and V together (payload only, no record overhead).

    Args:
        layers, kv_heads, head_dim: model KV geometry.
        dtype: ``'float32' | 'bfloat16' | 'float16' | 'int8'``.
        key_axis: grouping of keys for ``'int8'``; values are always per-token.
        tokens: document length; needed for ``key_axis='channel'``, whose per-channel scales are
            amortised over the document (``None`` counts them as zero).
        scale_bytes: bytes of one scale or zero (2 for float16).

    Raises:
        ValueError: unknown ``dtype`` or ``key_axis``.
    """
    elems = layers * kv_heads * head_dim  # per token, per tensor (K or V)
    if dtype in ("float16", "bfloat16"):
        return 2.0 * elems * 2
    if dtype == "float32":
        return 2.0 * elems * 4
    if dtype != "int8":
        raise ValueError(f"unknown dtype {dtype!r}")
    groups = layers * kv_heads  # per-token groups per tensor
    value_bytes = elems + groups * 2 * scale_bytes
    if key_axis == "token":
        key_bytes = elems + groups * 2 * scale_bytes
    elif key_axis == "channel":
        key_bytes = elems + (elems * 2 * scale_bytes / tokens if tokens else 0.0)
    else:
        raise ValueError(f"unknown key_axis {key_axis!r}")
    return float(key_bytes + value_bytes)
