"""Capture attention weights layer by layer without keeping them (for importance scores and attribution).

transformers' SDPA kernels never materialise the attention probabilities; its eager path returns them from
every attention module (``(attn_output, attn_weights)``, ``attn_weights``: ``[batch, heads, queries, keys]``
float). :func:`capture_attention` switches the model to the eager kernel for the duration of the block (the
same mask semantics: both kernels honour the 4-D additive mask, see ``model.SUPPORTED_ATTENTION``) and hands
each layer's weights to a callback as soon as they exist, so only one layer's weights are alive at a time.

The switch sets ``config._attn_implementation`` (read by every attention module at each call in
transformers >= 4.48); callers hold the model exclusively for the block (the service serialises model calls).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from .model import LoadedModel

WeightsFn = Callable[[int, torch.Tensor], None]


def attention_modules(lm: LoadedModel) -> list[torch.nn.Module]:
    """The self-attention module of every decoder layer, in layer order.

    Raises:
        ValueError: the model's decoder layers have no ``self_attn`` (not a Llama-family layout).
    """
    layers = lm.model.model.layers
    mods = [layer.self_attn for layer in layers if isinstance(getattr(layer, "self_attn", None), torch.nn.Module)]
    if len(mods) != len(layers):
        raise ValueError("attention capture needs decoder layers with a self_attn module (Llama-family layout)")
    return mods


@contextmanager
def capture_attention(lm: LoadedModel, on_weights: WeightsFn) -> Iterator[None]:
    """Within the block, every forward calls ``on_weights(layer, weights)`` per layer.

    Args:
        lm: the model; its attention kernel is eager inside the block and restored after.
        on_weights: called with the layer index and ``[batch, heads, queries, keys]`` attention probabilities
            (the compute dtype; keys in cache storage order). It must not keep the tensor if memory matters.
    """
    config = lm.model.config
    saved = config._attn_implementation
    handles = []

    def hook_for(layer: int):
        def hook(_module, _args, output):
            weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if weights is None:
                raise RuntimeError("the attention kernel returned no weights (eager attention is needed)")
            on_weights(layer, weights.detach())
        return hook

    try:
        config._attn_implementation = "eager"
        for i, mod in enumerate(attention_modules(lm)):
            handles.append(mod.register_forward_hook(hook_for(i)))
        yield
    finally:
        for h in handles:
            h.remove()
        config._attn_implementation = saved
