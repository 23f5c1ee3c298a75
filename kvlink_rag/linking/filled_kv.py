"""A linked context's cached KV written straight from a source that can fill the consumer's buffers
(:attr:`kvlink_rag.types.LayeredDocuments.fill`: the store read on this thread, documents in memory): into the
runner's sequence (:func:`filled_sequence`) or into one fresh pair of tensors per layer (:func:`filled_layers`),
the documents' keys rotated on the way (:mod:`.rope_rows`)."""

from __future__ import annotations

import torch

from ..model.loader import LoadedModel
from ..runtime.kv_sequence import SequenceKV, pooled_sequence
from ..types import LayeredDocuments
from .context import PrefixKV
from .rope_rows import block_writers


def filled_sequence(lm: LoadedModel, docs: LayeredDocuments, cos: torch.Tensor, sin: torch.Tensor,
                    prefix: PrefixKV | None, room: int) -> SequenceKV | None:
    """The runner's sequence for a linked context, holding the prefix and every document's keys rotated on their
    way from the store or the memory tier straight into its blocks (one pass, no per-layer buffers), with
    ``room`` tokens after them (link and question tokens, the answer); None where its blocks are not one run
    (the caller rotates layer by layer instead). ``docs`` must have a ``fill``; ``cos``/``sin``: ``[doc tokens,
    head_dim]`` at the documents' positions."""
    p_len, n = (prefix.num_tokens if prefix is not None else 0), sum(docs.num_tokens)
    seq = pooled_sequence(lm, p_len + n + room)
    runs = seq.own_runs(0, p_len + n)
    if len(runs) != 1:
        seq.release()
        return None
    run_k, run_v = runs[0]  # [layers, kv_heads, P + n, head_dim] views of its blocks
    write_layers(lm, docs, cos, sin, prefix, lambda i: (run_k[i], run_v[i]))
    seq.commit(p_len + n)
    return seq


def filled_layers(lm: LoadedModel, docs: LayeredDocuments, cos: torch.Tensor, sin: torch.Tensor,
                  prefix: PrefixKV | None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """:func:`~.linker.rotate_documents` from a source that writes into the consumer's buffers: each layer is one
    fresh ``[kv_heads, P + doc_tokens, head_dim]`` pair in the compute dtype, the prefix copied in and every document's
    keys rotated on their way from the store (:func:`~kvlink_rag.linking.rope_rows.block_writers`: one pass)."""
    tokens = (prefix.num_tokens if prefix is not None else 0) + sum(docs.num_tokens)
    keys, values = [], []

    def fresh(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        keys.append(torch.empty(int(lm.config.num_key_value_heads), tokens, lm.head_dim, dtype=lm.dtype))
        values.append(torch.empty_like(keys[-1]))
        return keys[-1], values[-1]

    write_layers(lm, docs, cos, sin, prefix, fresh)
    return keys, values


def write_layers(lm: LoadedModel, docs: LayeredDocuments, cos: torch.Tensor, sin: torch.Tensor,
                 prefix: PrefixKV | None, dest) -> None:
    """Layer by layer into ``dest(i)``'s ``(k, v)`` ``[kv_heads, P + doc_tokens, head_dim]``: the prefix copied in,
    then every document written by ``docs.fill``, its keys rotated on the way at the rows of ``cos``/``sin``
    (:func:`~kvlink_rag.linking.rope_rows.block_writers`: one pass over the stored bytes)."""
    keys, values = block_writers(cos, sin)
    p_len = prefix.num_tokens if prefix is not None else 0
    for i in range(lm.num_layers):
        k, v = dest(i)
        if prefix is not None:
            k[:, :p_len], v[:, :p_len] = prefix.keys[i], prefix.values[i]
        docs.fill(i, k[:, p_len:], v[:, p_len:], keys, values)
