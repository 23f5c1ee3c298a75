"""Between transformers' ``DynamicCache`` (the one-request contexts, explain and training) and the runner's
:class:`~kvlink_rag.ragged.SequenceKV`.

A context built through transformers (a linked prompt, full prefill) is decoded by the runner: its KV is
copied once into a sequence with room for the answer, then each token is one packed forward.
"""

from __future__ import annotations

import torch

from ..model import LoadedModel
from ..ragged import SequenceKV


def sequence_from_cache(lm: LoadedModel, cache, extra: int) -> SequenceKV:
    """A :class:`SequenceKV` holding ``cache`` 's tokens (one copy) with room for ``extra`` more.

    Args:
        cache: a batch-1 transformers cache whose layers hold ``keys``/``values`` ``[1, kv_heads, tokens, head_dim]``.
        extra: tokens the caller will append (the answer's budget).
    """
    layers = cache.layers
    n = int(layers[0].keys.shape[2])
    cfg = lm.config
    seq = SequenceKV([], lm.num_layers, cfg.num_key_value_heads, lm.head_dim, layers[0].keys.dtype,
                     layers[0].keys.device, n + max(extra, 1))
    for i, layer in enumerate(layers):  # k, v: [1, kv_heads, tokens, head_dim]
        seq.write(i, layer.keys[0], layer.values[0])
    seq.commit(n)
    return seq
