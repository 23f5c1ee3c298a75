"""Conversions between stacked KV tensors ``[layers, kv_heads, tokens, head_dim]`` and transformers caches."""

from __future__ import annotations

import torch
from transformers import DynamicCache


def build_cache(keys: list[torch.Tensor], values: list[torch.Tensor]) -> DynamicCache:
    """A ``DynamicCache`` holding one ``[kv_heads, tokens, head_dim]`` tensor per layer (batch 1 is added)."""
    return DynamicCache(ddp_cache_data=[(k.unsqueeze(0), v.unsqueeze(0)) for k, v in zip(keys, values)])


def cache_tensors(cache: DynamicCache) -> tuple[torch.Tensor, torch.Tensor]:
    """Stacked ``(keys, values)``, each ``[layers, kv_heads, tokens, head_dim]``, from a batch-1 cache."""
    keys = torch.stack([layer.keys[0] for layer in cache.layers])
    values = torch.stack([layer.values[0] for layer in cache.layers])
    return keys, values


def truncate_cache(cache: DynamicCache, tokens: int) -> None:
    """Drop every slot after the first ``tokens`` in every layer (undo a scoring forward), in place."""
    for layer in cache.layers:
        layer.keys = layer.keys[:, :, :tokens]
        layer.values = layer.values[:, :, :tokens]
