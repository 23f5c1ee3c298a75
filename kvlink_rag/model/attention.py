"""Capture attention weights layer by layer without keeping them (for importance scores and attribution).

transformers' SDPA kernels never materialise the attention probabilities; its eager path returns them from
every attention module (``(attn_output, attn_weights)``, ``attn_weights``: ``[batch, heads, queries, keys]``
float). :func:`capture_attention` switches the model to the eager kernel for the duration of the block (the
same mask semantics: both kernels honour the 4-D additive mask, see ``kvlink_rag.model.support.SUPPORTED_ATTENTION``) and hands
each layer's weights to a callback as soon as they exist, so only one layer's weights are alive at a time.

The switch is the model family's (:meth:`~kvlink_rag.model.family.ModelFamily.set_attention_kernel`: the
config's attention implementation, read by every attention module at each call in transformers >= 4.48). Captures may overlap across threads (a query explained while a precompute thread
scores a document): the switch is reference-counted per model, and each capture's hooks count only the
forwards of the thread that opened it. Another thread's forwards run eager meanwhile (same math, slower).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from .loader import LoadedModel

WeightsFn = Callable[[int, torch.Tensor], None]


def attention_modules(lm: LoadedModel) -> list[torch.nn.Module]:
    """The self-attention module of every decoder layer, in layer order.

    Raises:
        ValueError: the model's decoder layers have no ``self_attn`` (not a Llama-family layout).
    """
    fam = lm.family
    layers = fam.layers(lm.model)
    mods = [m for m in (fam.attention(layer) for layer in layers) if m is not None]
    if len(mods) != len(layers):
        raise ValueError("attention capture needs decoder layers with a self_attn module (Llama-family layout)")
    return mods


_CAPTURING = threading.local()  # .depth: captures open on this thread


def capturing() -> bool:
    """Whether this thread has an attention capture open (its forwards must run through transformers'
    eager modules, where the hooks are, rather than the model runner)."""
    return getattr(_CAPTURING, "depth", 0) > 0


_SWITCH_LOCK = threading.Lock()
_SWITCHED: dict[int, list] = {}  # id(config) -> [open captures, kernel to restore]


@contextmanager
def _eager(lm: LoadedModel) -> Iterator[None]:
    """``lm`` on the eager kernel while any capture of it is open (reference-counted across threads)."""
    fam, config = lm.family, lm.config
    with _SWITCH_LOCK:
        entry = _SWITCHED.setdefault(id(config), [0, fam.attention_kernel(config)])
        entry[0] += 1
        fam.set_attention_kernel(config, "eager")
    try:
        yield
    finally:
        with _SWITCH_LOCK:
            entry[0] -= 1
            if entry[0] == 0:
                fam.set_attention_kernel(config, entry[1])
                del _SWITCHED[id(config)]


@contextmanager
def capture_attention(lm: LoadedModel, on_weights: WeightsFn) -> Iterator[None]:
    """Within the block, every forward of this thread calls ``on_weights(layer, weights)`` per layer.

    Args:
        lm: the model; its attention kernel is eager inside the block and restored after the last capture.
        on_weights: called with the layer index and ``[batch, heads, queries, keys]`` attention probabilities
            (the compute dtype; keys in cache storage order). It must not keep the tensor if memory matters.
    Raises:
        RuntimeError: (from a forward in the block) the kernel returned no weights.
    """
    owner = threading.get_ident()
    handles = []

    def hook_for(layer: int):
        def hook(_module, _args, output):
            if threading.get_ident() != owner:
                return  # another thread's forward (not this capture's)
            weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if weights is None:
                raise RuntimeError("the attention kernel returned no weights (eager attention is needed)")
            on_weights(layer, weights.detach())
        return hook

    with _eager(lm):
        _CAPTURING.depth = getattr(_CAPTURING, "depth", 0) + 1
        try:
            for i, mod in enumerate(attention_modules(lm)):
                handles.append(mod.register_forward_hook(hook_for(i)))
            yield
        finally:
            _CAPTURING.depth -= 1
            for h in handles:
                h.remove()
