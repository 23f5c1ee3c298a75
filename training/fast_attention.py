"""Attention for the link-and-question training forward: the cached document KV takes no gradient.

In training the new tokens (link tokens, question, answer) run on top of a cache of detached document
KV; PyTorch's CPU flash-attention backward computes the key and value gradients of every cached token
anyway (1,500 per example at 10 NQ documents against ~75 new tokens) and was the largest single cost of a
bfloat16 step. Here attention is written as matmuls over the cached part (detached: only the queries'
gradient is formed) and the new part, with the query heads of one KV head grouped into one matmul (no
repeat of the KV heads), the softmax in float32.

Valid only where the cache holds no tensor that needs a gradient (query-side training; never for
``--doc-side``), and where the new tokens are the last ``q`` keys of the cache (a forward over new tokens
on top of a cache, as :func:`kvlink_rag.linking.linker.link` and :mod:`training.packed` run it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from kvlink_rag.model.families import family_of

NAME = "kvlink_train"


def train_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                    matmul_dtype: torch.dtype | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-interface signature.

    Args:
        query: ``[B, heads, q, head_dim]``; key, value: ``[B, kv_heads, L, head_dim]`` whose last ``q``
            positions are the new tokens (``L - q`` cached ones before them, no gradient taken there).
        attention_mask: additive ``[B or 1, 1, q, L]`` (0 allowed, a large negative elsewhere) or None.
        matmul_dtype: dtype of the four matmuls (bfloat16: AMX; None: the query's); the mask and softmax
            are float32 either way.
    Returns:
        ``([B, q, heads, head_dim], None)`` in the query's dtype.
    """
    b, h, q, d = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    g, cached = h // kv_heads, length - q
    dt = matmul_dtype or query.dtype
    scale = scaling if scaling is not None else d ** -0.5
    qg = (query * scale).reshape(b, kv_heads, g * q, d).to(dt)
    kc, vc = key[:, :, :cached].detach().to(dt), value[:, :, :cached].detach().to(dt)
    kn, vn = key[:, :, cached:].to(dt), value[:, :, cached:].to(dt)
    s = torch.cat([qg @ kc.transpose(-1, -2), qg @ kn.transpose(-1, -2)], dim=-1).view(b, kv_heads, g, q, length)
    s = s.float()
    if attention_mask is not None:  # in place: the sum keeps s's contiguous layout (the mask may be strided)
        s = s.add_(attention_mask[:, :, None])
    p = torch.softmax(s, dim=-1).to(dt).view(b, kv_heads, g * q, length)
    out = p[..., :cached] @ vc + p[..., cached:] @ vn
    return out.view(b, h, q, d).transpose(1, 2).contiguous().to(query.dtype), None


def _train_attention_bf16(*args, **kwargs) -> tuple[torch.Tensor, None]:
    return train_attention(*args, matmul_dtype=torch.bfloat16, **kwargs)


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, train_attention)
    AttentionInterface.register(NAME + "_bf16", _train_attention_bf16)


@contextmanager
def training_attention(model: torch.nn.Module, on: bool = True, bf16: bool = False) -> Iterator[None]:
    """Run ``model``'s attention through :func:`train_attention` inside the block (its own implementation
    again after), with bfloat16 matmuls when ``bf16``; ``on=False`` leaves it unchanged."""
    if not on:
        yield
        return
    _register()
    cfg, fam = model.config, family_of(model.config)
    before = fam.attention_kernel(cfg)
    fam.set_attention_kernel(cfg, NAME + ("_bf16" if bf16 else ""))
    try:
        yield
    finally:
        fam.set_attention_kernel(cfg, before)
