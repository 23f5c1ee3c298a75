"""Between transformers' ``DynamicCache`` (the one-request contexts, explain and training) and the runner's
:class:`~kvlink_rag.runtime.ragged.SequenceKV`.

A context built through transformers (a linked prompt, full prefill) is decoded by the runner: its KV is
copied once into a sequence with room for the answer, then each token is one packed forward.
"""

from __future__ import annotations

import torch

from ..model.loader import LoadedModel
from .ragged import SequenceKV


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


def cache_view(seq: SequenceKV):
    """A transformers ``DynamicCache`` holding ``seq`` 's committed own tokens (``seq`` without shared chunks).

    This is a copy (~94 MB, ~10 ms at 4k tokens of SmolLM2-135M): transformers' ``DynamicLayer.update``
    concatenates what it is given onto an empty tensor. The copy is what lets ``seq`` (often a
    :func:`~.kv_sequence.pooled_sequence` whose blocks the next one-request call reuses) go back to its pool as
    soon as the caller drops it; views would pin those blocks for as long as the context lives."""
    from transformers import DynamicCache

    k, v = seq.own_kv()  # [layers, kv_heads, tokens, head_dim]: a view when the blocks are one run
    return DynamicCache(ddp_cache_data=[(k[i][None], v[i][None]) for i in range(k.shape[0])])


def runs_on_runner(*tensors: torch.Tensor | None) -> bool:
    """Whether a one-request forward may take the runner: no gradient is wanted (inference mode, or grad
    off and no input requiring it) and no attention capture is open on this thread (explain's hooks are
    on transformers' modules)."""
    from ..model.attention import capturing

    if capturing():
        return False
    if torch.is_inference_mode_enabled():
        return True
    return not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in tensors)


PREFILL_CHUNK = 512  # tokens per runner forward of a one-request prefill (bounds the mask: [chunk, keys])


@torch.inference_mode()
def prefill(lm: LoadedModel, seq: SequenceKV, embeds: torch.Tensor, positions: torch.Tensor,
            mask: torch.Tensor | None = None) -> torch.Tensor:
    """Compute ``embeds`` after ``seq`` 's tokens with the runner, in chunks of :data:`PREFILL_CHUNK`; returns
    the ``[vocab]`` float32 logits after the last one.

    Args:
        embeds: ``[n, hidden]``; positions: ``[n]`` int64.
        mask: additive ``[n, seq.num_tokens + n]`` (the KVLink mask), or None for causal continuation.
    """
    from .ragged import RaggedBatch, mask_rows
    from .model_runner import forward_ragged

    n = int(embeds.shape[0])
    logits = None
    for a in range(0, n, PREFILL_CHUNK):
        b = min(n, a + PREFILL_CHUNK)
        batch = RaggedBatch()
        batch.add(seq, b - a, mask_rows(mask, a, b))
        logits = forward_ragged(lm, batch, embeds[a:b], positions[a:b])[0]
    return logits
